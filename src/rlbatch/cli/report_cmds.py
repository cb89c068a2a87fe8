"""`rlbatch report`: one self-contained HTML (or Markdown) report of a profile or sweep."""

from __future__ import annotations

import sys

import typer

from rlbatch.cli.common import print_json


def report(
    paths: list[str] = typer.Argument(..., help="profile, sweep or run directories"),  # noqa: B008
    output: str = typer.Option("report.html", "-o", "--output", help="report file to write"),
    fmt: str = typer.Option("html", "--format", help="html (one self-contained file) or md "
                                                     "(Markdown + PNG files beside it)"),
    target: str | None = typer.Option(
        None, help="METRIC=VALUE; default: the profile's or the runs' config target"),
    reference: str | None = typer.Option(None, help="run directory of the reference "
                                                       "configuration (default: B == B0)"),
    probes: str | None = typer.Option(
        None, help="probe profile directory: its predicted time to target beside the "
                   "measured one of every configuration these runs took to the target"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON document (last line)"),
) -> None:
    """Report the decision, invariance curves, N* and T against B, the decision rule, the
    decode sweep, phase times, noise scale, the fixed-LR control and every run."""
    from rlbatch.report.build import build_report

    result = build_report(list(paths), output, fmt, target=target, reference=reference,
                          probes=probes)
    for w in result["warnings"]:
        print(f"warning: {w}", file=sys.stderr)
    if as_json:
        print_json(result)
        return
    print(f"wrote {result['report']} ({len(result['figures'])} figures)")
    for key, note in result["omitted"].items():
        print(f"  omitted {key}: {note}")


def register(app: typer.Typer) -> None:
    app.command("report")(report)
