"""`rlbatch profile`: find the configuration with the lowest time to target, with evidence."""

from __future__ import annotations

import contextlib
import math
import shlex
import sys

import typer
from rich.console import Console
from rich.live import Live
from rich.table import Table

from rlbatch.cli import common
from rlbatch.cli.common import (
    PresetOption,
    SetOption,
    print_json,
    resolve,
    stop_signals,
    whole_numbers,
)
from rlbatch.cli.decision_text import decision_lines
from rlbatch.profile import DEFAULT_BUDGET, DEFAULT_FOLLOW, default_sets

DEFAULT_LINE = (f"profile: a sequential decision within {DEFAULT_BUDGET} baseline runs' time to "
                "target, the default (--budget N for another cap, --follow 0 for the first look "
                "alone; docs/guide.md, section 5)")

err = Console(stderr=True)


def _table(rows: list[dict], metric: str) -> Table:
    t = Table(title="rlbatch profile")
    for col in ("trial", "B", "lr", "samples", metric, "status"):
        t.add_column(col, justify="right" if col not in ("trial", "status") else "left")
    for r in rows:
        status = r["status"] + (f" ({r['stop_code']})" if r.get("stop_code") else "")
        m = r["metric"]
        t.add_row(r["trial"], str(r["B"]), f"{r['lr']:.3g}", f"{r['samples']:,}",
                  "-" if m is None else f"{m:.3f}", status)
    return t


def _plain_progress(metric: str):
    """A progress function for a profile without a terminal: one line on stderr, flushed,
    when a trial starts running and when it ends (its status, samples, training seconds and
    last `metric`), so a log file shows the profile as it goes."""
    seen: dict[str, str] = {}

    def show(rows: list[dict]) -> None:
        for r in rows:
            status = r["status"]
            if status == "pending" or seen.get(r["trial"]) == status:
                continue
            seen[r["trial"]] = status
            m = r["metric"]
            stop = f" ({r['stop_code']})" if r.get("stop_code") else ""
            stale = f", staleness {r['staleness']}" if r.get("staleness") else ""
            print(f"trial {r['trial']} (B={r['B']}, lr {r['lr']:.3g}{stale}): {status}{stop}, "
                  f"{r['samples']:,} samples, {r['train_s']:,.1f} s, {metric} "
                  f"{'-' if m is None else f'{m:.3f}'}", file=sys.stderr, flush=True)

    return show


TRIAL_GPUS_HELP = ("ray, ray-job: GPUs a trial asks for (ray-job: its entrypoint's; 0 for verl "
                   "and OpenRLHF, whose drivers ask Ray for their actors' own)")


FollowOption = typer.Option(
    None, "--follow", min=0, max=10, show_default=False,
    help="the decision rule's looks instead of the default sequential decision: when the "
    "decision asks for more seeds (its `next`), run them in the same folder and decide "
    "again, up to this many times (0: the first look alone; each look is a fresh test at the "
    "family's 5%: docs/analysis.md, 'Replays')")


BudgetOption = typer.Option(
    None, "--budget", help="the most the profile may spend: N baseline runs' time to target "
    "(e.g. 4), or training time (3600s, 90m, 2h). Its first look is one seed of each "
    "configuration; it then adds seeds to the baseline and the likeliest fastest (once that "
    "one is sure to be faster, to it and its likeliest rival) while the budget pays, and "
    "prints a pick with P(slower than the baseline) (docs/analysis.md, 'A budget'); with "
    "--sequential the pick is a decision at 5%. Without --budget or --follow: --budget "
    f"{DEFAULT_BUDGET} --sequential, the default decision")

StrategyOption = typer.Option(
    None, help="full (every candidate towards the target) | probe (short probes, predicted "
    "time to target, only the predicted winner run to the target)")

SequentialOption = typer.Option(
    False, "--sequential", help="with --budget as its cap, the pick is a decision: a "
    "candidate only once it is at most 5% likely slower than the baseline, else the "
    "baseline; it stops as soon as it can (profile.sequential; the default decision at "
    "another cap; docs/analysis.md, 'The default decision'); without --budget, the default "
    f"cap {DEFAULT_BUDGET}")


def resolve_procedure(config: str | None, preset: str | None, overrides: list[str],
                      budget: str | None, sequential: bool, follow: int | None
                      ) -> tuple[object, int, bool]:
    """(the config, the looks to follow, whether the default decision stands): the user's
    overrides and flags, and where they name no procedure (`--follow`, a budget, the probe
    strategy) the default decision's sets before them (profile.default_sets; the user's
    own `--set`s win)."""
    flags = budget_overrides(budget)
    cfg = resolve(config, preset, overrides + flags)
    sets = default_sets(cfg.profile, follow)
    seq = budget_overrides(None, sequential)  # after the defaults: --sequential alone is
    # valid only once they give it a cap
    if sets or seq:
        cfg = resolve(config, preset, sets + overrides + flags + seq)
    return cfg, DEFAULT_FOLLOW if follow is None else follow, bool(sets)


def budget_overrides(text: str | None, sequential: bool = False) -> list[str]:
    """The `--set`s `--budget` and `--sequential` stand for (profile.budget or
    profile.budget_seconds; profile.sequential)."""
    from rlbatch.profile.budget import parse_budget

    seq = ["profile.sequential=true"] if sequential else []
    if text is None:
        return seq
    runs, seconds = parse_budget(text)
    return seq + ([f"profile.budget={runs}"] if runs is not None else [
        f"profile.budget_seconds={seconds}"])


def profile(
    ctx: typer.Context,
    config: str | None = typer.Argument(None, help="YAML config naming the baseline "
                                           "(optimizer.reference_sequences and _lr), the "
                                           "target and the profile section (or --preset)"),
    preset: str | None = PresetOption,
    set_: list[str] | None = SetOption,
    batches: str | None = typer.Option(None, help="candidate prompt batches P, e.g. 8,32,64"),
    seeds: int | None = typer.Option(None, help="seeds per configuration"),
    concurrency: str | None = typer.Option(None, help="decode sweep values of C"),
    budget_train_s: float | None = typer.Option(None, help="training-seconds cap per trial"),
    backend: str | None = typer.Option(
        None, help="trainer for the trials: builtin | trl | command (your own verl, OpenRLHF, "
        "prime-rl or `trl grpo` command, from the config's command: section)"),
    executor: str = typer.Option(
        "local", help="where trials run: local (processes here) | ray (Ray tasks, for "
        "builtin/trl trials) | ray-job (jobs on an existing Ray cluster, for commands that "
        "start Ray themselves: verl, OpenRLHF)"),
    address: str | None = typer.Option(
        None, help="ray: the cluster address (e.g. auto); ray-job: the dashboard's address "
        "(e.g. http://127.0.0.1:8265; default $RAY_ADDRESS)"),
    trial_cpus: float = typer.Option(1.0, help="ray, ray-job: CPUs a trial asks for"),
    trial_gpus: float = typer.Option(0.0, help=TRIAL_GPUS_HELP),
    workers: int | None = typer.Option(None, help="trials at once (default: profile.workers)"),
    strategy: str | None = StrategyOption,
    out: str | None = typer.Option(None, "--out", help="profile directory"),
    follow: int | None = FollowOption,
    budget: str | None = BudgetOption,
    sequential: bool = SequentialOption,
    as_json: bool = typer.Option(False, "--json", help="print profile.json's decision as JSON"),
) -> None:
    """Find the configuration with the lowest time to target: the baseline, sqrt-scaled
    candidates and a fixed-LR control, alignment checks on the samples axis with early
    stopping (or, with --strategy probe, short probes and predicted times), a
    decode-concurrency sweep, the fastest aligned configuration. Without --follow or
    --budget: the default decision (docs/guide.md, section 5). Re-run to resume after a kill.

    Trials run the built-in trainer, or your own training command (backend: command, with a
    command: section for verl, OpenRLHF, prime-rl, `trl grpo` or `rlbatch train`): each
    trial's batch, scaled LR, seed, cadences and resume flags are appended, its log is
    followed, it is stopped early the framework's way. Walk-throughs: docs/integrations.md."""
    from rlbatch.profile import executors

    overrides = list(set_ or []) + _flag_overrides(
        batches=batches, concurrency=concurrency, seeds=seeds, workers=workers,
        backend=backend, strategy=strategy, budget_train_s=budget_train_s)
    _require_config(ctx, config, preset)
    cfg, follow, default = resolve_procedure(config, preset, overrides, budget, sequential,
                                             follow)
    _check_before_writing(cfg, executor, trial_gpus)
    out_dir = _open_dir(cfg, out, default and not as_json)
    doc = _looks(cfg, out_dir, follow, as_json, lambda workers: executors.make_executor(
        executor, workers, address, trial_cpus, trial_gpus))
    _print_decision(doc, out_dir, as_json)
    if baseline_failed(doc):
        err.print(f"error: no decision: {doc['problem']}", markup=False, highlight=False,
                  soft_wrap=True)
        raise typer.Exit(2)


def _open_dir(cfg, out: str | None, say_default: bool) -> str:
    """The profile's folder, owned before the live table (a second profile is one line);
    the line that says the default decision runs."""
    from rlbatch.profile import driver

    out_dir = out or f"profiles/{cfg.name}"
    driver.open_profile_dir(out_dir)
    if say_default:
        print(DEFAULT_LINE, file=sys.stderr, flush=True)
    return out_dir


def _require_config(ctx: typer.Context, config: str | None, preset: str | None) -> None:
    """A profile trains for minutes: never started by a bare `rlbatch profile`. Its usage and
    one error line, exit 2."""
    if config is None and preset is None:
        print(ctx.get_usage(), file=sys.stderr)
        print("error: give a config file, or --preset NAME (`rlbatch config presets` lists "
              "them; `--preset quick` is the demo's); `rlbatch profile --help` says more",
              file=sys.stderr)
        raise typer.Exit(2)


def _looks(cfg, out_dir: str, follow: int, as_json: bool, make_executor) -> dict:
    """The profile, and while its decision asks for more seeds (`next`), up to `follow`
    more looks in the same folder with those seeds, each look's decision printed (but the
    last, which the caller prints). Returns the last look's document."""
    from rlbatch.profile import budget, driver, probing, procedure

    run = probing.run_probe_profile if cfg.profile.strategy == "probe" else procedure.run_profile
    follow = budget.follows(cfg.profile, follow)
    for look in range(follow + 1):
        doc = _run_live(run, cfg, out_dir, make_executor(cfg.profile.workers))
        sets = driver.next_sets(doc, cfg.profile.strategy)
        if sets is None or look == follow or baseline_failed(doc):
            return doc
        if not as_json:
            _print_decision(doc, out_dir, False, continuing=True)
            at_most = ("within the budget" if budget.budgeted(cfg.profile)
                       else f"of at most {follow + 1}")
            print(f"following next (look {look + 2} {at_most}): "
                  + " ".join(f"{k}={v}" for k, v in sets.items()), flush=True)
        cfg = driver.with_sets(cfg, sets)
    return doc


def _check_before_writing(cfg, executor: str, trial_gpus: float) -> None:
    """What the trials would refuse, refused once before anything is written: GPUs a Ray
    job cannot pass on, and for local command trials what each trial's `rlbatch train`
    checks of its command (a trial on a Ray cluster runs where the program may be installed
    instead)."""
    from rlbatch.profile import executors

    executors.check_trial_gpus(executor, trial_gpus, cfg)
    if cfg.backend != "command":
        return
    from rlbatch.backends.command.preflight import check_command, check_framework_files
    from rlbatch.profile.trials import profile_prompts

    if executor == "local":
        check_command(cfg, profile_prompts(cfg))
    else:  # the framework's files, where they are seen here
        check_framework_files(cfg, cfg.command.workdir or ".", profile_prompts(cfg))


def baseline_failed(doc: dict) -> bool:
    """No decision because a baseline trial failed (its status `failed`, or counted failed
    by the driver: `failed_trials`, a trial killed without a final status included): the
    profile then exits 2 (its trials' reasons are in `failed_trials`)."""
    failed = doc.get("failed_trials") or {}
    base = [t for t in doc.get("trials") or [] if t.get("kind") == "baseline"]
    return doc.get("decision") is None and any(
        t.get("status") == "failed" or t.get("trial") in failed for t in base)


def _run_live(run, cfg, out_dir: str, ex) -> dict:
    """The profile under a live table on a terminal, and otherwise (stderr to a file or a
    pipe) a plain line per trial as it starts and as it ends. SIGTERM or SIGHUP end it as
    Ctrl-C does, and its trials still running are stopped (each writes down its end), not
    left orphaned."""
    if not err.is_terminal:
        with contextlib.ExitStack() as stack:
            stack.enter_context(stop_signals())
            stack.callback(ex.shutdown)
            return run(cfg, out_dir, ex, progress=_plain_progress(cfg.target.metric))
    try:
        with stop_signals(), Live(_table([], cfg.target.metric), console=err,
                                  refresh_per_second=2) as live:
            return run(cfg, out_dir, ex,
                       progress=lambda rows: live.update(_table(rows, cfg.target.metric)))
    except BaseException:
        err.print()  # the error line goes below the live table, not glued to its last line
        raise
    finally:
        ex.shutdown()


def _flag_overrides(*, batches, concurrency, seeds, workers, backend, strategy,
                    budget_train_s) -> list[str]:
    """The `--set`s that `profile`'s own flags stand for (those given)."""
    out = []
    if batches:
        out.append(f"profile.prompts_per_step={whole_numbers(batches, '--batches')}")
    if concurrency:
        out.append(f"profile.concurrency={whole_numbers(concurrency, '--concurrency')}")
    for key, value in (("profile.seeds", seeds), ("profile.workers", workers),
                       ("backend", backend), ("profile.strategy", strategy),
                       ("budget.max_train_s", budget_train_s)):
        if value is not None:
            out.append(f"{key}={value}")
    return out


def continue_command(argv: list[str], out_dir: str, seeds: int | None = None,
                     sets: dict | None = None, budget: str | None = None) -> str:
    """The command that continues this profile folder with the same settings: `argv` (the
    arguments after `rlbatch`) with `--out` made explicit, `--seeds` replaced by `seeds`,
    `--budget` by `budget`, and a `--set KEY=VALUE` for each of `sets` (after the user's,
    so it wins)."""
    args, i = [], 0
    drop_value = {"--seeds", "--out"} | ({"--budget"} if budget is not None else set())
    while i < len(argv):
        a = argv[i]
        if a in drop_value:
            i += 2
            continue
        if a.split("=", 1)[0] in drop_value:
            i += 1
            continue
        args.append(a)
        i += 1
    if seeds is not None:
        args += ["--seeds", str(seeds)]
    if budget is not None:
        args += ["--budget", budget]
    for k, v in (sets or {}).items():
        args += ["--set", f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}"]
    args += ["--out", out_dir]
    return shlex.join(["rlbatch", *args])


def _next_command(doc: dict, out_dir: str) -> str | None:
    d = doc.get("decision") or {}
    b = d.get("budget")
    if b and not d.get("next_set"):  # within a budget only the budget's look is followed
        if not b.get("next_look_budget_s"):
            return None
        more = (f"{math.ceil(b['next_look_budget_s'])}s" if b["budget_seconds"] is not None
                else f"{math.ceil(b['next_look_budget_runs'] * 10) / 10:g}")
        own = ["--sequential"] if b.get("sequential") and "--sequential" not in common.INVOKED \
            else []  # a default decision continued under a --budget is still sequential
        return continue_command(common.INVOKED + own, out_dir, budget=more)
    if d.get("next_set") and set(d["next_set"]) == {"profile.seeds"}:
        return continue_command(common.INVOKED, out_dir, seeds=d["next_set"]["profile.seeds"])
    if d.get("next_set"):
        return continue_command(common.INVOKED, out_dir, sets=d["next_set"])
    rec = (doc.get("analysis") or {}).get("recommendation") or {}
    if doc.get("strategy") != "probe" and rec.get("next_seeds"):
        return continue_command(common.INVOKED, out_dir, seeds=rec["next_seeds"])
    return None


def _print_decision(doc: dict, out_dir: str, as_json: bool, continuing: bool = False) -> None:
    """The decision in words (or as JSON); `continuing`: a look that --follow follows, so
    the command that would continue it is not printed."""
    from rlbatch.profile.driver import refused_checkpoint

    d, cost = doc["decision"], doc["cost"]
    command = _next_command(doc, out_dir)
    if as_json:
        print_json({"profile_dir": out_dir, "decision": d, "cost": cost, "problem": doc["problem"],
                    "failed_trials": doc.get("failed_trials") or {},
                    "trial_warnings": doc.get("trial_warnings") or [], "next_command": command})
        return
    print(f"profile: {out_dir}/profile.json")
    for line in _decision_text(doc):
        print(line)
    for line in warning_lines(doc.get("trial_warnings") or []):
        print(line)
    m = cost.get("multiple_of_baseline_time_to_target")
    grid = cost.get("fraction_of_grid")
    print(f"profiling cost: {cost['total_s']:.1f} training seconds"
          + (f" = {m:.2f}x one baseline run's time to target" if m else "")
          + (f" ({grid:.0%} of the exhaustive grid's estimate)" if grid else ""))
    failed = doc.get("failed_trials") or {}
    for name, why in failed.items():
        print(f"trial {name} failed and is left out of the decision: {why}")
        if refused_checkpoint(why):  # a re-run would be refused the same way
            print(f"trial {name}: its checkpoint was refused, so re-running does not resume it: "
                  "remove the checkpoint its line names, or start it over with `rlbatch train "
                  f"{out_dir}/trials/{name}.yaml --fresh`, then re-run the profile")
    if any(not refused_checkpoint(why) for why in failed.values()):
        print("re-running the same command resumes the failed trials (finished ones are kept)")
    if continuing:
        return
    follow = (d or {}).get("follow_up")
    if follow:
        follow = {**follow, "configs": _labels(doc, follow["configs"])}
    if command and follow and (d.get("budget") or {}).get("baseline_rests"):
        print(f"the follow-up brings {' and '.join(follow['configs'])} to {follow['seeds']} "
              "seeds, and the baseline rests: the pick is sure enough to be faster than it, "
              "and whether it is within 5% of the fastest is open")
    elif command and follow:
        print(f"the follow-up runs {follow['seeds']} seeds of the baseline and of "
              f"{', '.join(follow['configs'])} only, the challenger: the open candidate with "
              "the lowest point T (profile.follow_up: challenger)")
    if command:
        print(f"to continue this profile (finished trials are kept): {command}")


def _decision_text(doc: dict) -> list[str]:
    """The decision's lines. Within a budget the budget's lines follow the decision rule's;
    a sequential decision's pick is the decision, so its lines come first as `decision:`,
    and the rule's own verdict (a test at each look, which does not pick here) follows,
    named as such."""
    from rlbatch.profile.budget import lines as budget_lines

    d = doc["decision"]
    b = (d or {}).get("budget")
    if doc.get("strategy") == "probe" and d is not None:
        rule = [probe_decision_line(d)]
    elif doc["analysis"] is None:
        rule = [f"decision: none ({doc['problem']})"]
    else:
        decode = doc["decode"]
        c = decode["chosen"] if decode.get("passed_to_command", True) else None
        rule = decision_lines(doc["analysis"], c)
    if not b:
        return rule
    if not b.get("sequential"):
        return rule + budget_lines(b)
    first, *rest = budget_lines(b)
    if rule and rule[0].startswith("decision: "):
        rule = ["the decision rule's own test of these runs (at 5% per look; it does not "
                "pick in a sequential decision): " + rule[0][len("decision: "):], *rule[1:]]
    return ["decision: " + first, *rest, *rule]


def _labels(doc: dict, configs: list[str]) -> list[str]:
    """The decision's short labels (`B512 lr0.0002`) of these configuration ids, where the
    analysis names them; the ids otherwise."""
    from rlbatch.analysis.labels import short_labels

    known = short_labels((doc.get("analysis") or {}).get("configs") or [])
    return [known.get(c, c) for c in configs]


WARNINGS_SHOWN = 10  # trial warnings printed beside the decision; the rest are counted


def warning_lines(warned: list[dict]) -> list[str]:
    """One `warning:` line per warning that changed the rows of a trial in the analysis
    (profile.json `trial_warnings`), with the trial's name; past WARNINGS_SHOWN, a count."""
    lines = [f"warning: trial {w['trial']}: {w['warning']}" for w in warned[:WARNINGS_SHOWN]]
    if len(warned) > WARNINGS_SHOWN:
        lines.append(f"warning: +{len(warned) - WARNINGS_SHOWN} more (profile.json "
                     "trial_warnings)")
    return lines


def probe_decision_line(d: dict) -> str:
    """One line: what the probe strategy chose and what it rests on."""
    # a pick from probes and one seed to the target against the baseline's is an
    # indication, never a verdict: it names what to try
    what = (f"keep the baseline B={d['sequences_per_step']} lr {d['lr']:.3g}"
            if d["is_reference"] else
            f"try B={d['sequences_per_step']} lr {d['lr']:.3g} (indicated by one seed to the "
            "target; --strategy full with 2 or more seeds shows whether it is faster)")
    ratio = d.get("predicted_time_ratio")
    ci = d.get("predicted_time_ratio_ci") or [None, None]
    whose = f" of {d['unconfirmed']}" if d.get("unconfirmed") else ""
    pred = (f"; predicted T/T_base{whose} {ratio:.2f} [{ci[0]:.2f}, {ci[1]:.2f}]"
            if ratio is not None and None not in ci else "")
    line = f"decision: {what} ({d['outcome']}, evidence: {d['evidence']}{pred})"
    return line + (f"\nnext: {d['next']}" if d.get("next") else "")


def register(app: typer.Typer) -> None:
    app.command("profile")(profile)
