"""`rlbatch train`: one GRPO/PPO run with the built-in trainer (or TRL's GRPOTrainer with
`backend: trl`, or the user's own training command with `backend: command`), live progress,
final summary."""

from __future__ import annotations

import contextlib
import math
import os
import sys
import time

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from rlbatch.cli.common import PresetOption, SetOption, print_json, resolve, stop_signals
from rlbatch.core.errors import EXIT_DIVERGED, EXIT_FAILED

err = Console(stderr=True)


# the progress line's phase shares: label -> the time/* keys it sums
_SHARES = (("rollout", ("rollout",)), ("reward", ("reward",)), ("actor", ("actor_update",)),
           ("critic", ("critic_values", "critic_update")),
           ("other", ("reference", "noise_scale", "other")))


def _split(row: dict) -> str:
    """Each phase's share of the step's wall time (`train_s` of the step), e.g. `rollout 80%`."""
    parts = {label: sum(row.get(f"time/{k}") or 0.0 for k in keys) for label, keys in _SHARES}
    total = sum(parts.values()) or 1.0
    return " ".join(f"{label} {100 * t / total:.0f}%" for label, t in parts.items() if t)


def train(
    config: str | None = typer.Argument(None, help="YAML config file"),
    preset: str | None = PresetOption,
    set_: list[str] | None = SetOption,
    out: str | None = typer.Option(None, "--out", help="output directory (config output_dir)"),
    resume: bool = typer.Option(False, "--resume", help="continue an interrupted run exactly"),
    fresh: bool = typer.Option(False, "--fresh", help="discard an existing run directory"),
    as_json: bool = typer.Option(False, "--json", help="print the summary as JSON"),
) -> None:
    """Train with the built-in GRPO/PPO trainer (or TRL with backend=trl, or your own
    verl / OpenRLHF / prime-rl / trl command with backend=command, followed through its log:
    docs/integrations.md) and write a run log."""
    from rlbatch.backends.builtin.trainer import Trainer

    overrides = list(set_ or []) + ([f"output_dir={out}"] if out else [])
    if config is None and preset is None:
        preset = "grpo-tiny"
    cfg = resolve(config, preset, overrides)
    with stop_signals():  # from here on, a signal is written down as the run's end
        if cfg.backend == "trl":  # TRL's GRPOTrainer; same .cb / .run() / .state surface
            from rlbatch.backends.trl.run import TRLRun

            trainer = TRLRun(cfg, resume=resume, fresh=fresh, build_progress=_build_printer())
        elif cfg.backend == "command":  # the user's own command, followed through its log
            from rlbatch.backends.command.procs import become_subreaper
            from rlbatch.backends.command.run import CommandRun
            from rlbatch.cli import common

            if common.WHOLE_PROCESS:  # descendants that leave the command's group stay ours
                become_subreaper()
            trainer = CommandRun(cfg, resume=resume, fresh=fresh)
        else:
            trainer = Trainer(cfg, resume=resume, fresh=fresh, build_progress=_build_printer())
        with _progress(cfg) as show:
            state: dict = {"eval": None, "row": None}

            def on_event(kind: str, row: dict) -> None:
                if kind == "eval":  # the evaluation of the step last reported: show it with it
                    value = row.get(cfg.target.metric)  # NaN: not measured, shown as '-'
                    state["eval"] = value if value is None or math.isfinite(value) else None
                    if state["row"] is None or state["row"]["step"] != row["step"]:
                        show(row["samples"], None)
                        return
                    row = state["row"]
                state["row"] = row
                ev = state["eval"]
                reward = row.get("reward/mean")  # null in a followed command's row: '-'
                reward = "-" if reward is None else f"{reward:.3f}"
                show(row["samples"], f"step {row['step']} reward {reward} "
                                     f"{cfg.target.metric} {'-' if ev is None else f'{ev:.3f}'}"
                                     f" | {_split(row)}")

            trainer.cb = on_event
            summary = trainer.run()
    run_dir = trainer.state.dir
    if as_json:
        print_json({"run_dir": str(run_dir), **summary})
    else:
        _print_summary(run_dir, summary)
    _exit_for(summary)


def _exit_for(summary: dict) -> None:
    """Exit status 0 only for a run that reached a final status (target_reached,
    budget_exhausted, stopped); `diverged` exits with EXIT_DIVERGED, anything else (a failed
    run's summary, which run() does not return but a finished one could hold) EXIT_FAILED."""
    status = summary.get("status")
    if status in ("target_reached", "budget_exhausted", "stopped"):
        return
    if status == "diverged":
        reason = summary.get("stop_reason") or ""
        print(f"error: the run {reason}" if reason.startswith("diverged: ") else
              f"error: the run diverged ({summary.get('nonfinite_skipped')} non-finite "
              "updates skipped; nonfinite.max_consecutive reached)", file=sys.stderr)
        raise typer.Exit(EXIT_DIVERGED)
    print(f"error: the run ended {status}: {summary.get('failure') or 'no reason recorded'}",
          file=sys.stderr)
    raise typer.Exit(EXIT_FAILED)


def _print_summary(run_dir, summary: dict) -> None:
    t = summary["target"]
    crossing = (f"reached at {t['samples']:,} samples, {t['train_s']:.1f} s" if t["reached"]
                else "not reached")
    last = (summary.get("last_eval") or {}).get(t["metric"])
    print(f"run: {run_dir}\nstatus: {summary['status']}  steps: {summary['steps']}  "
          f"samples: {summary['samples']:,}  train_s: {summary['train_s']:.1f}  "
          f"throughput: {summary['throughput'] or 0:.0f} samples/s\n"
          f"target {t['metric']} >= {_threshold(t)}: {crossing}; last {t['metric']}: "
          f"{'-' if last is None else f'{last:.4g}'}")


@contextlib.contextmanager
def _progress(cfg):
    """A function show(samples, info) that reports progress: a live bar on a terminal, and
    otherwise (stderr redirected to a file or a pipe) a plain line at most every
    $RLBATCH_PROGRESS_EVERY_S seconds (default 10) with samples, rate and ETA, and a last one
    when the run ends."""
    total = cfg.budget.max_samples
    if err.is_terminal:
        with Progress(TextColumn("[bold]{task.description}"), BarColumn(),
                      TextColumn("{task.completed:,.0f}/{task.total:,.0f} samples"),
                      TimeElapsedColumn(), TextColumn("{task.fields[info]}"), console=err,
                      transient=False) as bar:
            task = bar.add_task(cfg.name, total=total, info="")
            yield lambda samples, info: bar.update(
                task, completed=samples, **({} if info is None else {"info": info}))
        return
    every = float(os.environ.get("RLBATCH_PROGRESS_EVERY_S", "10"))
    t0 = time.monotonic()
    last = {"at": -math.inf, "line": None}

    def line(samples: int, info: str | None) -> str:
        dt = time.monotonic() - t0
        rate = samples / dt if dt > 0 else 0.0
        eta = f"{(total - samples) / rate:,.0f} s" if rate > 0 else "?"
        return (f"{cfg.name}: {samples:,}/{total:,} samples, {info or ''}, "
                f"{rate:,.0f} samples/s, {dt:,.0f} s elapsed, {eta} to the budget")

    def show(samples: int, info: str | None) -> None:
        last["line"] = (samples, info if info is not None else (last["line"] or (0, ""))[1])
        if time.monotonic() - last["at"] >= every:
            last["at"] = time.monotonic()
            print(line(*last["line"]), file=sys.stderr, flush=True)

    try:
        yield show
    finally:
        if last["line"] is not None:
            print(line(*last["line"]), file=sys.stderr, flush=True)


def _threshold(t: dict) -> str:
    if t.get("gain") is None:
        return f"{t['value']}"
    thr = t.get("threshold")
    return f"start + {t['gain']}" + ("" if thr is None else f" = {thr:.4g}")


def _build_printer():
    def progress(step: int, loss: float, acc: float | None) -> None:
        if acc is not None:
            err.print(f"  building tiny model: SFT step {step}, loss {loss:.3f}, "
                      f"held-out accuracy {acc:.3f}")
    return progress


def register(app: typer.Typer) -> None:
    app.command("train")(train)
