"""Replays: the real profile code on recorded runs (`rlbatch replay`; docs/analysis.md,
"Replays").

A bank (profile/bank.py, or any folder of run logs whose config.yaml name the profile's
configurations) holds many seeds of each configuration. One replicate of a strategy is one
whole `rlbatch profile` (the unchanged `run_profile` or `run_probe_profile`) whose trials
are served from the bank instead of trained:

- the profile's seeds map to a random draw of the bank's seeds, the same draw for every
  configuration, so same-seed runs (the same prompt stream) stay pairs;
- a trial's rows are revealed one step per poll of the profile's driver, as its run's clock
  advances, so early stops and budget stops act where they would have; a STOP file ends the
  trial after the next step, as the trainer honours it; the target, the budget and the
  evaluation cadence of the trial's own config apply (a bank evaluated every step serves any
  cadence exactly: evaluation does not touch training);
- `next` is followed when the decision says to (more seeds, or the probe's larger budget),
  up to `follow` times, in the same profile folder, as the printed command would.

Each replicate is scored against the bank's truth: the analysis (`rlbatch analyze`'s) of all
of the bank's seeds of every configuration, at the bank's own evaluation cadence.
Trials run one at a time (`profile.workers: 1`) and without the decode sweep
(`profile.concurrency: []`): a bank is recorded at one decode concurrency.
"""

from __future__ import annotations

import json
import math
import random
import shutil
import tempfile
from pathlib import Path

from rlbatch.core.config import Config
from rlbatch.core.errors import DataError, UserError
from rlbatch.core.loading import validate_config
from rlbatch.core.runlog import (
    STOP_FILE,
    make_run_id,
    read_json,
    read_run,
    yaml_data,
    yaml_text,
)
from rlbatch.profile import DEFAULT_FOLLOW, budget
from rlbatch.profile.bank import Bank, BankRun, describe, learning_key, load_bank
from rlbatch.profile.executors import Finished
from rlbatch.profile.replay_truth import (
    Outcome,
    attach_crossings,
    bank_truth,
    pairing,
    reference_rows,
    score,
)
from rlbatch.profile.trials import plan_trials

STRATEGIES = ("full", "probe")


def replay_config(cfg: Config) -> Config:
    """The profile config a replay runs: one trial at a time, no decode sweep."""
    data = cfg.model_dump(mode="json")
    data["profile"]["concurrency"] = []
    data["profile"]["workers"] = 1
    return validate_config(data)


def profile_keys(cfg: Config) -> list[tuple]:
    """The learning keys of every trial a profile of `cfg` may run (baseline first)."""
    trials = plan_trials(cfg, Path("/nonexistent"), cfg.rollout.generation_concurrency, [cfg.seed],
                         kinds=("baseline", "sqrt", "control", "schedule"))
    keys = []
    for t in trials:
        k = learning_key(t.config.resolved_dict())
        if k not in keys:
            keys.append(k)
    return keys


class _Trial:
    """A trial being served: its run directory, the bank run behind it, and the trainer's
    counters (steps revealed, next evaluation mark, the target's threshold)."""

    def __init__(self, cfg: Config, run_dir: Path, src: BankRun):
        self.cfg, self.dir, self.src = cfg, run_dir, src
        self.every = cfg.eval.every_samples
        self.steps: list[dict] = []
        self.evals: list[dict] = []
        self.threshold = cfg.target.value
        self.target: dict | None = None
        self.status = "running"
        self.stop_reason = self.stop_code = None
        self.next_eval = 0
        self.unserved = 0

    def _write(self, name: str, rows: list[dict]) -> None:
        with open(self.dir / name, "a") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)

    def _evaluate(self, step: dict) -> None:
        """The trainer's evaluation after `step`: the bank's row at that step. A bank not
        evaluated there (recorded at a sparser cadence than this trial's) has none to serve:
        the evaluation is counted in `unserved` and the trial goes on without it."""
        self.next_eval = (step["samples"] // self.every + 1) * self.every
        row = self.src.evals.get(step["step"])
        if row is None:
            self.unserved += 1
            return
        self.evals.append(row)
        self._write("evals.jsonl", [row])
        t = self.cfg.target
        value = row.get(t.metric)
        if not isinstance(value, (int, float)) or not math.isfinite(value):
            return
        if self.threshold is None and t.gain is not None and step["step"] == 0:
            self.threshold = value + t.gain
        if self.target is None and self.threshold is not None and value >= self.threshold:
            self.target = {"step": row["step"], "samples": row["samples"],
                           "train_s": row["train_s"], "reached_value": value}
            if self.cfg.budget.stop_at_target and self.status == "running":
                self.status = "target_reached"

    def start(self) -> None:
        """A new trial: its config, manifest and the step-0 evaluation; a trial continued
        (a probe extended) picks up where its rows end."""
        self.dir.mkdir(parents=True, exist_ok=True)
        old = read_run(self.dir) if (self.dir / "steps.jsonl").exists() else None
        if old is None or not old.steps:
            (self.dir / "config.yaml").write_text(yaml_text(self.cfg.resolved_dict()))
            (self.dir / "manifest.json").write_text(json.dumps(
                {"run_id": self.dir.name, "seed": self.cfg.seed, "backend": "replay",
                 "bank_run": str(self.src.dir)}))
            for name in ("steps.jsonl", "evals.jsonl"):
                (self.dir / name).write_text("")
            self._evaluate({"step": 0, "samples": 0})
        else:
            self.steps, self.evals = old.steps, old.evals
            for row in self.evals:  # the threshold and a crossing already seen
                v = row.get(self.cfg.target.metric)
                if not isinstance(v, (int, float)):
                    continue
                if self.threshold is None and row["step"] == 0 and self.cfg.target.gain is not None:
                    self.threshold = v + self.cfg.target.gain
                if self.target is None and self.threshold is not None and v >= self.threshold:
                    self.target = {"step": row["step"], "samples": row["samples"],
                                   "train_s": row["train_s"], "reached_value": v}
            last = self.steps[-1]["samples"]
            self.next_eval = (last // self.every + 1) * self.every
        self._summary()

    def advance(self) -> bool:
        """One more step, with what the trainer does after it; True when the trial ended."""
        i = len(self.steps)
        if i >= len(self.src.steps):
            raise DataError(
                f"the bank run ends at step {i} ({self.src.status}) but a trial of its "
                f"configuration runs on: record the bank with this config (rlbatch bank)",
                where=str(self.src.dir))
        step = self.src.steps[i]
        self.steps.append(step)
        self._write("steps.jsonl", [step])
        if step["samples"] >= self.next_eval:
            self._evaluate(step)
        if self.status == "running":
            stop = self.dir / STOP_FILE
            budget = self.cfg.budget
            if stop.exists():
                self.stop_reason = stop.read_text().strip() or "requested"
                code = self.stop_reason.split(":", 1)[0].strip()
                self.stop_code = code if code in ("cannot_win", "no_crossing", "probe",
                                                  "profile_budget") else "requested"
                self.status = "stopped"
            elif step["samples"] >= budget.max_samples or (
                    budget.max_train_s and step["train_s"] >= budget.max_train_s):
                self.status = "target_reached" if self.target else "budget_exhausted"
        if self.status != "running" and (not self.evals or self.evals[-1]["step"] != step["step"]):
            self._evaluate(step)  # a finished run ends on an evaluation
            if self.status == "budget_exhausted" and self.target:
                self.status = "target_reached"
        self._summary()
        return self.status != "running"

    def _summary(self) -> None:
        last = self.steps[-1] if self.steps else {"samples": 0, "train_s": 0.0, "step": 0}
        t = self.cfg.target
        target = {"metric": t.metric, "value": t.value, "gain": t.gain,
                  "threshold": self.threshold, "reached": self.target is not None,
                  **(self.target or {})}
        doc = {"status": self.status, "steps": last["step"], "samples": last["samples"],
               "train_s": last["train_s"],
               "throughput": last["samples"] / last["train_s"] if last["train_s"] else None,
               "target": target, "last_eval": self.evals[-1] if self.evals else None,
               "stop_reason": self.stop_reason, "stop_code": self.stop_code, "failure": None}
        (self.dir / "summary.json").write_text(json.dumps(doc))


class ReplayExecutor:
    """The profile's executor, serving bank runs: `seed_map` maps a profile seed to a bank
    seed (KeyError-free: a seed beyond the draw is a `BankExhausted`)."""

    def __init__(self, bank: Bank, seed_map: dict[int, int]):
        self.bank, self.seed_map = bank, seed_map
        self.live: dict[str, _Trial] = {}
        self.workers = 1
        self.unserved = 0  # evaluations a trial asked for that the bank did not record

    def capacity(self) -> int:
        return 1 - len(self.live)

    def running(self) -> list[str]:
        return list(self.live)

    def submit(self, name: str, config_path: Path, log_path: Path) -> None:
        data = yaml_data(Path(config_path).read_text())  # the driver wrote it: no overlays
        data.pop("derived", None)
        cfg = validate_config(data)
        key = learning_key(cfg.resolved_dict())
        if cfg.seed not in self.seed_map:
            raise BankExhausted(f"the profile asked for seed {cfg.seed}; the bank's draw has "
                                f"{len(self.seed_map)} seeds")
        src = self.bank.runs.get(key, {}).get(self.seed_map[cfg.seed])
        if src is None:
            raise BankExhausted(f"the bank has no run of {describe(key)} at seed "
                                f"{self.seed_map[cfg.seed]}")
        d = Path(cfg.output_dir) / make_run_id(cfg.resolved_dict(), cfg.seed)
        trial = _Trial(cfg, d, src)
        trial.start()
        self.live[name] = trial

    def poll(self) -> list[Finished]:
        done = []
        for name, trial in list(self.live.items()):
            if trial.status != "running" or trial.advance():
                self.unserved += trial.unserved
                del self.live[name]
                done.append(Finished(name, 0, Path("/dev/null")))
        return done

    def shutdown(self) -> None:
        self.live.clear()


class BankExhausted(UserError):
    """A replicate needs a run the bank does not hold (more seeds than it has)."""


# ---- replicates -----------------------------------------------------------------------------

def _decision(doc: dict, strategy: str, base_key: tuple) -> tuple[tuple, bool, list | None]:
    d = doc.get("decision")
    b = (d or {}).get("budget")
    if b:  # within a budget, the budget's pick (profile/budget.py)
        if b["is_reference"]:
            return base_key, False, None
        return learning_key(_run_config(doc, {"config": b["pick"]})), True, \
            d.get("time_ratio_ci") if d.get("config") == b["pick"] else None
    if not d or d.get("is_reference", True):
        return base_key, False, None
    key = learning_key(_run_config(doc, d))
    if strategy == "probe":
        return key, True, d.get("time_ratio_ci") or d.get("predicted_time_ratio_ci")
    return key, True, d.get("time_ratio_ci")


def _run_config(doc: dict, d: dict) -> dict:
    """The config of a run of the chosen configuration (the probe strategy names a trial,
    the full one a configuration of its analysis)."""
    if "trial" in d:
        run_dir = Path(next(t for t in doc["trials"] if t["trial"] == d["trial"])["run_dir"])
    else:
        entry = next(e for e in doc["analysis"]["configs"] if e["config"] == d["config"])
        run_dir = Path(entry["runs"][0]["run"])
    return yaml_data((run_dir / "config.yaml").read_text())


def run_replicate(cfg: Config, bank: Bank, strategy: str, seed_map: dict[int, int],
                  work: Path, follow: int, base_key: tuple) -> Outcome:
    from rlbatch.profile.driver import next_sets, with_sets
    from rlbatch.profile.probing import run_probe_profile
    from rlbatch.profile.procedure import run_profile

    data = cfg.model_dump(mode="json")
    data["profile"]["strategy"] = strategy
    if strategy == "probe":  # a budget, the default decision's too, is the full strategy's
        data["profile"].update(budget=None, budget_seconds=None, sequential=False)
    current = validate_config(data)
    run = run_probe_profile if strategy == "probe" else run_profile
    follows, cut, doc, unserved, first, after = 0, None, None, 0, None, None
    follow = budget.follows(current.profile, follow)
    while True:
        ex = ReplayExecutor(bank, seed_map)
        try:
            doc = run(current, work, ex, poll_s=0.0)
        except BankExhausted as exc:
            if doc is None:
                raise
            cut = str(exc)
            break
        except UserError as exc:  # the profile refused (e.g. a baseline too few evaluations
            # resolve): what a user would have seen; this replicate decides nothing
            if doc is None:
                doc = {"decision": None, "problem": f"refused: {exc}", "analysis": None}
            else:  # a follow-up refused: the previous look's decision stands
                cut = f"refused: {exc}"
            break
        finally:
            unserved += ex.unserved
        if follows == 0:  # the first look's forecast from its own runs (a decision that goes on)
            after = ((doc.get("decision") or {}).get("budget") or {}).get("forecast_runs")
        fc = doc.get("forecast") or {}
        if first is None or fc.get("decide_runs"):  # the forecast, and what the look it
            # forecast cost (a sequential decision's: every look's, so the last one's)
            first = (fc.get("look_runs") or fc.get("decide_runs"),
                     (doc.get("cost") or {}).get("multiple_of_baseline_time_to_target"))
        sets = next_sets(doc, strategy)
        if sets is None or follows >= follow:
            break
        follows += 1
        current = with_sets(current, sets)
    pick, recommends, ci = _decision(doc, strategy, base_key)
    rec = (doc.get("analysis") or {}).get("recommendation") or {}
    point = 1 / rec["speedup_vs_reference"] if recommends and strategy != "probe" and \
        rec.get("speedup_vs_reference") else None
    b = (doc.get("decision") or {}).get("budget") or {}
    if b and not b["is_reference"]:
        point = next(r["time_ratio"] for r in b["probabilities"]["configs"]
                     if r["config"] == b["pick"])
    return Outcome(pick, recommends, ci, spent(work / "runs"), follows, unserved, cut,
                   doc.get("problem"), (doc.get("decision") or {}).get("evidence")
                   or rec.get("evidence"), point, b.get("p_within_5pct"),
                   b.get("p_slower_than_baseline"), *(first or (None, None)), after)


def spent(runs: Path) -> float:
    """Training seconds of every trial a replicate ran, follow-ups (and a follow-up the bank
    could not finish) included."""
    total = 0.0
    for d in runs.iterdir() if runs.is_dir() else ():
        total += read_json(d / "summary.json").get("train_s") or 0.0
    return total


def seed_draw(first: int, bank_seeds: list[int], rng: random.Random) -> dict[int, int]:
    """Profile seeds first, first + 1, ... -> a random order of the bank's seeds."""
    return {first + i: s for i, s in enumerate(rng.sample(bank_seeds, len(bank_seeds)))}


def needed_seeds(cfg: Config, strategy: str) -> int:
    prof = cfg.profile
    return prof.seeds + prof.confirm_seeds if strategy == "full" else 2


def replay(cfg: Config, bank_dir: str | Path, strategies: list[str], replicates: int,
           seed: int = 0, follow: int = DEFAULT_FOLLOW, say=None) -> dict:
    """Replicated profiles of each strategy on the bank; the scores and the bank's truth."""
    say = say or (lambda line: None)
    cfg = replay_config(cfg)
    bank = load_bank(bank_dir)
    keys = profile_keys(cfg)
    missing = [k for k in keys if k not in bank.runs]
    if len(missing) == len(keys):
        raise DataError(f"no run matches a configuration of {cfg.name} (the first: "
                        f"{describe(keys[0])})", where=str(bank_dir))
    if missing:
        raise DataError(f"no runs of {describe(missing[0])}, which a profile of {cfg.name} "
                        "runs", where=str(bank_dir))
    common = bank.common_seeds(keys)
    for s in strategies:
        need = needed_seeds(cfg, s)
        if len(common) < need:
            short = min(keys, key=lambda k: len(bank.runs[k]))
            raise DataError(f"{describe(short)} has {len(bank.runs[short])} seeds (with every "
                            f"other configuration: {len(common)}); the {s} strategy needs "
                            f"{need}", where=str(bank_dir))
    attach_crossings(bank, cfg)
    truth = bank_truth(cfg, bank, keys)
    rng = random.Random(seed)
    rows = []
    for s in strategies:
        outcomes = []
        for i in range(replicates):
            draw = seed_draw(cfg.seed, common, random.Random(rng.random()))
            work = Path(tempfile.mkdtemp(prefix="rlbatch-replay-", dir=_scratch()))
            try:
                o = run_replicate(cfg, bank, s, draw, work, follow, keys[0])
            finally:
                shutil.rmtree(work, ignore_errors=True)
            outcomes.append(o)
            say(f"replay {s} {i + 1}/{replicates}: "
                + ("recommends " + describe(o.pick) if o.recommends else "keeps the baseline")
                + f", cost {o.cost_s / truth['baseline_time_to_target_s']:.2f}x, "
                  f"followed next {o.follows}x" + (f" (cut: {o.cut})" if o.cut else ""))
        rows.append(score(outcomes, truth, s))
    rows += reference_rows(truth, bank, keys, replicates, random.Random(seed + 1),
                           cfg.profile.budget)
    over_floor(rows, truth["floor"])
    t = truth
    return {"config": cfg.name, "bank": str(bank_dir), "seeds_in_bank": len(common),
            "strategies": rows,
            "truth": {"configs": [{k: v for k, v in r.items() if k != "key"}
                                  for r in t["configs"]],
                      "best_sequences": t["best_sequences"],
                      "best": describe(t["best"]),
                      "fastest": describe(t["fastest"]),
                      "fastest_time_ratio": t["fastest_time_ratio"],
                      "departed": [describe(k) for k in t["departed"]],
                      "baseline_time_to_target_s": t["baseline_time_to_target_s"],
                      "floor": t["floor"],
                      "pairing": pairing(bank, keys)}}


def over_floor(rows: list[dict], floor: dict | None) -> None:
    """Each row's `floor_cost` and median cost over it (None without a floor)."""
    for r in rows:
        r["floor_cost"] = None if floor is None else floor["cost"]
        r["cost_over_floor"] = (r["median_cost"] / floor["cost"]
                                if floor and floor["cost"] > 0 else None)


def _scratch() -> str | None:
    shm = Path("/dev/shm")
    return str(shm) if shm.is_dir() and shm.stat().st_mode & 0o002 else None
