"""Write a converted framework log as an rlbatch run directory (docs/design.md "The run log").

The run is assembled in a temporary sibling directory and renamed into place in one step, so
an error at any point leaves nothing half-written; `--force` replaces an existing run the
same way (old directory moved aside, new one renamed in, old one deleted).

Deviation from `core.runlog.RunWriter`: an ingested row carries only what the framework
measured, so required step keys the framework cannot measure (e.g. phase timers from
TensorBoard logs) are left out instead of being invented ("a key a trainer cannot measure
is left out", docs/metrics.md). config.yaml holds only what identifies the configuration
(no source path), so seeds of one configuration group together in `rlbatch analyze`; the
source files and their hashes go to manifest.json.

Values: a logged value no float can hold (NaN, inf, an integer beyond 1.8e308) is written as
null ("measured, not finite"; `finite_values`, which the converters also apply to each record
before any arithmetic), and the counters `step`, `samples`, `prompts`, `tokens` must lie in
0..2^53 (`MAX_STEP`, exact as floats, as analysis reads them): a corrupt log is then one line
naming the file, not a traceback or an absurd run (found by tests/test_fuzz.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
from array import array
from bisect import bisect_left
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from rlbatch.core.errors import DataError, UserError
from rlbatch.core.runlog import EVAL_REQUIRED, build_manifest, dumps_strict, stable_hash

COUNTERS = ("step", "samples", "prompts", "tokens", "train_s")
# the largest step a converter accepts: counters stay exact as floats, which analysis reads
MAX_STEP = 2 ** 53


def is_step(value) -> bool:
    """A usable logged step: an integer (not a bool) in 0..MAX_STEP."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_STEP


def token_count(mean_len: float, samples: int, key: str, step: int, where: str) -> int:
    """`mean_len` x `samples`, rounded: the tokens of a step from its logged mean response
    length. A negative length, or one whose token count is not finite (a corrupt `1e308`),
    is a DataError naming the key and the step rather than an absurd or infinite count."""
    total = mean_len * samples
    if mean_len < 0 or not _fits(total):
        raise DataError(f"step {step}: {key} = {mean_len!r} is not a mean response length",
                        where=where)
    return round(total)


class RowSpool:
    """Run-log rows kept in a temporary file, not in memory, so that a converter's memory
    stays flat in the log's size: `append` (rows in step order, cleaned by `finite_values`),
    `rewind(step)` (drop the rows from `step` on: a framework restarted from a checkpoint),
    iteration (the rows read back), `last`, `len`. Only an offset and a step per row stay in
    memory."""

    def __init__(self) -> None:
        # open for the spool's life (deleted on close or exit), not one block's
        self._fh = tempfile.TemporaryFile("w+b")  # noqa: SIM115
        self._offsets = array("q")
        self._steps = array("q")
        self._end = 0
        self.last: dict | None = None

    def append(self, row: dict) -> None:
        row = finite_values(row)
        data = (dumps_strict(row) + "\n").encode()
        self._fh.seek(self._end)
        self._fh.write(data)
        self._offsets.append(self._end)
        self._steps.append(int(row.get("step", 0)))
        self._end += len(data)
        self.last = row

    def rewind(self, step: int) -> int:
        """Drop the rows of step >= `step`; return how many were dropped."""
        i = bisect_left(self._steps, step)
        dropped = len(self._steps) - i
        if dropped:
            self._end = self._offsets[i]
            del self._offsets[i:], self._steps[i:]
            self._fh.truncate(self._end)
            self.last = self._read(len(self._offsets) - 1) if self._offsets else None
        return dropped

    def _read(self, i: int) -> dict:
        self._fh.seek(self._offsets[i])
        return json.loads(self._fh.readline())

    def lines(self) -> Iterator[bytes]:
        self._fh.seek(0)
        pos = 0
        while pos < self._end:
            line = self._fh.readline()
            pos += len(line)
            yield line

    def __iter__(self) -> Iterator[dict]:
        return (json.loads(line) for line in self.lines())

    def __len__(self) -> int:
        return len(self._offsets)

    def __bool__(self) -> bool:
        return bool(self._offsets)

    def rewrite(self, fn) -> None:
        """Every row through `fn` (a new spool file; memory stays flat)."""
        old, offsets = self._fh, self._offsets
        self.__init__()
        for off in offsets:
            old.seek(off)
            self.append(fn(json.loads(old.readline())))
        old.close()


Rows = list | RowSpool


def _last(rows: Rows) -> dict | None:
    if isinstance(rows, RowSpool):
        return rows.last
    return finite_values(rows[-1]) if rows else None


@dataclass
class Converted:
    """A framework log in run-log form, ready to write (rows as a list, or a `RowSpool`)."""

    framework: str
    sources: list
    steps: Rows
    evals: Rows
    config: dict
    seed: int | None = None
    warnings: list = field(default_factory=list)
    truncated: bool = False
    summary_extra: dict = field(default_factory=dict)


def _fits(v) -> bool:
    """A finite value a float can hold (an int beyond 1.8e308 cannot: analysis reads floats)."""
    return abs(v) <= sys.float_info.max  # False for NaN and inf; exact for any int


def finite_values(row: dict) -> dict:
    """Non-finite floats, and integers no float can hold, as null ("measured, not finite").
    Converters apply it to each logged record first, so their arithmetic never overflows."""
    return {k: (None if isinstance(v, (int, float)) and not isinstance(v, bool)
                and not _fits(v) else v) for k, v in row.items()}


def _check(conv: Converted) -> None:
    """Counters present, in 0..MAX_STEP and samples non-decreasing; evaluation rows complete."""
    if not conv.steps and not conv.evals:
        raise DataError("no training steps or evaluations found", where=str(conv.sources[0]))
    for row in _chain(conv.steps, conv.evals):
        for key in COUNTERS[:4]:
            v = row.get(key)
            if v is not None and not (isinstance(v, (int, float)) and 0 <= v <= MAX_STEP):
                shown = repr(v) if len(repr(v)) <= 24 else repr(v)[:21] + "..."
                raise DataError(f"step {row.get('step')}: {key} = {shown} is not a count in "
                                f"0..{MAX_STEP}", where=str(conv.sources[0]))
    prev = None
    for row in conv.steps:
        for key in ("step", "samples"):
            if not isinstance(row.get(key), (int, float)):
                raise DataError(f"converted step row lacks '{key}'", where=str(conv.sources[0]))
        if prev is not None and row["samples"] < prev:
            raise DataError(f"samples decrease at step {row['step']}", where=str(conv.sources[0]))
        prev = row["samples"]
    for row in conv.evals:
        missing = [k for k in EVAL_REQUIRED if row.get(k) is None]
        if missing:
            raise DataError(f"evaluation at step {row.get('step')} lacks {missing}",
                            where=str(conv.sources[0]))


def _chain(*groups: Iterable) -> Iterator[dict]:
    for rows in groups:
        yield from rows


def _digest(paths: list) -> dict:
    out = {}
    for p in paths:
        h = hashlib.sha256()
        with open(p, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
        out[str(p)] = h.hexdigest()
    return out


def run_id_for(conv: Converted, digests: dict) -> str:
    """Readable prefix + hash of the configuration, seed and source contents."""
    batch = conv.config.get("batch", {})
    lr = conv.config.get("derived", {}).get("actor_lr")
    prefix = f"{conv.config.get('algorithm', 'run')}-P{batch.get('prompts_per_step', 'na')}" \
             f"xG{batch.get('samples_per_prompt', 'na')}"
    if lr is not None:
        prefix += f"-lr{lr:.3g}"
    seed = "na" if conv.seed is None else conv.seed
    body = [conv.config, conv.seed, sorted(digests.values())]
    return f"{prefix}-s{seed}-{conv.framework}-{stable_hash(body, 8)}"


def build_summary(conv: Converted) -> dict:
    """summary.json of an ingested run: final counters, throughput, last evaluation."""
    last = _last(conv.steps) or {}
    summary = {
        # an ingested log says nothing of why it ended: 'running' when its last line was cut
        # (still being written, or killed), otherwise it ran to its own end
        "status": "running" if conv.truncated else "budget_exhausted",
        **{k: last.get(k) for k in COUNTERS if k in last},
    }
    if "step" in summary:
        summary["steps"] = summary.pop("step")
    train_s, samples = last.get("train_s"), last.get("samples")
    if isinstance(train_s, (int, float)) and train_s > 0 and isinstance(samples, (int, float)):
        summary["throughput"] = samples / train_s
    summary.update(conv.summary_extra)
    summary["last_eval"] = _last(conv.evals)
    summary["ingest"] = {"framework": conv.framework, "step_rows": len(conv.steps),
                         "eval_rows": len(conv.evals), "warnings": list(conv.warnings)}
    return finite_values(summary)


def _jsonl(rows: Rows) -> Iterator[bytes]:
    if isinstance(rows, RowSpool):
        return rows.lines()
    return ((dumps_strict(finite_values(r)) + "\n").encode() for r in rows)


def _write_files(tmp: Path, conv: Converted, manifest: dict, summary: dict) -> None:
    for name, chunks in (
        ("steps.jsonl", _jsonl(conv.steps)),
        ("evals.jsonl", _jsonl(conv.evals)),
        ("config.yaml", [yaml.safe_dump(conv.config, sort_keys=False).encode()]),
        ("manifest.json", [(dumps_strict(manifest, indent=2) + "\n").encode()]),
        ("summary.json", [(dumps_strict(summary, indent=2) + "\n").encode()]),
    ):
        with open(tmp / name, "wb") as fh:
            fh.writelines(chunks)
            fh.flush()
            os.fsync(fh.fileno())


def write_run(out_dir: str | Path, conv: Converted, force: bool = False) -> dict:
    """Write `conv` to `out_dir` atomically; return the summary written."""
    _check(conv)
    out = Path(out_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not force:
        raise UserError("output directory exists and is not empty; pass --force to replace it",
                        where=str(out))
    out.parent.mkdir(parents=True, exist_ok=True)
    digests = _digest(conv.sources)
    run_id = run_id_for(conv, digests)
    manifest = build_manifest(run_id, f"ingest:{conv.framework}", conv.seed, extra={
        "algorithm": conv.config.get("algorithm"),
        "sources": [str(p) for p in conv.sources], "source_sha256": digests,
    })
    summary = build_summary(conv)
    tmp = out.parent / f".{out.name}.ingest-{os.getpid()}"
    old = out.parent / f".{out.name}.replaced-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        _write_files(tmp, conv, manifest, summary)
        if out.exists():
            os.replace(out, old)
        os.replace(tmp, out)
    except OSError as exc:
        if old.exists() and not out.exists():
            os.replace(old, out)
        raise UserError(f"cannot write the run ({exc.strerror or exc})", where=str(out)) from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # gone already when the rename succeeded
    shutil.rmtree(old, ignore_errors=True)
    return {**summary, "run_id": run_id, "run_dir": str(out)}
