"""`rlbatch report`: inputs -> figure data (analysis/figures.py) -> pictures and page.

`build_report` reads the inputs (report/inputs.py), asks the analysis layer for every
figure's data, draws the figures that have data (report/plots.py) and writes one HTML file
(figures embedded) or one Markdown file with `<stem>-<figure>.png` files beside it. Files
are written atomically. Returns a JSON-ready summary of what was written and omitted.
"""

from __future__ import annotations

from pathlib import Path

from rlbatch.analysis.figures import report_data
from rlbatch.analysis.probe_check import check_predictions
from rlbatch.core.errors import UserError
from rlbatch.core.runlog import atomic_write_bytes, atomic_write_text
from rlbatch.report import plots
from rlbatch.report.html import render_html
from rlbatch.report.inputs import load_inputs, read_probe_profile
from rlbatch.report.markdown import render_markdown

FORMATS = ("html", "md")


def build_report(paths: list[str], output: str | Path, fmt: str = "html",
                 target: str | None = None, reference: str | None = None,
                 probes: str | None = None) -> dict:
    """Write the report of `paths` (profile, sweep or run directories) to `output`; with
    `probes` (a probe profile directory), its predictions beside these measurements."""
    if fmt not in FORMATS:
        raise UserError(f"--format must be one of {', '.join(FORMATS)}, got '{fmt}'")
    out = Path(output)
    if out.is_dir():
        raise UserError("-o must name a file, not a directory", where=str(out))
    probe_profile = read_probe_profile(probes) if probes is not None else None
    inputs = load_inputs([str(p) for p in paths], target, reference)
    out.parent.mkdir(parents=True, exist_ok=True)
    data = report_data(inputs.doc, inputs.frames, inputs.profile, str(out.parent))
    if probe_profile is not None:
        data["probe_check"] = check_predictions(inputs.doc, *probe_profile)
    images = {k: plots.render_png(k, v) for k, v in data["figures"].items() if v is not None}
    files = [str(out)]
    if fmt == "html":
        page = render_html(data, images)
    else:
        names = {k: f"{out.stem}-{k}.png" for k in images}
        for k, blob in images.items():
            atomic_write_bytes(out.parent / names[k], blob)
            files.append(str(out.parent / names[k]))
        page = render_markdown(data, names)
    atomic_write_text(out, page)
    return {"report": str(out), "format": fmt, "files": files, "figures": list(images),
            "omitted": data["notes"], "recommendation": data["decision"].get("config"),
            "warnings": data["warnings"], "probe_check": data.get("probe_check")}
