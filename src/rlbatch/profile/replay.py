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
import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path

from rlbatch.analysis.runs import run_row
from rlbatch.core.config import Config
from rlbatch.core.errors import DataError, UserError
from rlbatch.core.loading import validate_config
from rlbatch.core.runlog import (
    STOP_FILE,
    Run,
    find_runs,
    make_run_id,
    read_json,
    read_run,
    yaml_data,
    yaml_text,
)
from rlbatch.profile import DEFAULT_FOLLOW
from rlbatch.profile.executors import Finished
from rlbatch.profile.trials import plan_trials

STRATEGIES = ("full", "probe")
WITHIN = 1.05  # a pick "within 5%" of the best: its true T at most 1.05 x the best's
# the error rates the floor is computed for: a pick not within 5% of the best at most 10%
# of the time, a recommendation no faster than the baseline at most the decision's alpha
FLOOR_WRONG = 0.10


def learning_key(config: dict) -> tuple:
    """What makes two runs seeds of one configuration for a replay: the algorithm, P, G,
    the actor LR and the batch schedule (not where or how often it was evaluated)."""
    row = run_row(Run(dir=Path("."), config=config, manifest={}, steps=[], evals=[],
                      summary={}))
    lr = row["lr"]
    return (row["algorithm"], row["prompts_per_step"], row["samples_per_prompt"],
            None if lr is None else float(f"{lr:.6g}"), row["schedule"])


def describe(key: tuple) -> str:
    algo, p, g, lr, sch = key
    b = p * g if isinstance(p, int) and isinstance(g, int) else "?"
    return (f"{algo} B={b} (P={p}, G={g}), lr {lr:.3g}" if lr is not None else
            f"{algo} B={b} (P={p}, G={g})") + (f", schedule {sch}" if sch else "")


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


# ---- the truth of a bank -------------------------------------------------------------------

def bank_truth(cfg: Config, bank: Bank, keys: list[tuple]) -> dict:
    """Every configuration's time ratio against the baseline from all of the bank's seeds
    (the analysis `rlbatch analyze` runs, at the bank's evaluation cadence), and the best."""
    from rlbatch.analysis.analyze import analyze
    from rlbatch.profile.driver import target_of

    base = bank.runs[keys[0]]
    dirs = [r.dir for k in keys for r in bank.runs[k].values()]
    doc = analyze(dirs, target_of(cfg), reference_run=str(base[min(base)].dir),
                  margin=cfg.profile.margin, statistic=cfg.profile.statistic,
                  spread=cfg.profile.spread)
    by_run = {}
    for e in doc["configs"]:
        for r in e["runs"]:
            by_run[str(Path(r["run"]).resolve())] = e
    rows = []
    ref = by_run[str(next(iter(base.values())).dir.resolve())]
    for k in keys:
        e = by_run[str(next(iter(bank.runs[k].values())).dir.resolve())]
        vs = e.get("vs_reference") or {}
        ratio = 1.0 if k == keys[0] else vs.get("time_ratio")
        times = [_run_time(r) for r in bank.runs[k].values()]
        rows.append({"key": k, "config": describe(k), "sequences_per_step": e["sequences_per_step"],
                     "lr": e["lr"], "seeds": len(bank.runs[k]),
                     "crossed": sum(t is not None for t in times),
                     "time_ratio": ratio,
                     "time_ratio_ci": [1.0, 1.0] if k == keys[0] else vs.get("time_ratio_ci"),
                     "samples_ratio": 1.0 if k == keys[0] else vs.get("samples_ratio"),
                     "throughput_ratio": 1.0 if k == keys[0] else vs.get("throughput_ratio"),
                     "verdict": e["verdict"],
                     # a decision picks among the reference's LR-scaling family only
                     "in_family": e["algorithm"] == ref["algorithm"]
                     and e["lr_scaling"] == ref["lr_scaling"],
                     "mean_time_s": statistics.fmean(t for t in times if t is not None)
                     if any(t is not None for t in times) else None,
                     "sd_log_time": statistics.stdev(math.log(t) for t in times if t is not None)
                     if sum(t is not None for t in times) >= 2 else None})
    finite = [r for r in rows if r["time_ratio"] is not None and r["crossed"] * 2 > r["seeds"]]
    # the method's own admission, with every seed: a configuration whose curve departs
    # from the baseline's is not a right pick however fast (docs/design.md, Method)
    admitted = [r for r in finite if r["verdict"] != "departed"]
    best = min(admitted, key=lambda r: r["time_ratio"])
    fastest = min(finite, key=lambda r: r["time_ratio"])
    base_times = [t for t in (_run_time(r) for r in base.values()) if t is not None]
    unit = math.exp(statistics.fmean(math.log(t) for t in base_times))
    return {"configs": rows, "floor": bank_floor(rows, unit), "best": best["key"], "best_time_ratio": best["time_ratio"],
            "best_sequences": best["sequences_per_step"],
            "fastest": fastest["key"], "fastest_time_ratio": fastest["time_ratio"],
            "departed": [r["key"] for r in rows if r["verdict"] == "departed"],
            "baseline_time_to_target_s": unit, "analysis": doc}


def pooled_sd(rows: list[dict]) -> float | None:
    """The spread of log T within a configuration, pooled over the bank's configurations
    (each weighted by its seeds that crossed, less one)."""
    parts = [(r["sd_log_time"], r["crossed"] - 1) for r in rows if r["sd_log_time"] is not None]
    dof = sum(d for _, d in parts)
    return math.sqrt(sum(sd * sd * d for sd, d in parts) / dof) if dof else None


def bank_floor(rows: list[dict], unit: float) -> dict | None:
    """The information floor (profile/floor.py) of the bank's truth: the configurations'
    geometric-mean T ratios, each run costing its configuration's mean T, the spread pooled
    over the bank, the error rates FLOOR_WRONG and the decision's alpha. In units of
    the baseline's T, as every cost of a replay. None where a family member never crossed."""
    from rlbatch.analysis.selection import DEFAULT_ALPHA
    from rlbatch.profile.floor import information_floor

    sd = pooled_sd(rows)
    use = [r for r in rows if r["time_ratio"] is not None and r["mean_time_s"] is not None]
    if sd is None or len(use) < 2 or use[0] is not rows[0] or any(
            r["in_family"] and r["time_ratio"] is None for r in rows):
        return None
    eligible = [r["in_family"] and r["verdict"] != "departed" for r in use]
    f = information_floor([math.log(r["time_ratio"]) for r in use],
                          [r["mean_time_s"] / unit for r in use], eligible, sd,
                          p_right=1 - FLOOR_WRONG, p_false=DEFAULT_ALPHA)
    return {"cost": f.cost, "sd_log_time": sd, "p_within_5pct": 1 - FLOOR_WRONG,
            "p_false_recommendation": DEFAULT_ALPHA,
            "right_answers": [use[i]["config"] for i in f.right],
            "runs": {r["config"]: n for r, n in zip(use, f.runs) if n > 1e-9},
            "binding": [{"made_best": use[b["made_best"]]["config"],
                         "kind": "a false recommendation" if b["margin"] == 0
                         else "a pick not within 5%", "error_rate": b["error_rate"]}
                        for b in f.binding]}


def pairing(bank: Bank, keys: list[tuple]) -> list[dict]:
    """Same-seed pairs of each configuration with the baseline (the same prompt stream):
    the correlation of log N* and of log T across seeds where both crossed, and the sd of
    the per-seed log T ratio against that of unpaired differences (sqrt(sd_a^2 + sd_b^2)).
    `seed_factor` = (paired variance) / (unpaired variance): the share of seeds a paired
    comparison needs for the same precision (below 1: pairing pays)."""
    base = bank.runs[keys[0]]
    out = []
    for k in keys[1:]:
        seeds = [s for s in bank.common_seeds([keys[0], k])
                 if base[s].crossing and bank.runs[k][s].crossing]
        row = {"config": describe(k), "pairs": len(seeds)}
        if len(seeds) >= 3:
            nb, nc = _logs(base, seeds, "samples"), _logs(bank.runs[k], seeds, "samples")
            tb, tc = _logs(base, seeds, "train_s"), _logs(bank.runs[k], seeds, "train_s")
            diff = [c - b for b, c in zip(tb, tc)]
            unpaired = statistics.variance(tb) + statistics.variance(tc)
            row.update(corr_log_nstar=_corr(nb, nc), corr_log_time=_corr(tb, tc),
                       sd_paired_log_time_ratio=statistics.stdev(diff),
                       sd_unpaired_log_time_ratio=math.sqrt(unpaired),
                       seed_factor=statistics.variance(diff) / unpaired if unpaired else None)
        out.append(row)
    return out


def _logs(runs: dict[int, BankRun], seeds: list[int], what: str) -> list[float]:
    return [math.log(runs[s].crossing[what]) for s in seeds]


def _corr(a: list[float], b: list[float]) -> float | None:
    try:
        return statistics.correlation(a, b)
    except statistics.StatisticsError:  # a constant series
        return None


def _run_time(run: BankRun) -> float | None:
    """A bank run's time to target at its own cadence (None when it never crossed)."""
    return _crossing(run, lambda s: s["train_s"])


def _crossing(run: BankRun, what) -> float | None:
    return None if run.crossing is None else what(run.crossing)


def _first_crossing(run: BankRun, cfg: Config) -> dict | None:
    t = cfg.target
    rows = [run.evals[k] for k in sorted(run.evals)]
    if not rows:
        return None
    threshold = t.value
    if threshold is None:
        v0 = rows[0].get(t.metric)
        threshold = None if v0 is None or rows[0]["step"] != 0 else v0 + t.gain
    if threshold is None:
        return None
    for r in rows:
        v = r.get(t.metric)
        if isinstance(v, (int, float)) and math.isfinite(v) and v >= threshold:
            return r
    return None


def attach_crossings(bank: Bank, cfg: Config) -> None:
    for runs in bank.runs.values():
        for r in runs.values():
            r.crossing = _first_crossing(r, cfg)


# ---- replicates -----------------------------------------------------------------------------

@dataclass
class Outcome:
    """One replicate: what it picked (a learning key; the baseline when it kept it or
    decided nothing), the interval it printed for the pick, its cost, how many times it
    followed `next`, and whether the bank ran out before `next` could be followed."""

    pick: tuple
    recommends: bool
    interval: list | None
    cost_s: float
    follows: int
    unserved: int = 0
    cut: str | None = None
    problem: str | None = None
    evidence: str | None = None
    point: float | None = None  # the pick's printed T ratio


def _decision(doc: dict, strategy: str, base_key: tuple) -> tuple[tuple, bool, list | None]:
    d = doc.get("decision")
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
    current = validate_config(data)
    run = run_probe_profile if strategy == "probe" else run_profile
    follows, cut, doc, unserved = 0, None, None, 0
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
        sets = next_sets(doc, strategy)
        if sets is None or follows >= follow:
            break
        follows += 1
        current = with_sets(current, sets)
    pick, recommends, ci = _decision(doc, strategy, base_key)
    rec = (doc.get("analysis") or {}).get("recommendation") or {}
    point = 1 / rec["speedup_vs_reference"] if recommends and strategy != "probe" and \
        rec.get("speedup_vs_reference") else None
    return Outcome(pick, recommends, ci, spent(work / "runs"), follows, unserved, cut,
                   doc.get("problem"), (doc.get("decision") or {}).get("evidence")
                   or rec.get("evidence"), point)


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


def score(outcomes: list[Outcome], truth: dict, strategy: str) -> dict:
    ratio = {r["key"]: r["time_ratio"] for r in truth["configs"]}
    best = truth["best_time_ratio"]

    def true_ratio(key):
        r = ratio.get(key)
        return math.inf if r is None else r

    n = len(outcomes)
    regrets = [true_ratio(o.pick) / best - 1 for o in outcomes]
    recs = [o for o in outcomes if o.recommends]
    covered = [o for o in recs if o.interval and None not in o.interval
               and ratio.get(o.pick) is not None
               and o.interval[0] <= ratio[o.pick] <= o.interval[1]]
    with_ci = [o for o in recs if o.interval and None not in o.interval]
    unit = truth["baseline_time_to_target_s"]
    return {"strategy": strategy, "replicates": n,
            "recommends": len(recs) / n,
            "picks_within_5pct": sum(true_ratio(o.pick) <= WITHIN * best for o in outcomes) / n,
            "mean_regret": statistics.fmean(regrets) if all(map(math.isfinite, regrets))
            else math.inf,
            "slower_than_baseline": sum(true_ratio(o.pick) > 1.0 for o in recs) / n,
            "picks_departed": sum(o.pick in truth["departed"] for o in recs) / n,
            "median_cost": statistics.median(o.cost_s / unit for o in outcomes),
            "mean_cost": statistics.fmean(o.cost_s / unit for o in outcomes),
            "pick_interval_coverage": len(covered) / len(with_ci) if with_ci else None,
            "recommendations_with_interval": len(with_ci),
            "followed_next": sum(o.follows for o in outcomes) / n,
            "cut_by_bank": sum(o.cut is not None for o in outcomes),
            "unserved_evaluations": sum(o.unserved for o in outcomes),
            "no_decision": sum(o.problem is not None for o in outcomes),
            "pick_log_bias": pick_log_bias(recs, ratio)}


def pick_log_bias(recs: list[Outcome], ratio: dict) -> float | None:
    """How far the recommended picks' printed T ratios lie from the bank's truth: the mean
    of log(printed / true) (negative: the pick looks faster than it is, as a pick chosen and
    stopped on its luckier draws does). None without a recommendation."""
    logs = [math.log(o.point / ratio[o.pick]) for o in recs
            if o.point and ratio.get(o.pick)]
    return statistics.fmean(logs) if logs else None


def reference_rows(truth: dict, bank: Bank, keys: list[tuple], replicates: int,
                   rng: random.Random) -> list[dict]:
    """"always keep the baseline", and one seed per configuration with the lowest T picked
    (each run to its target; a run that never crosses counts its whole training time)."""
    ratio = {r["key"]: r["time_ratio"] for r in truth["configs"]}
    best, unit = truth["best_time_ratio"], truth["baseline_time_to_target_s"]
    keep = {"strategy": "keep_baseline", "replicates": replicates, "recommends": 0.0,
            "picks_within_5pct": float(1.0 <= WITHIN * best), "mean_regret": 1.0 / best - 1,
            "slower_than_baseline": 0.0, "picks_departed": 0.0, "median_cost": 0.0,
            "mean_cost": 0.0,
            "pick_interval_coverage": None}
    seeds = bank.common_seeds(keys)
    picks, costs = [], []
    for _ in range(replicates):
        s = rng.choice(seeds)
        times = {}
        cost = 0.0
        for k in keys:
            run = bank.runs[k][s]
            t = _run_time(run)
            times[k] = math.inf if t is None else t
            cost += run.steps[-1]["train_s"] if t is None else t
        picks.append(min(keys, key=lambda k: (times[k], keys.index(k))))
        costs.append(cost / unit)
    tr = [math.inf if ratio.get(k) is None else ratio[k] for k in picks]
    grid = {"strategy": "one_seed_grid", "replicates": replicates,
            "recommends": sum(k != keys[0] for k in picks) / replicates,
            "picks_within_5pct": sum(r <= WITHIN * best for r in tr) / replicates,
            "mean_regret": statistics.fmean(r / best - 1 for r in tr),
            "slower_than_baseline": sum(r > 1.0 for k, r in zip(picks, tr) if k != keys[0])
            / replicates,
            "picks_departed": sum(k in truth["departed"] for k in picks) / replicates,
            "median_cost": statistics.median(costs), "mean_cost": statistics.fmean(costs),
            "pick_interval_coverage": None}
    return [keep, grid]


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
    rows += reference_rows(truth, bank, keys, replicates, random.Random(seed + 1))
    floor = truth["floor"]
    for r in rows:
        r["floor_cost"] = None if floor is None else floor["cost"]
        r["cost_over_floor"] = (r["median_cost"] / floor["cost"]
                                if floor and floor["cost"] > 0 else None)
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


def _scratch() -> str | None:
    shm = Path("/dev/shm")
    return str(shm) if shm.is_dir() and shm.stat().st_mode & 0o002 else None
