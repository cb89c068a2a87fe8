"""Rules over a command's attempts and rows that end or fail a run: a checkpoint that failed
its resumes twice is refused, an attempt's output is capped, non-finite losses and
evaluations, and a target metric that stopped being logged."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from rlbatch.core.runlog import read_json

ROWS_FILE = "rows.json"  # an ended attempt's rows (follow.py, Follower.freeze)
CHECKPOINT_TRIES = 2
# how a refused attempt's failure begins (summary.json `failure`: "command: <this>: ..."): a
# re-run does not resume such a run, so `rlbatch profile` does not advise one
CHECKPOINT_REFUSED = "checkpoint refused"


def bad_checkpoint(earlier: list[dict], resume, attempts_dir: Path) -> str | None:
    """Why the next attempt is refused, or None: the last CHECKPOINT_TRIES attempts were
    each given the checkpoint it would be given (`resume`), and each exited with an error
    status (not a signal) before logging a step after it, so the checkpoint itself is the
    likely fault and another attempt would fail the same way."""
    if resume is None:
        return None
    failed = []
    for info in reversed(earlier):
        if info.get("resume_from") != str(resume.path):
            break
        rows_file = attempts_dir / f"{info['number']:03d}" / ROWS_FILE
        doc = read_json(rows_file) if rows_file.is_file() else {}
        status = doc.get("exit_status")
        if not isinstance(status, int) or not 0 < status < 128 \
                or any(r.get("step", 0) > resume.step for r in doc.get("steps", [])):
            break
        failed.append((info["number"], status))
    if len(failed) < CHECKPOINT_TRIES:
        return None
    numbers = " and ".join(str(n) for n, _ in reversed(failed))
    return (f"attempts {numbers} were each given the checkpoint {resume.path} (step "
            f"{resume.step}) and exited with an error (status "
            f"{', '.join(str(st) for _, st in reversed(failed))}) before logging a step after "
            "it: the checkpoint may be unreadable; remove it so that the next attempt does "
            "not resume from it, or start the run over with --fresh")


OUTPUT_CAP = 64 << 20  # bytes of an attempt's output.log before it is cut back
OUTPUT_HEAD = 1 << 20  # bytes of its start kept when it is


def cap_output(path: Path) -> int:
    """Keep an attempt's output.log under OUTPUT_CAP bytes: past it, the file is cut back to
    its first OUTPUT_HEAD bytes and a line saying how much was cut; the command appends
    after that (its output was opened for appending), so the newest output, which a
    failure's message quotes, is always at the end. Returns the bytes cut."""
    try:
        size = path.stat().st_size
    except OSError:
        return 0
    if size <= OUTPUT_CAP:
        return 0
    with open(path, "r+b") as f:
        size = f.seek(0, os.SEEK_END)  # again: the command may have written since the stat
        f.truncate(OUTPUT_HEAD)
    with open(path, "ab") as f:
        f.write(f"\n[rlbatch: {size - OUTPUT_HEAD:,} bytes of output cut here: output.log "
                f"is kept under {OUTPUT_CAP:,} bytes]\n".encode())
    return size - OUTPUT_HEAD


# step keys whose non-finite value (a converter's null: "measured, not finite") means the
# update diverged (docs/metrics.md)
DIVERGENCE_KEYS = ("actor/loss", "actor/grad_norm", "critic/loss", "critic/grad_norm",
                   "reward/mean")
# evaluations in a row without the target metric, after one that had it (or from the first),
# before the run fails as no longer measured
TARGET_LOST_AFTER = 3


@dataclass(frozen=True)
class NonFinite:
    """Steps whose divergence keys were logged non-finite: `total` of them, the trailing
    `run` of consecutive ones (from step `run_from`, with the `keys` they had), and the first
    such step with its keys."""

    total: int = 0
    run: int = 0
    run_from: int | None = None
    keys: tuple = ()
    first: int | None = None
    first_keys: tuple = ()


def nonfinite_steps(steps: list) -> NonFinite:
    total = run = 0
    run_from = first = None
    keys: set = set()
    first_keys: tuple = ()
    for r in steps:
        bad = tuple(k for k in DIVERGENCE_KEYS if k in r and r[k] is None)
        if not bad:
            run, run_from, keys = 0, None, set()
            continue
        total += 1
        if first is None:
            first, first_keys = r["step"], bad
        if run == 0:
            run_from = r["step"]
        run += 1
        keys.update(bad)
    return NonFinite(total, run, run_from, tuple(k for k in DIVERGENCE_KEYS if k in keys),
                     first, first_keys)


def nonfinite_evals(evals: list, metric: str) -> list[int]:
    """Steps of the evaluations that logged the target metric non-finite (null)."""
    return [r["step"] for r in evals if metric in r and r[metric] is None]


def target_lost(evals: list, metric: str, every: int = 0) -> str | None:
    """Why the run can no longer be judged, or None: the last TARGET_LOST_AFTER evaluations
    lack the target metric (renamed, or never logged under that name), and they span at
    least TARGET_LOST_AFTER - 1 evaluation intervals (`every` samples: rows of a framework
    that logs several evaluation sets apart are not mistaken for it), so a crossing can no
    longer be seen and the run would read as one that did not cross."""
    had = [i for i, r in enumerate(evals) if metric in r]
    since = evals[had[-1] + 1:] if had else evals
    if len(since) < TARGET_LOST_AFTER or (
            since[-1].get("samples", 0) - since[0].get("samples", 0)
            < (TARGET_LOST_AFTER - 1) * every):
        return None
    keys = sorted({k for r in since for k in r if k.startswith("eval/")})[:6]
    logs = f"they log {', '.join(keys)}" if keys else "they log no eval/ key"
    if had:
        return (f"stopped logging the target metric {metric} (target.metric): the last at "
                f"step {evals[had[-1]]['step']}, none in the {len(since)} evaluations since "
                f"(steps {since[0]['step']}..{since[-1]['step']}; {logs})")
    return (f"logged no target metric {metric} (target.metric) in its {len(since)} "
            f"evaluations (steps {since[0]['step']}..{since[-1]['step']}; {logs})")
