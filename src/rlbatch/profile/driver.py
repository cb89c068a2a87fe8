"""What both profile strategies share: the profile directory and its set-up, the journal, the
driver that runs trials on an executor and asks them to stop, each trial's status, the
decode sweep, the analysis of the profile's own trials and the profiling cost.

`procedure.py` (the grid strategy) and `probing.py` (the probe strategy) are built from these
pieces. A trial is asked to stop through the STOP protocol of `core/runlog.py` (a `STOP` file
in its run directory holding the reason); run statuses and stop codes are the run log's
(`core/runlog.py`, `backends/builtin/runstate.py`). docs/design.md, "Align, then accelerate".
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path

from rlbatch.analysis.analyze import analyze
from rlbatch.analysis.crossing import Target
from rlbatch.backends.command.health import CHECKPOINT_REFUSED, CHECKPOINT_TRIES
from rlbatch.backends.command.procs import exit_words
from rlbatch.core.config import Config
from rlbatch.core.errors import EXIT_DIVERGED, UserError, sanitize
from rlbatch.core.loading import validate_config
from rlbatch.core.ownership import held_by, own
from rlbatch.core.runlog import (
    FINISHED,
    STOP_FILE,
    append_jsonl,
    atomic_write_json,
    atomic_write_text,
    ended_for_good,
    last_jsonl_row,
    make_dir,
    read_json,
    read_jsonl,
    yaml_text,
)
from rlbatch.core.runmatch import find_run_dir, note_text
from rlbatch.profile.trials import Trial, baseline_prompts

Progress = Callable[[list[dict]], None]
Stopper = Callable[[dict], "str | None"]
# processes of one trial in a row that may end without a final status (killed by a signal:
# SIGKILL, the OOM killer) before the trial is counted failed: the limit of a command's
# attempts on one checkpoint, backends/command/health.py CHECKPOINT_TRIES
KILLED_TRIES = CHECKPOINT_TRIES


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
    last = last_jsonl_row(d / "steps.jsonl") or {}
    last_eval = last_jsonl_row(d / "evals.jsonl")
    metric = trial.config.target.metric
    return {"trial": trial.name, "kind": trial.kind, "B": trial.sequences_per_step,
            "lr": trial.config.actor_lr, "seed": trial.seed,
            "staleness": trial.config.rollout.max_staleness,
            "samples": last.get("samples", 0), "train_s": last.get("train_s", 0.0),
            "metric": last_eval.get(metric) if last_eval else None,
            "status": summary.get("status", "pending"), "target": summary.get("target") or {},
            "stop_reason": summary.get("stop_reason"), "stop_code": summary.get("stop_code"),
            "failure": summary.get("failure"), "run_dir": str(d)}


def trial_done(trial: Trial, failed: Collection[str] = ()) -> bool:
    """The one rule for a trial that enters the evidence, the analysis and the decision: its
    own process wrote a final status (core/runlog.py FINISHED), and the driver did not count
    it failed (`failed`, `Driver.failed`). A trial whose process was killed keeps the status
    `running`: nothing wrote its end, and its rows stop for a reason that is not its
    configuration's."""
    return trial.name not in failed and trial_status(trial)["status"] in FINISHED


def killed_by_signal(code: int) -> bool:
    """A return code of a process a signal ended: negative (Python's subprocess), or 128 + N
    (a shell's, a Ray job's)."""
    return code < 0 or 128 < code < 128 + 65


def code_words(code: int) -> str:
    """A trial's return code in words: `killed by SIGKILL`, or `exit N`."""
    return exit_words(code) if code < 0 else f"exit {code}"


def refused_checkpoint(why: str | None) -> bool:
    """Whether a trial's failure is its checkpoint refused (backends/command/health.py
    `bad_checkpoint`): a re-run does not resume such a trial, so none is advised."""
    return f"command: {CHECKPOINT_REFUSED}:" in (why or "")


def resume_advice(why: str | None, trial: Trial, them: str = "them") -> str:
    """What to do about a failed `trial`: re-run the profile (it resumes the trial), unless
    its checkpoint was refused: then remove it, or start the trial over (its config is
    `trials/<name>.yaml` of the profile folder, `Driver._submit`)."""
    if refused_checkpoint(why):
        config = trial.run_dir().parent.parent / "trials" / f"{trial.name}.yaml"
        return ("its checkpoint was refused, so a re-run would not resume it: remove the "
                f"checkpoint the failure names, or start the trial over with `rlbatch train "
                f"{config} --fresh`, then re-run the profile")
    return f"re-run the profile to resume {them}"


def trial_ended(trial: Trial) -> bool:
    """Ended for good. A `stopped` trial whose STOP file was removed is not: its process
    continues it (a probe being extended, profile/probing.py)."""
    return ended_for_good(trial.run_dir(), trial_status(trial)["status"])


class Driver:
    """Runs a list of trials on an executor, watching them for progress and early stops."""

    def __init__(self, cfg: Config, out: Path, executor, journal: Journal,
                 progress: Progress | None, poll_s: float = 0.5):
        self.cfg, self.out, self.ex, self.journal = cfg, out, executor, journal
        self.progress = progress
        self.poll_s = poll_s
        self.all: list[Trial] = []
        self.failed: dict[str, str] = {}  # trial name -> why, for the trials that failed
        self._killed: dict[str, int] = {}  # trial name -> its processes killed in a row
        self._noted: set[str] = set()  # trials whose earlier-release directory was said

    def run(self, trials: list[Trial], stopper: Stopper | None = None,
            admit: Callable[[Trial], bool] | None = None) -> None:
        """Run `trials` to their ends; `stopper` may ask a running one to stop, `admit`
        refuses to start one (a budget spent: journal event `not_started`)."""
        for t in trials:
            if t not in self.all:
                self.all.append(t)
        for t in trials:  # an earlier release's directory of a trial: said once, kept
            note = find_run_dir(t.config.output_dir, t.config.resolved_dict(), t.seed)[1]
            if note is not None and t.name not in self._noted:
                self._noted.add(t.name)
                self.journal.log("earlier_run_dir", trial=t.name, **note)
                print(f"trial {t.name}: {note_text(note)}", file=sys.stderr, flush=True)
        pending = []
        for t in trials:  # a failed trial is not finished: its process resumes it
            if trial_ended(t):
                self.journal.log("skipped_finished", trial=t.name, run_dir=str(t.run_dir()))
            else:
                pending.append(t)
        for t in pending:  # an earlier profile's trial still running: not a failure to resume
            if (holder := held_by(t.run_dir())) is not None:
                raise UserError(f"trial {t.name}: its run directory {t.run_dir()} is in use by "
                                f"{holder}, a trial of an earlier profile that is still "
                                "running: wait for it to end, or stop that process, then "
                                "re-run this profile")
        by_name = {t.name: t for t in trials}
        while pending or self.ex.running():
            while pending and self.ex.capacity() > 0:
                t = pending.pop(0)
                if admit is None or admit(t):
                    self._submit(t)
                else:
                    self.journal.log("not_started", trial=t.name, reason="profile budget spent")
            for fin in self.ex.poll():
                if self._ended(fin, by_name[fin.name]):
                    pending.insert(0, by_name[fin.name])
            for name in self.ex.running():
                st = trial_status(by_name[name])
                reason = stopper(st) if stopper else None
                stop = Path(st["run_dir"]) / STOP_FILE
                if reason and not stop.exists():
                    atomic_write_text(stop, reason)
                    self.journal.log("stop_requested", trial=name, reason=reason)
            self._show()
            if self.poll_s:
                time.sleep(self.poll_s)
        self._show()

    def _show(self) -> None:
        if self.progress is not None:  # statuses are read only for someone to see
            self.progress([trial_status(t) for t in self.all])

    def _ended(self, fin, trial: Trial) -> bool:
        """Judge a trial whose process ended; True when it is to be started again: its
        process was killed by a signal before writing a final status (the summary still
        `running`), fewer than KILLED_TRIES times in a row, so the next `rlbatch train
        --resume` continues it from its checkpoint. Otherwise a trial without a final
        status, or one whose process failed, is counted failed (`_failed`)."""
        st = trial_status(trial)
        code = fin.returncode
        self.journal.log("finished", trial=fin.name, returncode=code, status=st["status"],
                         stop_reason=st["stop_reason"], failure=st["failure"])
        final = st["status"] in FINISHED
        if not final and st["status"] != "failed" and killed_by_signal(code):
            kills = self._killed[fin.name] = self._killed.get(fin.name, 0) + 1
            what = (f"{code_words(code)} without writing a final status (status "
                    f"{st['status']})")
            if kills < KILLED_TRIES:
                self.journal.log("resumed_after_kill", trial=fin.name, returncode=code,
                                 kills=kills)
                print(f"trial {fin.name}: {what}: started again to resume from its "
                      f"checkpoint ({kills} of {KILLED_TRIES} such ends)", file=sys.stderr,
                      flush=True)
                return True
            line = last_line(fin.log)
            self._failed(fin, f"{what}, {kills} times in a row: not started again"
                              + (f"; its last line: {line}" if line else ""))
            return False
        self._killed.pop(fin.name, None)
        diverged = code == EXIT_DIVERGED and st["status"] == "diverged"
        if code != 0 and not diverged:  # a diverged trial is a result
            said = st["failure"] if st["status"] == "failed" else last_error(fin.log)
            self._failed(fin, code_words(code) + (f": {said}" if said else ""))
        elif not final:
            self._failed(fin, f"{code_words(code)}, but its run is not finished (status "
                              f"{st['status']})")
        return False

    def _failed(self, fin, why: str) -> None:
        """A trial that failed is written down and left out; the profile goes on (a re-run
        of the profile resumes it)."""
        self.failed[fin.name] = f"{why}; see {fin.log}"
        self.journal.log("trial_failed", trial=fin.name, reason=self.failed[fin.name])

    def _submit(self, t: Trial) -> None:
        cfg_path = self.out / "trials" / f"{t.name}.yaml"
        atomic_write_text(cfg_path, yaml_text(t.config.resolved_dict()))
        log = self.out / "logs" / f"{t.name}.log"
        self.failed.pop(t.name, None)  # started again: failed only if it fails again
        self.ex.submit(t.name, cfg_path, log)
        self.journal.log("started", trial=t.name, run_dir=str(t.run_dir()))


def last_error(log: Path) -> str | None:
    """The last `error: ...` line of a trial's log (a trial refused before it ran, e.g. its
    run directory owned by a hand-started `rlbatch train`), sanitized; None if there is none."""
    try:
        lines = log.read_text(errors="replace").splitlines()[-50:]
    except OSError:
        return None
    errors = [x for x in lines if x.startswith("error: ")]
    return sanitize(errors[-1][len("error: "):])[:500] if errors else None


def last_line(log: Path) -> str | None:
    """The last line of a trial's log that is not empty, sanitized; None if there is none."""
    try:
        lines = [x for x in log.read_text(errors="replace").splitlines()[-50:] if x.strip()]
    except OSError:
        return None
    return sanitize(lines[-1].strip())[:300] if lines else None


def open_profile_dir(out: str | Path) -> Path:
    """The profile directory with its subfolders, owned by this process for its life
    (core/ownership.py): a second `rlbatch profile` on it is refused in one line, exit 2.
    Each trial's run directory is owned by its own `rlbatch train` process."""
    out = make_dir(out)
    own(out, "profile directory")
    for sub in ("runs", "trials", "logs"):
        make_dir(out / sub)
    return out


@dataclass
class Session:
    """A profile under way: its directory, journal, decode sweep (`chosen` is C) and driver."""

    out: Path
    journal: Journal
    decode: dict
    driver: Driver

    @property
    def concurrency(self) -> int:
        return self.decode["chosen"]


def start_profile(cfg: Config, out: str | Path, executor, progress: Progress | None,
                  poll_s: float, **started) -> Session:
    """Set-up shared by both strategies: own the directory, open the journal (its
    `profile_started` event carries `started`), run or reuse the decode sweep over every
    batch the profile may run, and make the driver."""
    out = open_profile_dir(out)
    journal = Journal(out / "journal.jsonl")
    journal.log("profile_started", config=cfg.name, **started)
    p0 = baseline_prompts(cfg)
    b_max = max([p0 * 2] + list(cfg.profile.prompts_per_step)) * cfg.batch.samples_per_prompt
    for sch in cfg.profile.schedules:  # the largest B a schedule reaches
        b_max = max(b_max, *(b for _, b in sch.steps or ()),
                    sch.adaptive.max_sequences if sch.adaptive else 0)
    decode = choose_concurrency(cfg, out, journal, b_max)
    return Session(out, journal, decode, Driver(cfg, out, executor, journal, progress, poll_s))


def choose_concurrency(cfg: Config, out: Path, journal: Journal, batch_max: int) -> dict:
    """Decode sweep on the model, cached in decode.json; returns the sweep and chosen C. A
    command trial decodes with its framework's own engine, which rlbatch's sweep does not
    measure: C stays rollout.generation_concurrency."""
    wanted = sorted(c for c in cfg.profile.concurrency if c <= batch_max) or [batch_max]
    path = out / "decode.json"
    key = {"model": cfg.model, "task": cfg.task.name, "digits": cfg.task.digits,
           "new_tokens": cfg.rollout.max_new_tokens, "concurrency": wanted}
    cached = read_json(path)
    if cached.get("key") == key:
        return cached
    if cfg.backend == "command":
        from rlbatch.interop.launch import TAKES_CONCURRENCY

        doc = {"key": key, "chosen": cfg.rollout.generation_concurrency, "sweep": None,
               "seconds": 0.0, "framework_decodes": True,
               "passed_to_command": cfg.command.framework in TAKES_CONCURRENCY}
    elif not cfg.profile.concurrency:
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


def analyze_trials(cfg: Config, out: Path, reference: Trial, trials: list[Trial],
                   alpha: float | None = None, failed: Collection[str] = ()) -> dict:
    """The analysis of this profile's own trials: runs that earlier attempts with other
    settings left in the same folder are not part of its decision, nor are failed trials
    (`trial_done`: their rows stop where they failed, for a reason that is not the
    configuration's; `failed` names those the driver counted failed)."""
    dirs = [t.run_dir() for t in trials if (t.run_dir() / "config.yaml").exists()
            and trial_done(t, failed)]
    extra = {} if alpha is None else {"alpha": alpha}
    return analyze(dirs, target_of(cfg), reference_run=str(reference.run_dir()),
                   margin=cfg.profile.margin, statistic=cfg.profile.statistic,
                   spread=cfg.profile.spread, **extra)


def baseline_times(trials: list[dict]) -> list[float]:
    """The times to target of the baseline's runs that reached it and ended (trial status
    rows; a run without a final status is not measured)."""
    return [t["target"]["train_s"] for t in trials
            if t["kind"] == "baseline" and t["status"] in FINISHED and t["target"].get("reached")
            and t["target"].get("train_s") is not None]


def trial_warnings(trials: list[Trial], failed: Collection[str] = ()) -> list[dict]:
    """What changed the rows of the trials that entered the analysis (`trial_done`), one
    {"trial", "warning"} each: the converter's warnings kept in each summary.json's
    `command.warnings` (restarts, rotated or truncated logs, values that are not numbers or
    not finite, rows dropped), which the profile prints beside its decision."""
    out = []
    for t in trials:
        if not trial_done(t, failed):
            continue
        command = read_json(t.run_dir() / "summary.json").get("command") or {}
        out += [{"trial": t.name, "warning": str(w)} for w in command.get("warnings") or []]
    return out


def profile_cost(trials: list[dict], decode: dict, result: dict | None) -> dict:
    """Training seconds of every trial (and the decode sweep), as a multiple of one baseline
    run's time to target (the median of `baseline_times`)."""
    train = sum(read_json(Path(t["run_dir"]) / "summary.json").get("train_s") or 0.0
                for t in trials)
    times = baseline_times(trials)
    base_t = statistics.median(times) if times else None
    total = train + (decode.get("seconds") or 0.0)
    return {"trial_train_s": train, "decode_sweep_s": decode.get("seconds") or 0.0,
            "total_s": total, "baseline_time_to_target_s": base_t,
            "multiple_of_baseline_time_to_target": total / base_t if base_t else None}


def next_sets(doc: dict, strategy: str) -> dict | None:
    """The `--set`s that following a profile's `next` means (the seeds its plan asks for,
    or the probe strategy's larger budget), or None when nothing is asked for: what
    `rlbatch profile --follow` and `rlbatch replay` run next, as the printed command would."""
    d = doc.get("decision") or {}
    if "budget" in d:  # within a budget, the budget's look alone (budget.next_look)
        return dict(d["next_set"]) if d.get("next_set") else None
    if d.get("next_set"):
        return dict(d["next_set"])
    rec = (doc.get("analysis") or {}).get("recommendation") or {}
    if strategy != "probe" and rec.get("next_seeds"):
        return {"profile.seeds": rec["next_seeds"]}
    return None


def with_sets(cfg: Config, sets: dict) -> Config:
    """`cfg` with each dotted key of `sets` set to its value, validated again."""
    data = cfg.model_dump(mode="json")
    for k, v in sets.items():
        node = data
        *path, last = k.split(".")
        for part in path:
            node = node[part]
        node[last] = v
    return validate_config(data)
