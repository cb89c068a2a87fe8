"""`rlbatch profile`: the "align, then accelerate" procedure as one resumable command.

Order (DESIGN.md, with the decode sweep moved first so the alignment runs already measure the
full loop at the chosen concurrency and no second pass is needed):
1. decode-concurrency sweep, once per model and length profile (`decode.json`): C = the
   plateau (smallest C within 5% of the best tokens/s) that fits the memory budget;
2. the baseline at (B0, eta0), all seeds;
3. candidates with sqrt-scaled LR and the fixed-LR control at 2 x B0. With early stopping on,
   a candidate is stopped once it has clearly diverged (no crossing by exp(margin) x the
   baseline's largest N*: its N* ratio is then outside the equivalence margin) or once it
   cannot beat the best time so far (its train_s passed the best T without crossing);
4. analysis of all runs (`rlbatch analyze`): verdicts, critical batch, recommendation;
5. confirmation: the winner and the baseline get `confirm_seeds` extra seeds, then the
   analysis is redone;
6. `profile.json`: the decision, its evidence and the profiling cost (all trials' training
   seconds plus the sweep, as a multiple of one baseline run's time to target).

Resumable: the state is the run directories plus `journal.jsonl`. Re-running the same command
skips finished trials (without starting a process) and resumes interrupted ones from their
checkpoints; a killed profile loses at most the steps since each trial's last checkpoint.
"""

from __future__ import annotations

import json
import math
import statistics
import time
from pathlib import Path
from typing import Callable

import yaml

from rlbatch.analysis.analyze import analyze
from rlbatch.analysis.crossing import Target
from rlbatch.core.config import Config
from rlbatch.core.errors import UserError
from rlbatch.core.runlog import _read_json, atomic_write_json, atomic_write_text, read_jsonl
from rlbatch.profile.trials import Trial, baseline_prompts, plan_trials

TERMINAL = ("target_reached", "budget_exhausted", "diverged", "failed")
Progress = Callable[[list[dict]], None]


class Journal:
    def __init__(self, path: Path):
        self.path = path

    def log(self, event: str, **fields) -> None:
        row = {"time": time.strftime("%Y-%m-%dT%H:%M:%S"), "event": event, **fields}
        with open(self.path, "a") as fh:
            fh.write(json.dumps(row) + "\n")
            fh.flush()

    def events(self) -> list[dict]:
        return read_jsonl(self.path)[0]


def _status(trial: Trial) -> dict:
    d = trial.run_dir()
    summary = _read_json(d / "summary.json")
    steps = read_jsonl(d / "steps.jsonl")[0]
    evals = read_jsonl(d / "evals.jsonl")[0]
    last = steps[-1] if steps else {}
    metric = trial.config.target.metric
    return {"trial": trial.name, "kind": trial.kind, "B": trial.sequences_per_step,
            "lr": trial.config.actor_lr, "seed": trial.seed,
            "samples": last.get("samples", 0), "train_s": last.get("train_s", 0.0),
            "metric": evals[-1].get(metric) if evals else None,
            "status": summary.get("status", "pending"), "target": summary.get("target") or {},
            "stop_reason": summary.get("stop_reason"), "run_dir": str(d)}


class Driver:
    """Runs a list of trials on an executor, watching them for progress and early stops."""

    def __init__(self, cfg: Config, out: Path, executor, journal: Journal,
                 progress: Progress | None, poll_s: float = 0.5):
        self.cfg, self.out, self.ex, self.journal = cfg, out, executor, journal
        self.progress = progress or (lambda rows: None)
        self.poll_s = poll_s
        self.all: list[Trial] = []

    def run(self, trials: list[Trial], stopper: Callable[[dict], str | None] | None = None) -> None:
        for t in trials:
            if t not in self.all:
                self.all.append(t)
        pending = []
        for t in trials:
            if _status(t)["status"] in TERMINAL:
                self.journal.log("skipped_finished", trial=t.name, run_dir=str(t.run_dir()))
            else:
                pending.append(t)
        by_name = {t.name: t for t in trials}
        while pending or self.ex.running():
            while pending and self.ex.capacity() > 0:
                self._submit(pending.pop(0))
            for fin in self.ex.poll():
                st = _status(by_name[fin.name])
                self.journal.log("finished", trial=fin.name, returncode=fin.returncode,
                                 status=st["status"], stop_reason=st["stop_reason"])
                if fin.returncode != 0:
                    raise UserError(f"trial {fin.name} failed (exit {fin.returncode}); "
                                    f"see {fin.log}")
            for name in self.ex.running():
                st = _status(by_name[name])
                reason = stopper(st) if stopper else None
                stop = Path(st["run_dir"]) / "STOP"
                if reason and not stop.exists():
                    atomic_write_text(stop, reason)
                    self.journal.log("stop_requested", trial=name, reason=reason)
            self.progress([_status(t) for t in self.all])
            time.sleep(self.poll_s)
        self.progress([_status(t) for t in self.all])

    def _submit(self, t: Trial) -> None:
        cfg_path = self.out / "trials" / f"{t.name}.yaml"
        atomic_write_text(cfg_path, yaml.safe_dump(t.config.resolved_dict(), sort_keys=False))
        log = self.out / "logs" / f"{t.name}.log"
        self.ex.submit(t.name, cfg_path, log)
        self.journal.log("started", trial=t.name, run_dir=str(t.run_dir()))


def _early_stopper(cfg: Config, finished: Callable[[], list[dict]], base_nstar: float):
    limit = base_nstar * math.exp(cfg.profile.margin)

    def stopper(st: dict) -> str | None:
        if st["target"].get("reached"):
            return None
        if st["samples"] >= limit:
            return (f"diverged: no crossing by {st['samples']} samples, beyond "
                    f"exp(margin) x baseline N* = {limit:.0f}")
        times = [f["target"]["train_s"] for f in finished() if f["target"].get("reached")]
        if times and st["train_s"] > min(times):
            return f"cannot win: train_s {st['train_s']:.1f} > best time to target {min(times):.1f}"
        return None
    return stopper


def choose_concurrency(cfg: Config, out: Path, journal: Journal, batch_max: int) -> dict:
    """Decode sweep on the model, cached in decode.json; returns the sweep and chosen C."""
    wanted = sorted(c for c in cfg.profile.concurrency if c <= batch_max) or [batch_max]
    path = out / "decode.json"
    key = {"model": cfg.model, "task": cfg.task.name, "digits": cfg.task.digits,
           "new_tokens": cfg.rollout.max_new_tokens, "concurrency": wanted}
    cached = _read_json(path)
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

    path = resolve_model_path(cfg.model, cfg.task.name, cfg.task.digits)
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


def _target(cfg: Config) -> Target:
    return Target(cfg.target.metric, cfg.target.value)


def _baseline_nstar(trials: list[Trial]) -> float | None:
    values = [_status(t)["target"].get("samples") for t in trials]
    values = [v for v in values if v is not None]
    return max(values) if values else None


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
    seeds = list(range(cfg.seed, cfg.seed + prof.seeds))
    driver = Driver(cfg, out, executor, journal, progress, poll_s)
    base = plan_trials(cfg, runs, decode["chosen"], seeds, kinds=("baseline",))
    driver.run(base)
    nstar = _baseline_nstar(base)
    if nstar is None:
        return _finish(cfg, out, driver, decode, None, "baseline never reached the target")
    cands = plan_trials(cfg, runs, decode["chosen"], seeds, kinds=("sqrt", "control"))
    finished = lambda: [_status(t) for t in driver.all if _status(t)["status"] in TERMINAL]  # noqa: E731
    stopper = _early_stopper(cfg, finished, nstar) if prof.early_stop else None
    driver.run(cands, stopper)
    result = _analyze(cfg, out, base[0])
    rec = result.get("recommendation")
    if prof.confirm_seeds and rec and not rec.get("is_reference"):
        extra = list(range(cfg.seed + prof.seeds, cfg.seed + prof.seeds + prof.confirm_seeds))
        winner = next(t for t in cands if _config_id(result, t) == rec["config"])
        confirm = plan_trials(cfg, runs, decode["chosen"], extra, kinds=("baseline",))
        confirm += [t for t in plan_trials(cfg, runs, decode["chosen"], extra,
                                           kinds=(winner.kind,))
                    if t.prompts_per_step == winner.prompts_per_step]
        driver.run(confirm)
        result = _analyze(cfg, out, base[0])
    return _finish(cfg, out, driver, decode, result, None)


def _analyze(cfg: Config, out: Path, reference: Trial) -> dict:
    return analyze([out / "runs"], _target(cfg), reference_run=str(reference.run_dir()),
                   margin=cfg.profile.margin)


def _config_id(result: dict, trial: Trial) -> str | None:
    for entry in result.get("configs", []):
        if any(Path(r["run"]).name == trial.run_id for r in entry.get("runs", [])):
            return entry["config"]
    return None


def _finish(cfg: Config, out: Path, driver: Driver, decode: dict, result: dict | None,
            problem: str | None) -> dict:
    trials = [_status(t) for t in driver.all]
    cost = _cost(trials, decode, result)
    rec = (result or {}).get("recommendation")
    decision = None
    if rec:
        entry = next(e for e in result["configs"] if e["config"] == rec["config"])
        run_cfg = _read_run_config(entry)
        decision = {"prompts_per_step": run_cfg["batch"]["prompts_per_step"],
                    "samples_per_prompt": run_cfg["batch"]["samples_per_prompt"],
                    "sequences_per_step": rec["sequences_per_step"], "lr": rec["lr"],
                    "generation_concurrency": decode["chosen"], **rec}
    doc = {"config": cfg.name, "target": {"metric": cfg.target.metric, "value": cfg.target.value},
           "problem": problem, "decision": decision, "decode": decode, "trials": trials,
           "cost": cost, "analysis": result}
    atomic_write_json(out / "profile.json", doc)
    driver.journal.log("profile_finished", decision=None if decision is None else rec["config"])
    return doc


def _read_run_config(entry: dict) -> dict:
    run_dir = Path(entry["runs"][0]["run"])
    return yaml.safe_load((run_dir / "config.yaml").read_text())


def _cost(trials: list[dict], decode: dict, result: dict | None) -> dict:
    train = sum(_read_json(Path(t["run_dir"]) / "summary.json").get("train_s") or 0.0
                for t in trials)
    base_t = None
    if result:
        ref = next((e for e in result["configs"] if e["config"] == result["reference"]["config"]),
                   None) if isinstance(result.get("reference"), dict) else None
        base_t = ref and ref.get("time_to_target")
    if base_t is None:
        times = [t["target"].get("train_s") for t in trials
                 if t["kind"] == "baseline" and t["target"].get("reached")]
        base_t = statistics.median(times) if times else None
    total = train + (decode.get("seconds") or 0.0)
    return {"trial_train_s": train, "decode_sweep_s": decode.get("seconds") or 0.0,
            "total_s": total, "baseline_time_to_target_s": base_t,
            "multiple_of_baseline_time_to_target": total / base_t if base_t else None}
