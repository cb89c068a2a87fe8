"""Prompts that do not fit the model's context, found before any training starts.

Rule: a prompt (encoded as the trainer encodes it: chat template or plain text with the
tokenizer's special tokens, `models.encode_prompt`) plus `rollout.max_new_tokens` must fit in
the model's positions (`max_position_embeddings` of its `config.json`, or `n_positions`,
`max_sequence_length`, `seq_length`, `n_ctx`). A dataset row that does not fit is rejected,
never truncated: a cut prompt asks a different question than its reference answer scores.
The error is one line naming the first such row as `file:line` (in file order: the training
file, then `task.eval_path`), its length and the budget, and how many more rows are too long.

Only dataset tasks are checked (their rows are all known up front); the built-in tasks
generate short prompts for models built to fit them. A model whose config names no context
length is not checked.

Cost: prompts are deduplicated and tokenized in one batch (plain text) or one by one (chat
template). A prompt longer than `cap_chars` characters is counted on its first `cap_chars`
only, so a 10 MB row costs as much as a short one: it is reported as "at least N tokens",
which is already past the budget (a token would have to span more than `CHARS_PER_TOKEN`
characters on average for the cut prompt to fit).
"""

from __future__ import annotations

import json
from pathlib import Path

from rlbatch.core.errors import ConfigError, DataError
from rlbatch.rollout.models import encode_prompt
from rlbatch.rollout.tasks import Example

CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length",
                "seq_length", "n_ctx")
CHARS_PER_TOKEN = 32  # a prompt is cut to (budget x this) characters before it is counted
_LISTED = 10


def context_length(model_path: str | Path) -> tuple[int, str] | None:
    """(positions, the config key that gave them) from `config.json` (or its `text_config`),
    or None when it names none or cannot be read (the model loader reports that)."""
    try:
        cfg = json.loads((Path(model_path) / "config.json").read_bytes())
    except (OSError, ValueError):
        return None
    if not isinstance(cfg, dict):
        return None
    for part in (cfg, cfg.get("text_config")):
        for key in CONTEXT_KEYS if isinstance(part, dict) else ():
            value = part.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value, key
    return None


def _cut(example: Example, cap: int) -> Example:
    """`example` with its prompt and message texts cut to `cap` characters."""
    messages = example.meta.get("messages")
    if messages:
        messages = [{**m, "content": m["content"][:cap]} for m in messages]
    return Example(prompt=example.prompt[:cap], answer=example.answer,
                   meta={**example.meta, "messages": messages})


def token_counts(tokenizer, examples: list[Example], cap: int) -> list[tuple[int, bool]]:
    """(prompt tokens, whether the prompt was cut to `cap` characters first) per example."""
    keys = [e.prompt + "\x00" + repr(e.meta.get("messages")) for e in examples]
    unique = {k: e for k, e in zip(keys, examples)}
    cut = {k: any(len(t) > cap for t in [e.prompt] + [m["content"] for m in
                                                       e.meta.get("messages") or []])
           for k, e in unique.items()}
    shown = {k: _cut(e, cap) if cut[k] else e for k, e in unique.items()}
    if getattr(tokenizer, "chat_template", None):
        lengths = {k: len(encode_prompt(tokenizer, e)) for k, e in shown.items()}
    else:  # one batch call: the same ids as encode_prompt's, much faster
        ids = tokenizer([e.prompt for e in shown.values()])["input_ids"] if shown else []
        lengths = {k: len(i) for k, i in zip(shown, ids)}
    return [(lengths[k], cut[k]) for k in keys]


def _order(source: str, files: list[str]) -> tuple[int, int]:
    path, _, rest = source.rpartition(":")
    return files.index(path) if path in files else len(files), int(rest.split()[-1])


def check_prompt_lengths(task, model_path: str | Path, max_new_tokens: int,
                         tokenizer=None) -> None:
    """A DataError naming the first row of a dataset task whose prompt plus
    `max_new_tokens` does not fit the model at `model_path` (see the module docstring);
    a ConfigError when `max_new_tokens` alone leaves no room. Built-in tasks pass."""
    from rlbatch.rollout.datasets import DatasetTask

    found = context_length(model_path) if isinstance(task, DatasetTask) else None
    if found is None:
        return
    positions, key = found
    budget = positions - max_new_tokens
    where = f"{key} {positions} in {Path(model_path) / 'config.json'}"
    if budget < 1:
        raise ConfigError(f"rollout.max_new_tokens = {max_new_tokens} leaves no room for a "
                          f"prompt in the model's {positions} positions ({where})")
    if tokenizer is None:
        from transformers import AutoTokenizer

        try:
            tokenizer = AutoTokenizer.from_pretrained(str(model_path), local_files_only=True)
        except Exception:  # noqa: BLE001  (the model loader reports a broken tokenizer)
            return
    examples = task.train + task.held_out
    counts = token_counts(tokenizer, examples, budget * CHARS_PER_TOKEN)
    files = list(dict.fromkeys(e.meta["source"].rpartition(":")[0] for e in examples))
    bad = sorted(((_order(e.meta["source"], files), e.meta["source"], n, cut, len(e.prompt))
                  for e, (n, cut) in zip(examples, counts) if n > budget))
    if not bad:
        return
    _, source, n, cut, chars = bad[0]
    if cut:
        msg = (f"prompt is {chars:,} characters, at least {n:,} tokens (counted on its first "
               f"{budget * CHARS_PER_TOKEN:,}); with rollout.max_new_tokens {max_new_tokens} "
               f"at most {budget} fit in the model's {positions} positions")
    else:
        msg = (f"prompt is {n:,} tokens + rollout.max_new_tokens {max_new_tokens} = "
               f"{n + max_new_tokens:,} positions, more than the model's {positions}")
    msg += f" ({where})"
    rest = [s if s.rpartition(":")[0] != files[0] else s.rpartition(":")[2]
            for _, s, _, _, _ in bad[1:]]
    if rest:
        more = ", ..." if len(rest) > _LISTED else ""
        unit = "lines " if all(r.isdigit() for r in rest) else ""
        msg += f"; {len(rest)} more row(s) too long ({unit}{', '.join(rest[:_LISTED])}{more})"
    raise DataError(msg + "; shorten or drop those rows, or lower rollout.max_new_tokens",
                    where=source)
