"""Banks of recorded runs: every configuration a profile of a config may run, at many seeds,
recorded once so that `rlbatch replay` can serve them to the unchanged profile code
(profile/replay.py; docs/analysis.md, "Replays").

A bank run is the profile's own trial (`plan_trials`: the baseline, each sqrt-scaled
candidate, the fixed-LR control, evaluated every `eval.every_samples` as configured) with
one change that a replay undoes exactly: it does not stop at its first crossing. It stops
(STOP file, code `requested`) once its evaluations have stayed at or above the target over
`eval.every_samples + B` samples, the longest gap between two evaluations of any trial
evaluated at most that far apart; so a trial at the configured cadence, or at a denser
one, crosses within the recorded rows. A run that never crosses ends at
`budget.max_samples`, as the trial would. A trial evaluated at the configured cadence sees
exactly the bank's evaluations (evaluation does not touch training: its sampling is keyed
apart from the rollouts', and `train_s` excludes it); a trial at a denser cadence (the
profile's candidates when the baseline crosses within `profile.min_evaluations`
evaluations) is served the next recorded evaluation, and the replay counts those.

Runs are trained in this process, one at a time (on a small machine, concurrent runs slow
each other's steps, and the bank's times would be wrong), seed by seed, so an interrupted
bank holds every configuration at the seeds it finished; re-running resumes the run that was
cut from its checkpoint and skips finished ones. A finished run's checkpoints are deleted
(a replay reads its logs only).
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rlbatch.analysis.runs import run_row
from rlbatch.core.config import Config
from rlbatch.core.errors import DataError
from rlbatch.core.loading import validate_config
from rlbatch.core.runlog import (
    STOP_FILE,
    Run,
    atomic_write_json,
    atomic_write_text,
    ended_for_good,
    find_runs,
    read_json,
    read_run,
)
from rlbatch.profile.trials import Trial, plan_trials

STOP_TEXT = "requested: bank: evaluations at or above the target over {span:,} samples"


def bank_trials(cfg: Config, bank_dir: Path, seeds: list[int]) -> list[Trial]:
    """The bank's runs: the profile's trials at `seeds`, not stopped at the target;
    seed-major (every configuration of seed 0, then of seed 1, ...)."""
    runs = Path(bank_dir)
    c = cfg.rollout.generation_concurrency
    out = []
    for seed in seeds:
        for t in plan_trials(cfg, runs, c, [seed], kinds=("baseline", "sqrt", "control")):
            data = t.config.model_dump(mode="json")
            data["budget"]["stop_at_target"] = False
            out.append(Trial(t.name, t.kind, t.prompts_per_step, seed, validate_config(data)))
    return out


def settled_span(cfg: Config) -> int:
    """Samples over which a bank run's evaluations must stay at or above the target before
    it is stopped: the longest gap between evaluations of a trial evaluated every
    `eval.every_samples` samples or more often (a mark, plus at most one step to reach it)."""
    return cfg.eval.every_samples + cfg.sequences_per_step


class SettledStopper:
    """The trainer's eval callback for a bank run: writes the STOP file once the run's
    evaluations have stayed at or above the target over `span` samples."""

    def __init__(self, cfg: Config, run_dir: Path, span: int):
        self.metric, self.value, self.gain = cfg.target.metric, cfg.target.value, cfg.target.gain
        self.run_dir, self.span = run_dir, span
        self.threshold: float | None = self.value
        self.streak_from: int | None = None

    def __call__(self, kind: str, row: dict) -> None:
        if kind != "eval":
            return
        v = row.get(self.metric)
        if not isinstance(v, (int, float)) or not math.isfinite(v):
            self.streak_from = None
            return
        if self.threshold is None and self.gain is not None and row["step"] == 0:
            self.threshold = v + self.gain
        if self.threshold is None or v < self.threshold:
            self.streak_from = None
            return
        if self.streak_from is None:
            self.streak_from = row["samples"]
        if row["samples"] - self.streak_from >= self.span:
            stop = self.run_dir / STOP_FILE
            if not stop.exists():
                atomic_write_text(stop, STOP_TEXT.format(span=self.span))


def _replay_streak(stopper: SettledStopper, run_dir: Path) -> None:
    """A resumed run: the stopper learns the threshold and the current streak from the
    evaluations already logged."""
    from rlbatch.core.runlog import read_jsonl

    for row in read_jsonl(run_dir / "evals.jsonl")[0]:
        stopper("eval", row)


def record_bank(cfg: Config, bank_dir: str | Path, seeds: list[int],
                say: Callable[[str], None] | None = None) -> dict:
    """Train the bank's runs that are not finished; write `bank.json` (what each run is and
    its time to target, with a checksum over the runs' N* and throughput); return it."""
    from rlbatch.backends.builtin.checkpoint import CHECKPOINTS
    from rlbatch.backends.builtin.trainer import train

    say = say or (lambda line: print(line, file=sys.stderr, flush=True))
    bank_dir = Path(bank_dir)
    bank_dir.mkdir(parents=True, exist_ok=True)
    trials = bank_trials(cfg, bank_dir, seeds)
    span = settled_span(cfg)
    done = finished_runs(bank_dir)
    dirs = []
    for i, t in enumerate(trials, start=1):
        d = done.get((learning_key(t.config.resolved_dict()), t.seed), t.run_dir())
        dirs.append(d)
        if d != t.run_dir():  # recorded before, under another version's run id
            say(f"[{i}/{len(trials)}] {t.name}: {read_json(d / 'summary.json')['status']} "
                "(recorded before)")
            continue
        status = read_json(d / "summary.json").get("status")
        if ended_for_good(d, status):
            say(f"[{i}/{len(trials)}] {t.name}: {status} (recorded before)")
            continue
        stopper = SettledStopper(t.config, d, span)
        if d.exists():
            _replay_streak(stopper, d)
        t0 = time.perf_counter()
        _, summary = train(t.config, resume=True, callback=stopper)
        if ended_for_good(d, summary.get("status")):  # a replay needs the logs only
            shutil.rmtree(d / CHECKPOINTS, ignore_errors=True)
        tgt = summary.get("target") or {}
        crossing = (f"N* {tgt['samples']:,} samples, T {tgt['train_s']:.1f} s"
                    if tgt.get("reached") else "no crossing")
        say(f"[{i}/{len(trials)}] {t.name}: {summary['status']} at {summary['samples']:,} "
            f"samples, {crossing} ({time.perf_counter() - t0:.0f} s)")
    doc = bank_summary(cfg, trials, dirs)
    atomic_write_json(bank_dir / "bank.json", doc)
    return doc


def finished_runs(bank_dir: Path) -> dict[tuple, Path]:
    """The bank's runs that ended for good, by (learning key, seed): a run is found again
    whatever version of rlbatch named its directory."""
    from rlbatch.core.runlog import find_runs, read_run

    out = {}
    for d in find_runs([bank_dir]) if any(Path(bank_dir).iterdir()) else []:
        run = read_run(d)
        status = (run.summary or {}).get("status")
        if run.config and ended_for_good(d, status):
            out[(learning_key(run.config), run.config.get("seed"))] = d
    return out


def bank_summary(cfg: Config, trials: list[Trial], dirs: list[Path]) -> dict:
    """Each run's configuration, seed, status, N* and T at the bank's evaluations, and
    throughput; `checksum` is a hash of those figures (rounded), to check a regenerated bank."""
    rows = []
    for t, d in zip(trials, dirs):
        s = read_json(d / "summary.json")
        tgt = s.get("target") or {}
        rows.append({"trial": t.name, "kind": t.kind, "run": d.name, "seed": t.seed,
                     "sequences_per_step": t.sequences_per_step, "lr": t.config.actor_lr,
                     "status": s.get("status"),
                     "samples_to_target": tgt.get("samples") if tgt.get("reached") else None,
                     "time_to_target": tgt.get("train_s") if tgt.get("reached") else None,
                     "throughput": s.get("throughput")})
    figures = [[r["run"], r["samples_to_target"],
                None if r["throughput"] is None else round(r["throughput"], 1)] for r in rows]
    digest = hashlib.sha256(json.dumps(figures, sort_keys=True).encode()).hexdigest()[:16]
    return {"config": cfg.name, "runs": rows, "checksum": digest}


# ---- loading a bank ------------------------------------------------------------------------

def learning_key(config: dict) -> tuple:
    """What makes two runs seeds of one configuration for a replay: the algorithm, P, G,
    the actor LR, the batch schedule and the rollouts' staleness (not where or how often it
    was evaluated)."""
    row = run_row(Run(dir=Path("."), config=config, manifest={}, steps=[], evals=[],
                      summary={}))
    lr = row["lr"]
    return (row["algorithm"], row["prompts_per_step"], row["samples_per_prompt"],
            None if lr is None else float(f"{lr:.6g}"), row["schedule"], row["staleness"] or 0)


def describe(key: tuple) -> str:
    algo, p, g, lr, sch, k = key
    b = p * g if isinstance(p, int) and isinstance(g, int) else "?"
    return (f"{algo} B={b} (P={p}, G={g}), lr {lr:.3g}" if lr is not None else
            f"{algo} B={b} (P={p}, G={g})") + (f", schedule {sch}" if sch else "") + \
        (f", staleness {k}" if k else "")


@dataclass
class BankRun:
    dir: Path
    seed: int
    steps: list[dict]
    evals: dict[int, dict]  # step -> evaluation row
    status: str | None
    crossing: dict | None = None  # its first evaluation at or above the target (bank_truth)

    @property
    def every_step(self) -> bool:
        return all(s["step"] in self.evals for s in self.steps)


@dataclass
class Bank:
    dir: Path
    runs: dict[tuple, dict[int, BankRun]]  # learning key -> seed -> run

    def seeds(self, key: tuple) -> list[int]:
        return sorted(self.runs.get(key, {}))

    def common_seeds(self, keys: list[tuple]) -> list[int]:
        sets = [set(self.runs.get(k, {})) for k in keys]
        return sorted(set.intersection(*sets)) if sets else []


def load_bank(bank_dir: str | Path) -> Bank:
    """Every run directory under `bank_dir`, grouped by learning key and seed. A folder with
    no runs, or a run without config.yaml, is a DataError naming it."""
    bank_dir = Path(bank_dir)
    dirs = find_runs([bank_dir])
    if not dirs:
        raise DataError("no run directories (config.yaml with steps.jsonl and evals.jsonl)",
                        where=str(bank_dir))
    runs: dict[tuple, dict[int, BankRun]] = {}
    for d in dirs:
        run = read_run(d)
        if not run.config:
            raise DataError("no config.yaml: a replay cannot tell which configuration this "
                            "run is", where=str(d))
        seed = run.config.get("seed")
        if not isinstance(seed, int):
            raise DataError("config.yaml has no integer `seed`", where=str(d / "config.yaml"))
        steps = sorted({s["step"]: s for s in run.steps if isinstance(s.get("step"), int)}
                       .values(), key=lambda s: s["step"])
        evals = {e["step"]: e for e in run.evals if isinstance(e.get("step"), int)}
        key = learning_key(run.config)
        if seed in runs.setdefault(key, {}):
            raise DataError(f"two runs of {describe(key)} at seed {seed} (the other: "
                            f"{runs[key][seed].dir})", where=str(d))
        runs[key][seed] = BankRun(d, seed, steps, evals, (run.summary or {}).get("status"))
    return Bank(bank_dir, runs)
