"""Verifiable rewards for dataset tasks: exact, numeric, GSM8K `####`, LaTeX `\\boxed{}`, custom.

Every reward has the Task signature `(prompt, completion, example) -> float | None` and is
pure Python (no torch). `make_reward(spec, tolerance)` turns `task.reward` into one of them:
`exact` (equal after stripping whitespace), `numeric` (the completion's last number within a
relative/absolute tolerance), `gsm8k` (the number after the last `####`), `boxed` (the last
`\\boxed{}`, compared numerically or as normalized LaTeX), or a user `module:function`,
which runs under `reward:`'s policy (`rollout/reward_runner.py`). None means unscorable (the
ground truth or the completion could not be parsed), never a silent 0. Deviation: extraction
is simpler than math-verify/sympy equivalence. What each reward accepts and when it returns
None: docs/design.md, "Module notes".
"""

from __future__ import annotations

import importlib
import inspect
import math
import numbers
import re
from collections.abc import Callable

from rlbatch.core.errors import ConfigError
from rlbatch.rollout.tasks import Example, RewardFn, exact_match

BUILTIN_REWARDS = ("exact", "numeric", "gsm8k", "boxed")
NumberReader = Callable[[str], float | None]  # a number read from a text, None when none is

# A sign counts only when it does not follow a word or closing bracket (`5-3` is 5 and 3).
_SIGN = r"(?:(?<![\w)}\]])[-+])?"
_NUM = rf"{_SIGN}(?:(?:\d{{1,3}}(?:,\d{{3}})+|\d+)(?:\.\d+)?|\.\d+)(?:[eE][-+]?\d+)?"
# A fraction (`-3/4`, `\frac{3}{4}`) or a plain number; fractions first so `3/4` is one token.
_NUMBER_RE = re.compile(
    rf"[-+]?\\[dt]?frac\{{\s*(?:{_NUM})\s*\}}\{{\s*(?:{_NUM})\s*\}}"
    rf"|(?<![\d./])(?:{_NUM})\s*/\s*(?:{_NUM})(?![\d/]|\.\d)"
    rf"|(?:{_NUM})"
)
_FRAC_RE = re.compile(rf"^([-+]?)\\[dt]?frac\{{\s*({_NUM})\s*\}}\{{\s*({_NUM})\s*\}}$")
_SLASH_RE = re.compile(rf"^({_NUM})\s*/\s*({_NUM})$")
_PLAIN_RE = re.compile(rf"^(?:{_NUM})$")
_MINUS = str.maketrans({"\u2212": "-", "\u2013": "-"})


# ---------------------------------------------------------------- parsing helpers (pure)

def _plain(s: str) -> float:
    return float(s.replace(",", ""))


def parse_number(text: str) -> float | None:
    """The value of `text` when all of it is one number, else None.

    Accepts signs, thousands commas, decimals, exponents, `a/b`, `\\frac{a}{b}` and surrounding
    `$`, whitespace, a trailing period or `%`. Non-finite values are rejected.
    """
    s = text.translate(_MINUS).replace("\\$", "$").replace("\\%", "%").strip()
    s = s.strip("$").strip().rstrip(".").rstrip("%").strip()
    value: float | None = None
    if _PLAIN_RE.match(s):
        value = _plain(s)
    elif m := _SLASH_RE.match(s):
        den = _plain(m.group(2))
        value = _plain(m.group(1)) / den if den else None
    elif m := _FRAC_RE.match(s):
        den = _plain(m.group(3))
        value = (-1 if m.group(1) == "-" else 1) * _plain(m.group(2)) / den if den else None
    if value is None or not math.isfinite(value):
        return None
    return value


def last_number(text: str) -> float | None:
    """The value of the last number token in `text` (None when there is none)."""
    for token in reversed(_NUMBER_RE.findall(text.translate(_MINUS))):
        value = parse_number(token)
        if value is not None:
            return value
    return None


def numbers_match(a: float, b: float, tolerance: float) -> bool:
    """`abs(a - b) <= tolerance * max(1, abs(b))`; b is the ground truth."""
    return abs(a - b) <= tolerance * max(1.0, abs(b))


def last_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` / `\\fbox{...}` with balanced braces, else None."""
    starts = [m.end() for m in re.finditer(r"\\(?:boxed|fbox)\s*\{", text)]
    for start in reversed(starts):
        depth = 1
        for i in range(start, len(text)):
            if text[i] == "{":
                depth += 1
            elif text[i] == "}":
                depth -= 1
                if depth == 0:
                    return text[start:i]
    return None


def gsm8k_answer(text: str) -> float | None:
    """The first number after the last `####` (commas and `$` dropped), else None."""
    if "####" not in text:
        return None
    tail = text.rsplit("####", 1)[1].replace("$", "").strip()
    match = _NUMBER_RE.search(tail.splitlines()[0] if tail else "")
    return parse_number(match.group(0)) if match else None


def normalize_latex(text: str) -> str:
    """Light normalization for string comparison of boxed answers."""
    s = text.strip().strip("$")
    for old, new in (("\\left", ""), ("\\right", ""), ("\\dfrac", "\\frac"),
                     ("\\tfrac", "\\frac"), ("\\!", ""), ("\\,", ""), ("\\;", ""),
                     ("\\ ", ""), ("^\\circ", ""), ("^{\\circ}", "")):
        s = s.replace(old, new)
    s = re.sub(r"\\text\{([^{}]*)\}", r"\1", s)
    s = re.sub(r"\s+", "", s).rstrip(".")
    return s


# ---------------------------------------------------------------- rewards

exact = exact_match  # 1.0 when equal after stripping whitespace (the built-in tasks' reward)


def _number_reward(name: str, tolerance: float, read_answer: tuple[NumberReader, ...],
                   read_completion: NumberReader) -> RewardFn:
    """A reward comparing two numbers within `tolerance` (`numbers_match`): the answer's, by
    the first of `read_answer` that finds one, and the completion's; None when either side
    has none."""

    def reward(prompt: str, completion: str, example: Example) -> float | None:
        truth = None
        for read in read_answer:
            truth = read(example.answer)
            if truth is not None:
                break
        got = read_completion(completion)
        if truth is None or got is None:
            return None
        return 1.0 if numbers_match(got, truth, tolerance) else 0.0

    reward.__name__ = name
    return reward


def numeric(tolerance: float) -> RewardFn:
    """Last number in the completion vs the answer parsed as a number (see module doc)."""
    return _number_reward("numeric", tolerance, (parse_number, gsm8k_answer), last_number)


def gsm8k(tolerance: float) -> RewardFn:
    """The number after the completion's last `####` vs the answer's (or the bare answer)."""
    return _number_reward("gsm8k", tolerance, (gsm8k_answer, parse_number), gsm8k_answer)


def boxed(tolerance: float) -> RewardFn:
    """The completion's last `\\boxed{}` vs the answer: numerically when both parse, else as text."""

    def reward(prompt: str, completion: str, example: Example) -> float | None:
        truth = last_boxed(example.answer)
        truth = example.answer if truth is None else truth
        got = last_boxed(completion)
        if got is None or not truth.strip():
            return None
        a, b = parse_number(got), parse_number(truth)
        if a is not None and b is not None:
            return 1.0 if numbers_match(a, b, tolerance) else 0.0
        return 1.0 if normalize_latex(got) == normalize_latex(truth) else 0.0

    reward.__name__ = "boxed"
    return reward


# ---------------------------------------------------------------- resolution

IMPORT_HINT = ("modules are found on the Python import path: the working directory when "
               "run as `python -m` or as a profile's trial, installed packages, and the "
               "folders in PYTHONPATH")


def import_reward(spec: str) -> RewardFn:
    """Import `module:function` and check it takes (prompt, completion, example); a
    ConfigError naming `task.reward` and the function when that fails. Running the module's
    top level may raise anything: that too is one line, not a traceback."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ConfigError(f"task.reward: '{spec}' is not of the form module:function")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"task.reward: cannot import module '{module_name}' ({exc}); "
                          f"{IMPORT_HINT}") from None
    # the module's own top-level code may raise anything: one line, not a traceback
    except Exception as exc:  # noqa: BLE001
        raise ConfigError(f"task.reward: importing '{module_name}' raised "
                          f"{type(exc).__name__}: {exc}") from None
    fn = getattr(module, attr, None)
    if fn is None or not callable(fn):
        raise ConfigError(f"task.reward: module '{module_name}' has no function '{attr}'")
    try:
        inspect.signature(fn).bind("prompt", "completion", Example("prompt", "answer"))
    except TypeError as exc:
        raise ConfigError(f"task.reward: {spec} must take (prompt, completion, example) "
                          f"({exc})") from None
    except ValueError:  # no signature to inspect (a builtin): the first call will tell
        pass

    def reward(prompt: str, completion: str, example: Example) -> float | None:
        value = fn(prompt, completion, example)
        if value is None:
            return None
        if not isinstance(value, numbers.Real):
            raise ConfigError(f"returned {type(value).__name__}; expected a number, a bool "
                              "or None")
        return float(value)

    reward.__name__ = attr
    reward.cheap = bool(getattr(fn, "cheap", False))  # declared cheap: called in-process
    return reward


def make_reward(spec: str, tolerance: float = 1e-6) -> RewardFn:
    """Resolve `task.reward` (exact | numeric | gsm8k | boxed | module:function)."""
    if spec == "exact":
        return exact
    if spec == "numeric":
        return numeric(tolerance)
    if spec == "gsm8k":
        return gsm8k(tolerance)
    if spec == "boxed":
        return boxed(tolerance)
    if ":" in spec:
        return import_reward(spec)
    raise ConfigError(f"task.reward: unknown reward '{spec}'; use one of "
                      f"{', '.join(BUILTIN_REWARDS)} or module:function")


def reference_completion(spec: str, answer: str) -> str:
    """A completion that states `answer` the way reward `spec` expects (a self-check of data)."""
    if spec == "gsm8k" and "####" not in answer:
        return f"#### {answer}"
    if spec == "boxed" and last_boxed(answer) is None:
        return f"\\boxed{{{answer}}}"
    return answer
