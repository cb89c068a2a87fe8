"""`rlbatch bank` and `rlbatch replay`: record every configuration of a profile at many seeds,
then measure what the profile's decisions would have been on those runs."""

from __future__ import annotations

import sys

import typer

from rlbatch.cli.common import PresetOption, SetOption, print_json, resolve, stop_signals
from rlbatch.core.errors import ConfigError
from rlbatch.profile import DEFAULT_BUDGET


def bank(
    config: str | None = typer.Argument(None, help="profile config whose configurations "
                                           "are recorded (the baseline, each candidate, the "
                                           "fixed-LR control)"),
    preset: str | None = PresetOption,
    set_: list[str] | None = SetOption,
    seeds: int = typer.Option(12, help="seeds per configuration (0 .. N-1 after `seed`)"),
    out: str = typer.Option(..., "--out", help="bank directory (run directories and bank.json)"),
    as_json: bool = typer.Option(False, "--json", help="print bank.json as JSON (last line)"),
) -> None:
    """Record a bank: every configuration a profile of CONFIG runs, at --seeds seeds each,
    trained here one run at a time, each run past its crossing until its evaluations have
    settled above the target (or to budget.max_samples). Re-run to resume: finished runs are
    kept. Writes bank.json: each run's N*, T and throughput, with a checksum of those
    figures. `rlbatch replay` then serves these runs to the profile's own code."""
    from rlbatch.profile.bank import record_bank

    if seeds < 1:
        raise ConfigError("--seeds: give a positive number of seeds")
    cfg = resolve(config, preset, set_)
    with stop_signals():
        doc = record_bank(cfg, out, list(range(cfg.seed, cfg.seed + seeds)))
    if as_json:
        print_json(doc)
        return
    crossed = sum(r["time_to_target"] is not None for r in doc["runs"])
    print(f"bank: {out}/bank.json ({len(doc['runs'])} runs, {crossed} reached the target; "
          f"checksum {doc['checksum']})")


def replay(
    config: str = typer.Argument(..., help="profile config, as `rlbatch profile` takes it"),
    bank_dir: str = typer.Argument(..., help="folder of run directories (a bank from `rlbatch "
                                             "bank`, or your own recorded sweep) whose "
                                             "config.yaml match the profile's configurations"),
    set_: list[str] | None = SetOption,
    strategy: str = typer.Option("full", help="full | probe | all"),
    replicates: int = typer.Option(200, help="replicated profiles per strategy"),
    seed: int = typer.Option(0, help="seed of the replicates' draws of bank seeds"),
    follow: int | None = typer.Option(
        None, show_default=False, help="replay `rlbatch profile --follow N`: times a "
        "replicate follows the decision rule's `next` (0: the first look alone). Without "
        "--follow or --budget a replay scores what `rlbatch profile` decides without flags, "
        f"a sequential decision within {DEFAULT_BUDGET} baseline runs"),
    budget: str | None = typer.Option(
        None, "--budget", help="replay `rlbatch profile --budget N` (baseline runs; its "
        "looks follow the budget, not --follow), beside the one-seed grid within the same "
        "budget"),
    sequential: bool = typer.Option(
        False, "--sequential", help="replay `rlbatch profile --budget N --sequential`: the "
        "budget's looks as a decision, the budget its cap"),
    as_json: bool = typer.Option(False, "--json", help="print the scores as JSON (last line)"),
) -> None:
    """What would the profile have decided on these runs, and how often would it have been
    right? Each replicate runs the real profile code (its early stops, confirmations and
    decision) on a random draw of the bank's seeds (the same draw for every configuration,
    so same-seed pairs stay pairs), revealing each run's rows as its clock advances and
    following `next` up to --follow times. Scored against the bank's truth (every seed of
    every configuration): how often the pick is the best or within 5% of it, the mean
    regret, how often it is slower than the baseline, the cost in baseline runs' time to
    target, and how often the interval printed for the pick covers the truth. Two reference
    rows: always keeping the baseline, and one seed of every configuration with the lowest T
    picked. Each cost is also given over the bank's information floor: the least expected
    cost at which any procedure picks within 5% of the best in 90% of profiles and
    recommends a candidate no faster than the baseline in at most 5% (docs/analysis.md,
    "The information floor")."""
    from rlbatch.profile.replay import STRATEGIES
    from rlbatch.profile.replay import replay as run_replay

    if strategy not in (*STRATEGIES, "all"):
        raise ConfigError(f"--strategy: expected full, probe or all, not {strategy!r}")
    if replicates < 1:
        raise ConfigError("--replicates: give a positive number")
    if follow is not None and follow < 0:
        raise ConfigError("--follow: give 0 or more")
    from rlbatch.cli.profile_cmds import resolve_procedure

    cfg, follow, _ = resolve_procedure(config, None, list(set_ or []), budget, sequential,
                                       follow)
    say = (lambda line: print(line, file=sys.stderr, flush=True))
    strategies = list(STRATEGIES) if strategy == "all" else [strategy]
    doc = run_replay(cfg, bank_dir, strategies, replicates, seed=seed, follow=follow, say=say)
    if as_json:
        print_json(doc)
        return
    for line in replay_lines(doc):
        print(line)


def _f(x, spec=".2f") -> str:
    return "-" if x is None else format(x, spec)


def replay_lines(doc: dict) -> list[str]:
    t = doc["truth"]
    lines = [(f"bank: {doc['bank']} ({doc['seeds_in_bank']} seeds of every configuration); "
             f"truth from all of them, T of the baseline {t['baseline_time_to_target_s']:.1f} s:")]
    for c in t["configs"]:
        ci = c["time_ratio_ci"] or [None, None]
        lines.append(f"  {c['config']}: T ratio {_f(c['time_ratio'])} [{_f(ci[0])}, "
                     f"{_f(ci[1])}], {c['crossed']}/{c['seeds']} seeds crossed, {c['verdict']}")
    lines.append(f"  best (not departed): {t['best']}"
                 + ("" if t["fastest"] == t["best"] else
                    f"; fastest of all: {t['fastest']} (T ratio {_f(t['fastest_time_ratio'])}, "
                    "departed)"))
    f = t.get("floor")
    if f:
        lines.append(
            f"  information floor: {f['cost']:.2f}x the baseline's T, the least expected cost "
            f"at which any procedure picks within 5% of the best with probability "
            f"{f['p_within_5pct']:.2f} and recommends a candidate no faster than the baseline "
            f"with probability at most {f['p_false_recommendation']:.2f} (spread of log T "
            f"{f['sd_log_time']:.2f}, pooled over the bank; docs/analysis.md)")
    for p in t["pairing"]:
        if p.get("seed_factor") is not None:
            lines.append(f"  pairs with the baseline, {p['config']}: {p['pairs']} seeds, "
                         f"correlation of log N* {_f(p['corr_log_nstar'])}, of log T "
                         f"{_f(p['corr_log_time'])}; sd of the log T ratio paired "
                         f"{_f(p['sd_paired_log_time_ratio'])}, unpaired "
                         f"{_f(p['sd_unpaired_log_time_ratio'])} (a paired comparison needs "
                         f"{_f(p['seed_factor'])}x the seeds)")
    lines.append("strategy        replicates  recommends  within5%  regret  slower  departed  "
                 "cost(xT)  /floor  coverage")
    for r in doc["strategies"]:
        lines.append(f"{r['strategy']:<15} {r['replicates']:>10}  {r['recommends']:>10.2f}  "
                     f"{r['picks_within_5pct']:>8.2f}  {r['mean_regret']:>6.2f}  "
                     f"{r['slower_than_baseline']:>6.2f}  {r['picks_departed']:>8.2f}  "
                     f"{r['median_cost']:>8.2f}  {_f(r.get('cost_over_floor')):>6}  "
                     f"{_f(r['pick_interval_coverage']):>8}")
        for what, bins in (r.get("calibration") or {}).items():
            lines.append(f"  {r['strategy']} {what.replace('_', ' ')}, printed against "
                         "replayed: " + "; ".join(
                             f"{b['mean_printed']:.2f} vs {b['frequency']:.2f} "
                             f"({b['replicates']})" for b in bins))
    return lines


def register(app: typer.Typer) -> None:
    app.command("bank")(bank)
    app.command("replay")(replay)
