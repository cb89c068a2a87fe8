"""`rlbatch profile`: the "align, then accelerate" procedure as one resumable command.

Order (docs/design.md, Method; the decode sweep comes first so the alignment runs already
measure the full loop at the chosen concurrency and no second pass is needed):
1. decode-concurrency sweep, once per model and length profile (`decode.json`): C = the
   plateau (smallest C within 5% of the best tokens/s) that fits the memory budget;
2. the baseline at (B0, eta0), `profile.seeds` + `profile.confirm_seeds` seeds (it is
   never stopped early, so its confirmation seeds run first and anchor the early stops on
   more than one seed). Its N* must be resolved by at least
   `profile.min_evaluations` (10) evaluations, or the profile refuses and names the cadence to
   set; a target met by the first evaluation is "too easy" and also refused;
3. screening: each sqrt-scaled candidate and the fixed-LR control at 2 x B0, with the
   candidates' evaluation interval set from the baseline's N* (at most N*/10). With early
   stopping on, a trial is stopped (and evaluated where it stops) with code
   - `no_crossing` once its samples pass exp(margin) x the baseline's largest N* without a
     crossing (its N* ratio is then outside the equivalence margin), or
   - `cannot_win` once its training seconds pass the baseline's median time to target
     without a crossing (its T is then above the baseline's);
4. confirmation: `profile.confirm_seeds` more seeds for the challenger (the reference
   family's configuration with the lowest time to target that could still win), so the
   decision compares configurations with at least 2 seeds each;
5. the analysis of all runs (the same function `rlbatch analyze` calls, with the same
   reference, target and margin, so both give the same decision) and `profile.json`: the
   decision with its evidence, and the profiling cost (all trials' training seconds plus the
   sweep, as a multiple of one baseline run's time to target).

Resumable: the state is the run directories plus `journal.jsonl`. Re-running the same command
skips finished trials (without starting a process) and resumes interrupted and failed ones
from their checkpoints; a killed profile loses at most the steps since each trial's last
checkpoint. A trial whose process fails stops the profile with one line naming the trial and
its `failure`.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import yaml

from rlbatch.analysis.analyze import analyze
from rlbatch.analysis.crossing import Target
from rlbatch.core.config import Config
from rlbatch.core.errors import UserError
from rlbatch.core.runlog import (
    FINISHED,
    STOP_FILE,
    append_jsonl,
    atomic_write_json,
    atomic_write_text,
    ended_for_good,
    read_json,
    read_jsonl,
)
from rlbatch.profile.trials import Trial, baseline_prompts, plan_trials

Progress = Callable[[list[dict]], None]
Stopper = Callable[[dict], "str | None"]


class Journal:
    def __init__(self, path: Path):
        self.path = path

    def log(self, event: str, **fields) -> None:
        row = {"time": time.strftime("%Y-%m-%dT%H:%M:%S"), "event": event, **fields}
        append_jsonl(self.path, row)

    def events(self) -> list[dict]:
        return read_jsonl(self.path)[0]


def trial_status(trial: Trial) -> dict:
    d = trial.run_dir()
    summary = read_json(d / "summary.json")
    steps = read_jsonl(d / "steps.jsonl")[0]
    evals = read_jsonl(d / "evals.jsonl")[0]
    last = steps[-1] if steps else {}
    metric = trial.config.target.metric
    return {"trial": trial.name, "kind": trial.kind, "B": trial.sequences_per_step,
            "lr": trial.config.actor_lr, "seed": trial.seed,
            "samples": last.get("samples", 0), "train_s": last.get("train_s", 0.0),
            "metric": evals[-1].get(metric) if evals else None,
            "status": summary.get("status", "pending"), "target": summary.get("target") or {},
            "stop_reason": summary.get("stop_reason"), "stop_code": summary.get("stop_code"),
            "failure": summary.get("failure"), "run_dir": str(d)}


def _finished(trial: Trial) -> bool:
    """Ended for good. A `stopped` trial whose STOP file was removed is not: its process
    continues it (a probe being extended, profile/probing.py)."""
    return ended_for_good(trial.run_dir(), trial_status(trial)["status"])


class Driver:
    """Runs a list of trials on an executor, watching them for progress and early stops."""

    def __init__(self, cfg: Config, out: Path, executor, journal: Journal,
                 progress: Progress | None, poll_s: float = 0.5):
        self.cfg, self.out, self.ex, self.journal = cfg, out, executor, journal
        self.progress = progress or (lambda rows: None)
        self.poll_s = poll_s
        self.all: list[Trial] = []

    def run(self, trials: list[Trial], stopper: Stopper | None = None) -> None:
        for t in trials:
            if t not in self.all:
                self.all.append(t)
        pending = []
        for t in trials:  # a failed trial is not finished: its process resumes it
            if _finished(t):
                self.journal.log("skipped_finished", trial=t.name, run_dir=str(t.run_dir()))
            else:
                pending.append(t)
        by_name = {t.name: t for t in trials}
        while pending or self.ex.running():
            while pending and self.ex.capacity() > 0:
                self._submit(pending.pop(0))
            for fin in self.ex.poll():
                st = trial_status(by_name[fin.name])
                self.journal.log("finished", trial=fin.name, returncode=fin.returncode,
                                 status=st["status"], stop_reason=st["stop_reason"],
                                 failure=st["failure"])
                if fin.returncode != 0:
                    why = f": {st['failure']}" if st["failure"] else ""
                    raise UserError(f"trial {fin.name} failed (exit {fin.returncode}{why}); "
                                    f"see {fin.log}; re-run the profile to resume it")
                if st["status"] not in FINISHED:
                    raise UserError(f"trial {fin.name} ended but {st['run_dir']} is not a "
                                    f"finished run (status {st['status']}); see {fin.log}")
            for name in self.ex.running():
                st = trial_status(by_name[name])
                reason = stopper(st) if stopper else None
                stop = Path(st["run_dir"]) / STOP_FILE
                if reason and not stop.exists():
                    atomic_write_text(stop, reason)
                    self.journal.log("stop_requested", trial=name, reason=reason)
            self.progress([trial_status(t) for t in self.all])
            time.sleep(self.poll_s)
        self.progress([trial_status(t) for t in self.all])

    def _submit(self, t: Trial) -> None:
        cfg_path = self.out / "trials" / f"{t.name}.yaml"
        atomic_write_text(cfg_path, yaml.safe_dump(t.config.resolved_dict(), sort_keys=False))
        log = self.out / "logs" / f"{t.name}.log"
        self.ex.submit(t.name, cfg_path, log)
        self.journal.log("started", trial=t.name, run_dir=str(t.run_dir()))


def early_stop_reason(st: dict, base_median_time: float, nstar_limit: float) -> str | None:
    """Why a running trial should stop ("<code>: <detail>"), or None. `st` is its status row
    (samples, train_s, target.reached). Codes: `no_crossing` (past exp(margin) x the
    baseline's largest N* without a crossing), `cannot_win` (past the baseline's median time
    to target without a crossing). Baseline trials are never stopped: every comparison is
    anchored on them."""
    if st.get("kind") == "baseline" or st["target"].get("reached"):
        return None
    if st["samples"] >= nstar_limit:
        return (f"no_crossing: no crossing by {st['samples']:,} samples, beyond exp(margin) x "
                f"the baseline's largest N* = {nstar_limit:,.0f}")
    if st["train_s"] > base_median_time:
        return (f"cannot_win: {st['train_s']:.1f} training seconds without a crossing, beyond "
                f"the baseline's median time to target {base_median_time:.1f} s")
    return None


def choose_concurrency(cfg: Config, out: Path, journal: Journal, batch_max: int) -> dict:
    """Decode sweep on the model, cached in decode.json; returns the sweep and chosen C."""
    wanted = sorted(c for c in cfg.profile.concurrency if c <= batch_max) or [batch_max]
    path = out / "decode.json"
    key = {"model": cfg.model, "task": cfg.task.name, "digits": cfg.task.digits,
           "new_tokens": cfg.rollout.max_new_tokens, "concurrency": wanted}
    cached = read_json(path)
    if cached.get("key") == key:
        return cached
    if not cfg.profile.concurrency:
        doc = {"key": key, "chosen": cfg.rollout.generation_concurrency, "sweep": None,
               "seconds": 0.0}
    else:
        doc = _sweep(cfg, key, wanted)
    atomic_write_json(path, doc)
    journal.log("decode_sweep", chosen=doc["chosen"], seconds=doc["seconds"])
    return doc


def _sweep(cfg: Config, key: dict, wanted: list[int]) -> dict:
    from rlbatch.rollout.datasets import build_task
    from rlbatch.rollout.decode_bench import BenchSpec, run_decode_bench
    from rlbatch.rollout.models import load_model_and_tokenizer, resolve_model_path
    from rlbatch.rollout.prompt_lengths import check_prompt_lengths

    path = resolve_model_path(cfg.model, cfg.task.name, cfg.task.digits)
    check_prompt_lengths(build_task(cfg.task), path, cfg.rollout.max_new_tokens)
    _, tok = load_model_and_tokenizer(path)
    from rlbatch.rollout.models import encode_prompt
    prompt_tokens = len(encode_prompt(tok, build_task(cfg.task).eval_set(1)[0]))
    t0 = time.perf_counter()
    spec = BenchSpec(concurrency=tuple(wanted), prompt_tokens=prompt_tokens,
                     new_tokens=cfg.rollout.max_new_tokens, reps=3)
    result = run_decode_bench(str(path), cfg.rollout.engine if cfg.rollout.engine != "vllm"
                              else "builtin", spec)
    chosen = result.get("plateau_concurrency") or cfg.rollout.generation_concurrency
    return {"key": key, "chosen": chosen, "sweep": result, "seconds": time.perf_counter() - t0}


def target_of(cfg: Config) -> Target:
    return Target(cfg.target.metric, cfg.target.value, gain=cfg.target.gain)


def baseline_evidence(base: list[Trial], cfg: Config) -> dict:
    """N* and T of the baseline's runs from their logs: median T, largest N*, and the fewest
    evaluations before a crossing; `problem` when they cannot anchor a comparison."""
    from rlbatch.analysis.crossing import run_result
    from rlbatch.analysis.runs import frames_from_runs
    from rlbatch.core.runlog import read_run

    frames = frames_from_runs([read_run(t.run_dir()) for t in base])
    res = [run_result(frames.run_steps(str(t.run_dir())), frames.run_evals(str(t.run_dir())),
                      target_of(cfg)) for t in base]
    crossed = [r for r in res if not r["censored"]]
    out = {"runs": len(res), "reached": len(crossed), "problem": None}
    if any(r["too_easy"] for r in res):
        first = min(r["first_evaluation_samples"] for r in res if r["too_easy"])
        out["problem"] = (f"target too easy: met by the first evaluation at {first:,.0f} "
                          "samples; raise the target (or target.gain) or evaluate more often")
        return out
    if 2 * len(crossed) <= len(res) and len(crossed) < len(res):
        out["problem"] = (f"the baseline reached the target in only {len(crossed)} of its "
                          f"{len(res)} seeds (raise budget.max_samples or lower the target)")
        return out
    nstars = sorted(r["samples_to_target"] for r in crossed)
    evals = min(r["evaluations_before_target"] for r in crossed)
    out.update(median_time=statistics.median(r["time_to_target"] for r in crossed),
               median_nstar=statistics.median(nstars), max_nstar=nstars[-1],
               evaluations_before_target=evals)
    need = cfg.profile.min_evaluations
    if evals < need:
        # every seed, the earliest-crossing one included, gets `need` evaluations before N*
        out["dense_every"] = max(1, int(nstars[0] // (need + 1)))
    return out


def require_evaluations(ev: dict, cfg: Config) -> None:
    """Refuse a baseline whose N* was resolved by fewer than profile.min_evaluations
    evaluations, naming the cadence that resolves every seed's (`dense_every`)."""
    if ev.get("dense_every") is None:
        return
    every, need = ev["dense_every"], cfg.profile.min_evaluations
    raise UserError(
        f"eval.every_samples: the baseline's N* (median {ev['median_nstar']:,.0f} samples, "
        f"earliest {every * (need + 1):,.0f}) was resolved by only "
        f"{ev['evaluations_before_target']} evaluations (every {cfg.eval.every_samples:,} "
        f"samples); at least {need} are needed (profile.min_evaluations): set "
        f"eval.every_samples <= {every:,} (e.g. --set eval.every_samples={every}) and re-run")


def denser_baseline(cfg: Config, runs: Path, c: int, seeds: list[int], ev: dict,
                    driver: Driver, journal: Journal) -> tuple[list[Trial], dict] | None:
    """When the baseline's N* was resolved by too few evaluations: the same baseline seeds
    again at the cadence that resolves them (`dense_every`, at least one step). Evaluation
    does not touch training (its sampling is keyed apart from the rollouts'), so these runs
    learn exactly as the first ones did and cross where they did, now seen finely. None when
    the first cadence was enough; a UserError when even one evaluation per step is not."""
    if ev.get("dense_every") is None:
        return None
    step = baseline_prompts(cfg) * cfg.batch.samples_per_prompt
    if ev["dense_every"] < step or cfg.eval.every_samples <= step:
        raise UserError(
            f"target.gain: the baseline reached the target within "
            f"{ev['dense_every'] * (cfg.profile.min_evaluations + 1):,.0f} samples, fewer than "
            f"profile.min_evaluations ({cfg.profile.min_evaluations}) evaluations even at one "
            f"per step ({step:,} samples): raise the target")
    every = ev["dense_every"] // step * step
    base = plan_trials(cfg, runs, c, seeds, kinds=("baseline",), baseline_eval_every=every)
    journal.log("baseline_reevaluated", eval_every=every,
                evaluations_before_target=ev["evaluations_before_target"],
                trials=[t.name for t in base])
    driver.run(base)
    return base, baseline_evidence(base, cfg)


def candidate_eval_every(cfg: Config, median_nstar: float) -> int:
    """The candidates' evaluation interval: the configured one, or N*_base divided by
    profile.min_evaluations if smaller."""
    return max(1, min(cfg.eval.every_samples,
                      int(median_nstar // cfg.profile.min_evaluations)))


def challenger(result: dict) -> str | None:
    """The configuration to confirm against the baseline (analysis.selection.challenger)."""
    from rlbatch.analysis.selection import challenger as pick

    entries = result.get("configs", [])
    ref = next((e for e in entries if e["config"] == result["reference"]["config"]), None)
    best = pick(entries, ref) if ref is not None else None
    return best["config"] if best else None


def run_profile(cfg: Config, out: str | Path, executor, *, progress: Progress | None = None,
                poll_s: float = 0.5) -> dict:
    out = Path(out)
    for sub in ("runs", "trials", "logs"):
        (out / sub).mkdir(parents=True, exist_ok=True)
    journal = Journal(out / "journal.jsonl")
    journal.log("profile_started", config=cfg.name)
    prof, runs = cfg.profile, out / "runs"
    p0 = baseline_prompts(cfg)
    b_max = max([p0 * 2] + list(prof.prompts_per_step)) * cfg.batch.samples_per_prompt
    decode = choose_concurrency(cfg, out, journal, b_max)
    c = decode["chosen"]
    seeds = list(range(cfg.seed, cfg.seed + prof.seeds))
    extra = list(range(cfg.seed + prof.seeds, cfg.seed + prof.seeds + prof.confirm_seeds))
    driver = Driver(cfg, out, executor, journal, progress, poll_s)
    # the baseline's confirmation seeds run first: the early stops are then anchored on more
    # than one seed of it (its median T, its largest N*), at no extra cost
    base = plan_trials(cfg, runs, c, seeds + extra, kinds=("baseline",))
    driver.run(base)
    ev = baseline_evidence(base, cfg)
    if ev["problem"]:
        return _finish(cfg, out, driver, decode, None, ev["problem"])
    sparse = []
    if (dense := denser_baseline(cfg, runs, c, seeds + extra, ev, driver, journal)):
        sparse, (base, ev) = base, dense
        require_evaluations(ev, cfg)
    every = candidate_eval_every(cfg, ev["median_nstar"])
    journal.log("baseline_measured", median_time=ev["median_time"],
                max_nstar=ev["max_nstar"], candidate_eval_every=every)
    cands = plan_trials(cfg, runs, c, seeds, kinds=("sqrt", "control"), eval_every=every)
    limit = ev["max_nstar"] * math.exp(prof.margin)
    stopper = ((lambda st: early_stop_reason(st, ev["median_time"], limit))
               if prof.early_stop else None)
    driver.run(cands, stopper)
    decided = [t for t in driver.all if t not in sparse]  # the sparse baseline is superseded
    result = analyze_trials(cfg, out, base[0], decided)
    chosen = challenger(result) if extra else None
    winner = next((t for t in cands if _config_id(result, t) == chosen), None)
    if winner is not None:
        confirm = [t for t in plan_trials(cfg, runs, c, extra, kinds=(winner.kind,),
                                          eval_every=every)
                   if t.prompts_per_step == winner.prompts_per_step]
        journal.log("confirming", challenger=chosen, trials=[t.name for t in confirm])
        driver.run(confirm, stopper)
        result = analyze_trials(cfg, out, base[0], [t for t in driver.all if t not in sparse])
    return _finish(cfg, out, driver, decode, result, result.get("problem"))


def analyze_trials(cfg: Config, out: Path, reference: Trial, trials: list[Trial]) -> dict:
    """The analysis of this profile's own trials: runs that earlier attempts with other
    settings left in the same folder are not part of its decision."""
    dirs = [t.run_dir() for t in trials if (t.run_dir() / "config.yaml").exists()]
    return analyze(dirs, target_of(cfg), reference_run=str(reference.run_dir()),
                   margin=cfg.profile.margin, statistic=cfg.profile.statistic)


def _config_id(result: dict, trial: Trial) -> str | None:
    for entry in result.get("configs", []):
        if any(Path(r["run"]).name == trial.run_id for r in entry.get("runs", [])):
            return entry["config"]
    return None


def _finish(cfg: Config, out: Path, driver: Driver, decode: dict, result: dict | None,
            problem: str | None) -> dict:
    trials = [trial_status(t) for t in driver.all]
    cost = profile_cost(trials, decode, result)
    rec = (result or {}).get("recommendation")
    decision = None
    if rec:
        entry = next(e for e in result["configs"] if e["config"] == rec["config"])
        run_cfg = _read_run_config(entry)
        decision = {"prompts_per_step": run_cfg["batch"]["prompts_per_step"],
                    "samples_per_prompt": run_cfg["batch"]["samples_per_prompt"],
                    "sequences_per_step": rec["sequences_per_step"], "lr": rec["lr"],
                    "generation_concurrency": decode["chosen"], **rec}
    doc = {"config": cfg.name, "target": target_of(cfg).as_dict(),
           "problem": problem, "decision": decision, "decode": decode, "trials": trials,
           "cost": cost, "analysis": result}
    atomic_write_json(out / "profile.json", doc)
    driver.journal.log("profile_finished", decision=None if decision is None else rec["config"])
    return doc


def _read_run_config(entry: dict) -> dict:
    run_dir = Path(entry["runs"][0]["run"])
    return yaml.safe_load((run_dir / "config.yaml").read_text())


def profile_cost(trials: list[dict], decode: dict, result: dict | None) -> dict:
    """Training seconds of every trial (and the decode sweep), as a multiple of one baseline
    run's time to target (the baseline configuration's measured median)."""
    train = sum(read_json(Path(t["run_dir"]) / "summary.json").get("train_s") or 0.0
                for t in trials)
    times = [t["target"]["train_s"] for t in trials
             if t["kind"] == "baseline" and t["target"].get("reached")
             and t["target"].get("train_s") is not None]
    base_t = statistics.median(times) if times else None
    total = train + (decode.get("seconds") or 0.0)
    return {"trial_train_s": train, "decode_sweep_s": decode.get("seconds") or 0.0,
            "total_s": total, "baseline_time_to_target_s": base_t,
            "multiple_of_baseline_time_to_target": total / base_t if base_t else None}
