"""Verifiable tasks: a seeded stream of training prompts, a fixed held-out set, and a reward.

Built-in tasks are generated deterministically from a seed with a difficulty knob (`digits`):

- `addition`: operands and sum written least-significant digit first, zero-padded
  (123+456 -> prompt `321+654=`, answer `9750`). A reversed answer makes carries learnable
  left to right (docs/design.md); reversing the operands too puts each answer digit at a fixed
  offset from the operand digits it needs. Deviation from the docs/design.md prototype (operands
  in normal order): reversed operands shorten the warm-start SFT plateau severalfold, which
  keeps `rlbatch model build` short (docs/study.md, section 1).
- `reverse`: `rev:12345=` -> `54321`; structurally different (copying with reordering,
  no arithmetic), so findings are not tied to one task.
- `runsum`: a reasoning-like task with step-by-step answers of variable length (`RunSumTask`):
  sum a labelled list of k numbers, writing every running total; k is drawn from a wide,
  skewed distribution, so responses run from 10 to 135 tokens with a long tail. The reward
  looks at the final answer only (the last total), as reasoning tasks' rewards do.

Rewards are pure Python (no torch): `reward(prompt, completion, example) -> float | None`,
where None means unscorable (counted by the trainer, never silently 0). The training stream
and the held-out set are drawn from disjoint seeds; held-out examples are also removed from
the training stream so evaluation measures generalization. Where a task's prompts fall into
length classes of very different sizes (`runsum`: a 1-item list has 9 possible prompts), the
rule "exclude only when there is room" is applied per class (`length_class`, `class_space`):
a class with too few distinct prompts to hold any out is shared by both sets (see RunSumTask).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Protocol

EVAL_SEED_OFFSET = 1_000_003


@dataclass(frozen=True)
class Example:
    prompt: str
    answer: str
    meta: dict = field(default_factory=dict, compare=False, hash=False)


RewardFn = Callable[[str, str, Example], "float | None"]


class Task(Protocol):
    name: str

    def train_stream(self, seed: int) -> Iterator[Example]: ...

    def eval_set(self, n: int) -> list[Example]: ...

    def reward(self, prompt: str, completion: str, example: Example) -> float | None: ...


def exact_match(prompt: str, completion: str, example: Example) -> float:
    """1.0 when the completion (whitespace stripped) equals the answer, else 0.0."""
    return 1.0 if completion.strip() == example.answer.strip() else 0.0


class _GeneratedTask:
    """Shared stream/eval logic for tasks generated from a seed."""

    name = "generated"
    alphabet = "0123456789"

    def __init__(self, digits: int = 3, eval_seed: int = EVAL_SEED_OFFSET):
        self.digits = digits
        self.eval_seed = eval_seed
        self._eval_cache: dict[int, list[Example]] = {}

    def make(self, rng: random.Random) -> Example:
        raise NotImplementedError

    def eval_set(self, n: int) -> list[Example]:
        """n held-out examples drawn from the eval seed, distinct prompts within each length
        class until that class's prompts are exhausted."""
        if n not in self._eval_cache:
            rng = random.Random(self.eval_seed)
            seen: dict[int, set[str]] = {}
            out: list[Example] = []
            while len(out) < n:
                ex = self.make(rng)
                c = self.length_class(ex)
                in_class = seen.setdefault(c, set())
                if ex.prompt not in in_class or len(in_class) >= self.class_space(c):
                    in_class.add(ex.prompt)
                    out.append(ex)
            self._eval_cache[n] = out
        return self._eval_cache[n]

    def space_size(self) -> int:
        raise NotImplementedError

    def length_class(self, example: Example) -> int:
        """Class of prompts the held-out rules are applied to; one class unless overridden."""
        return 0

    def class_space(self, c: int) -> int:
        """Distinct prompts in class `c`."""
        return self.space_size()

    def held_out_prompts(self, n: int = 1024) -> set[str]:
        """Prompts of eval_set(n) that the training stream skips: those of every length class
        whose space is large enough that it still has room (> 4x its held-out count)."""
        held = self.eval_set(n)
        counts: dict[int, set[str]] = {}
        for e in held:
            counts.setdefault(self.length_class(e), set()).add(e.prompt)
        return {p for c, ps in counts.items() if self.class_space(c) > 4 * len(ps) for p in ps}

    def train_stream(self, seed: int, exclude_eval: int = 1024) -> Iterator[Example]:
        exclude = self.held_out_prompts(exclude_eval)
        rng = random.Random(seed)
        while True:
            ex = self.make(rng)
            if ex.prompt not in exclude:
                yield ex

    def reward(self, prompt: str, completion: str, example: Example) -> float | None:
        return exact_match(prompt, completion, example)

    def vocabulary(self) -> str:
        """Every character that appears in prompts and answers (for the tiny tokenizer)."""
        return self.alphabet


class AdditionTask(_GeneratedTask):
    name = "addition"
    alphabet = "0123456789+="

    def make(self, rng: random.Random) -> Example:
        hi = 10**self.digits - 1
        a, b = rng.randint(0, hi), rng.randint(0, hi)
        d = self.digits
        s = str(a + b).zfill(d + 1)[::-1]
        return Example(prompt=f"{str(a).zfill(d)[::-1]}+{str(b).zfill(d)[::-1]}=", answer=s,
                       meta={"a": a, "b": b})

    def space_size(self) -> int:
        return 10 ** (2 * self.digits)


class ReverseTask(_GeneratedTask):
    name = "reverse"
    alphabet = "0123456789rev:="

    def make(self, rng: random.Random) -> Example:
        s = "".join(rng.choice("0123456789") for _ in range(self.digits))
        return Example(prompt=f"rev:{s}=", answer=s[::-1])

    def space_size(self) -> int:
        return 10**self.digits


LABELS = "abcdefghijklmnopqrstuvwxyz"


class RunSumTask(_GeneratedTask):
    """Running sum of a labelled list, one step per item; reward on the final answer only.

    A list of k numbers of `digits` digits (1 .. 10^digits - 1) is labelled a, b, c, ...; the
    answer works through it one step per item, writing the item's label, the item and the
    running total, then `=` and the final total. Numbers are written least significant digit
    first (as in `addition`) and totals zero-padded to the width of the largest possible sum,
    w = len(str(max_items * (10^digits - 1))) (3 for one digit). Items 3, 5, 2, 7 (totals 3,
    8, 10, 17):

        prompt `a3b5c2d7=`        answer `a3300b5800c2010d7710=710`

    Design: every step has the same width (1 + digits + w), so the previous total sits at a
    fixed offset; the item is found by content, copying what follows its label in the prompt
    (an induction-head pattern), and is echoed before the total so that the copy and the
    addition are separate tokens (without the echo the tiny model's SFT did not form the
    skill: docs/study.md, section 1). After the last item the prompt's next token is `=`,
    which also tells the model where to stop.

    k = min_items + floor(E), E ~ Exponential(mean `mean_extra_items`), drawn again while
    k > max_items (26, one label per letter): median 5, p90 14, a tail to 26 with the
    defaults. A response is k (1 + digits + w) + 1 + w characters plus EOS: 10 to 135 tokens
    at digits = 1; on 4,096 training draws mean 37.0, p50 30, p90 75 (2.5x the median),
    max 135 (the tests check this shape).

    Reward: 1.0 when what follows the completion's last `=` equals the final total, else 0.0;
    the steps are not checked (as reasoning tasks reward only the final answer). A
    completion without `=` scores 0.0 (scorable, just wrong). Every generated example is
    checked by `validate`.

    Held-out split (see the module docstring): the held-out set holds distinct prompts within
    each list length k until that length's prompts run out, and the training stream skips the
    held-out prompts of every length whose prompt space exceeds 4x its held-out count. At
    digits = 1 the lengths k = 1 (9 prompts) and k = 2 (81) are shared with training (232 of
    the 1,024 held-out prompts; such short lists can be memorized either way); every longer
    held-out list is excluded from training.
    """

    name = "runsum"
    alphabet = "0123456789=" + LABELS

    def __init__(self, digits: int = 1, eval_seed: int = EVAL_SEED_OFFSET, *,
                 min_items: int = 1, mean_extra_items: float = 6.0,
                 max_items: int = len(LABELS)):
        super().__init__(digits, eval_seed)
        if not 1 <= min_items <= max_items <= len(LABELS):
            raise ValueError(f"runsum needs 1 <= min_items <= max_items <= {len(LABELS)}, got "
                             f"{min_items}, {max_items}")
        if mean_extra_items <= 0:
            raise ValueError(f"runsum mean_extra_items must be positive, got {mean_extra_items}")
        self.min_items, self.mean_extra, self.max_items = min_items, mean_extra_items, max_items
        self.width = len(str(max_items * (10**digits - 1)))  # digits of the largest total

    def items_count(self, rng: random.Random) -> int:
        while True:
            k = self.min_items + int(rng.expovariate(1.0 / self.mean_extra))
            if k <= self.max_items:
                return k

    def make(self, rng: random.Random) -> Example:
        k = self.items_count(rng)
        items = [rng.randint(1, 10**self.digits - 1) for _ in range(k)]
        ex = self.from_items(items)
        self.validate(ex)
        return ex

    def from_items(self, items: list[int]) -> Example:
        d, w = self.digits, self.width
        prompt = "".join(f"{LABELS[i]}{str(x).zfill(d)[::-1]}" for i, x in enumerate(items))
        totals, run = [], 0
        for x in items:
            run += x
            totals.append(run)
        steps = "".join(f"{LABELS[i]}{str(x).zfill(d)[::-1]}{str(t).zfill(w)[::-1]}"
                        for i, (x, t) in enumerate(zip(items, totals)))
        final = str(run).zfill(w)[::-1]
        return Example(prompt=prompt + "=", answer=f"{steps}={final}",
                       meta={"items": items, "total": run})

    def validate(self, ex: Example) -> None:
        """Raise ValueError unless `ex` is a well-formed example: the prompt parses into
        labelled items a, b, c, ... in range, the answer is their running totals in this
        task's format, and the answer earns the full reward."""
        d = self.digits
        body = ex.prompt[:-1]
        if not ex.prompt.endswith("=") or len(body) % (1 + d):
            raise ValueError(f"runsum: malformed prompt {ex.prompt!r}")
        chunks = [body[i:i + 1 + d] for i in range(0, len(body), 1 + d)]
        if not self.min_items <= len(chunks) <= self.max_items:
            raise ValueError(f"runsum: {len(chunks)} items in {ex.prompt!r}")
        if any(c[0] != LABELS[i] or not c[1:].isdigit() for i, c in enumerate(chunks)):
            raise ValueError(f"runsum: bad labels or digits in {ex.prompt!r}")
        items = [int(c[1:][::-1]) for c in chunks]
        if not all(1 <= x < 10**d for x in items):
            raise ValueError(f"runsum: item out of range in {ex.prompt!r}")
        expected = self.from_items(items)
        if ex.answer != expected.answer or ex.meta.get("total", sum(items)) != sum(items):
            raise ValueError(f"runsum: answer {ex.answer!r} is not the running sum of "
                             f"{ex.prompt!r} ({expected.answer!r})")
        if self.reward(ex.prompt, ex.answer, ex) != 1.0:
            raise ValueError(f"runsum: the answer of {ex.prompt!r} does not earn the reward")

    @staticmethod
    def final_answer(completion: str) -> str | None:
        """What follows the completion's last `=` (stripped), or None without one."""
        if "=" not in completion:
            return None
        return completion.rsplit("=", 1)[1].strip()

    def reward(self, prompt: str, completion: str, example: Example) -> float | None:
        """Final answer only: 1.0 when the completion's last total equals the answer's."""
        return 1.0 if self.final_answer(completion) == self.final_answer(example.answer) else 0.0

    def length_class(self, example: Example) -> int:
        return (len(example.prompt) - 1) // (1 + self.digits)  # k, the number of items

    def class_space(self, c: int) -> int:
        return (10**self.digits - 1) ** c

    def space_size(self) -> int:
        return sum(self.class_space(k) for k in range(self.min_items, self.max_items + 1))

    def max_answer_chars(self) -> int:
        return self.max_items * (1 + self.digits + self.width) + 1 + self.width


BUILTIN_TASKS = {"addition": AdditionTask, "reverse": ReverseTask, "runsum": RunSumTask}


def answer_tokens(task_name: str, digits: int) -> int:
    """Characters in a built-in task's answer (without EOS): the longest one for `runsum`."""
    if task_name == "runsum":
        return RunSumTask(digits).max_answer_chars()
    return digits + 1 if task_name == "addition" else digits


def take(stream: Iterator[Example], n: int) -> list[Example]:
    return [next(stream) for _ in range(n)]
