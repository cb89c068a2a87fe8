"""`rlbatch analyze`: samples/time to target, invariance verdicts and the recommendation."""

from __future__ import annotations

import sys
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from rlbatch.analysis.defaults import DEFAULT_BOOT, DEFAULT_CI, DEFAULT_MARGIN
from rlbatch.analysis.figures import short_labels
from rlbatch.cli.common import print_json
from rlbatch.cli.decision_text import decision_lines


def _fmt(x, spec: str = ".4g") -> str:
    return "-" if x is None else format(x, spec)


def _num(x) -> str:
    """Compact number: thousands separators from 1000 up, 4 significant digits below."""
    if x is None:
        return "-"
    return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.4g}"


def _median_cell(e: dict, key: str) -> str:
    """`median [lo-hi]`, or `> lower bound` when the median involves a censored run."""
    if e[key] is None:
        lb = e.get(f"{key}_lower_bound")
        return f"> {_num(lb)}" if lb is not None else "-"
    lo, hi = e[f"{key}_ci"]
    return f"{_num(e[key])} [{_num(lo)}-{'inf' if hi is None else _num(hi)}]"


def _target_text(t: dict) -> str:
    op = ">=" if t["direction"] == "higher" else "<="
    if t.get("gain") is not None:
        thr = t.get("thresholds") or []
        at = f" = {thr[0]:.4g}" if len(thr) == 1 else ""
        return f"{t['metric']} {op} start + {t['gain']:g}{at}"
    return f"{t['metric']} {op} {t['value']:g}"


def render_table(doc: dict) -> Table:
    """Rich table of the analysis document (renders only; every number comes from `doc`).
    Short configuration labels keep it readable at 80 columns; full ids are in --json."""
    labels = short_labels(doc["configs"])
    table = Table(title=f"time to target {_target_text(doc['target'])}: geometric means across seeds "
                        f"[{doc['settings']['ci']:.0%} interval]")
    for col in ("config", "seeds", "N* samples", "T s", "q/s", "verdict"):
        left = col in ("config", "verdict")
        table.add_column(col, justify="left" if left else "right", overflow="fold")
    for e in doc["configs"]:
        table.add_row(labels[e["config"]], str(e["seeds"]),
                      _median_cell(e, "samples_to_target"),
                      _median_cell(e, "time_to_target"), _num(e["throughput"]), e["verdict"])
    return table


def probe_table(doc: dict) -> Table:
    """Predicted (probe) against measured (runs to the target) time to target."""
    from rlbatch.report.text import PROBE_CHECK_HEADER, probe_check_rows

    labels = short_labels(doc["configs"])
    table = Table(title="probe predictions against runs to the target (T in training s)")
    for i, col in enumerate(PROBE_CHECK_HEADER):
        table.add_column(col, justify="left" if i == 0 else "right", overflow="fold")
    for row in probe_check_rows(doc["probe_check"], labels):
        table.add_row(*row)
    return table


def summary_lines(doc: dict) -> list[str]:
    """The plain-text lines printed under the table."""
    cb = doc["critical_batch"]
    labels = short_labels(doc["configs"])
    lines = [f"reference: {labels[doc['reference']['config']]} ({doc['reference']['why']})"]
    crit = cb["critical_batch_departure"]
    note = " (every tested B aligned: a lower bound)" if cb["lower_bound_only"] else ""
    lines.append(f"critical batch (departure sense): {_fmt(crit, 'd')}{note}")
    lines.append(f"B_crit (McCandlish 50%-efficiency fit): {_num(cb['b_crit_mccandlish'])}")
    lines += decision_lines(doc)
    return lines


def analyze(
    paths: Annotated[list[str], typer.Argument(help="run directories or sweep directories")],
    target: str | None = typer.Option(
        None, help="METRIC=VALUE (or METRIC<=VALUE for lower-is-better); default: the runs' "
                   "config target"),
    reference: str | None = typer.Option(None, help="run directory of the reference "
                                                       "configuration (default: B == B0)"),
    margin: float = typer.Option(DEFAULT_MARGIN, show_default=False,
                                 help="margin m on log(N* ratio) [default: log(1.15) = 0.140]"),
    ci: float = typer.Option(DEFAULT_CI, help="level of the two-sided intervals across seeds"),
    bootstrap: int = typer.Option(DEFAULT_BOOT, help="bootstrap resamples of the invariance "
                                  "curves' bands"),
    seed: int = typer.Option(0, help="seed of that bootstrap"),
    statistic: str = typer.Option("crossing", help="a run's N*: crossing (its first crossing "
                                  "of the target) | stretch (a stretch fitted to its rising "
                                  "curve near the target; docs/analysis.md, 'Which "
                                  "statistic')"),
    smooth: int = typer.Option(1, help="trailing mean over this many evaluations (1 = none)"),
    spread: str = typer.Option("pair", help="the run-to-run spread each comparison with "
                               "the reference rests on: pair (the two compared) | pooled "
                               "(over every configuration) | larger (the larger of the two) "
                               "| paired (same-seed log ratios where 3 or more seeds of both "
                               "crossed; docs/analysis.md, 'Per-configuration spread')"),
    alpha: float = typer.Option(0.05, help="one-sided level of the decision (a profile with "
                                "profile.alpha_spending decides its k-th look at "
                                "0.05 / 2^(k+1); its profile.json says which)"),
    probes: str | None = typer.Option(
        None, help="probe profile directory (`rlbatch profile --strategy probe`): set its "
                   "predicted time to target beside the measured one of every configuration "
                   "that these runs took to the target"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON document (last line)"),
) -> None:
    """Samples and time to target per configuration, invariance verdicts vs the reference,
    critical batch (departure sense) and the recommended configuration; with --probes, a
    probe profile's predictions against these measurements."""
    from rlbatch.analysis.analyze import analyze as run_analysis
    from rlbatch.analysis.analyze import config_target
    from rlbatch.analysis.crossing import parse_target
    from rlbatch.analysis.runs import load_runs

    if target is None:
        tgt = config_target(load_runs(list(paths)))
    else:
        tgt = parse_target(target)
    probe_profile = None
    if probes is not None:
        from rlbatch.report.inputs import read_probe_profile
        probe_profile = read_probe_profile(probes)
    doc = run_analysis(list(paths), tgt, reference_run=reference, margin=margin, ci=ci,
                       n_boot=bootstrap, seed=seed, smooth=smooth, statistic=statistic,
                       alpha=alpha, spread=spread)
    if probe_profile is not None:
        from rlbatch.analysis.probe_check import check_predictions
        doc["probe_check"] = check_predictions(doc, *probe_profile)
    for w in doc["warnings"]:
        print(f"warning: {w}", file=sys.stderr)
    if as_json:
        print_json(doc)
        return
    _print_text(doc)


def _print_text(doc: dict) -> None:
    """The analysis as a table and lines (and the probe check, when there is one)."""
    console = Console()
    console.print(render_table(doc))
    for line in summary_lines(doc):
        console.print(line, highlight=False, markup=False)
    if "probe_check" in doc:
        console.print(probe_table(doc))
        from rlbatch.report.text import probe_check_summary

        for line in probe_check_summary(doc["probe_check"]):
            console.print(line, highlight=False, markup=False)




def register(app: typer.Typer) -> None:
    app.command("analyze")(analyze)
