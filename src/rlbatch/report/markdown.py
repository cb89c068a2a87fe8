"""The report as Markdown, with its figures as PNG files beside it (same content as the HTML
page). Strings from configs, tasks or logs are HTML-escaped (Markdown renders inline HTML)
and Markdown's own markup characters are backslash-escaped. Renders only."""

from __future__ import annotations

import html
import re
from urllib.parse import quote

from rlbatch.report import text

_MD_SPECIAL = re.compile(r"([\\`*_\[\]|])")


def md(value) -> str:
    """`<`, `>`, `&` as entities (inline HTML is live in Markdown), markup characters
    backslash-escaped."""
    return _MD_SPECIAL.sub(r"\\\1", html.escape(str(value), quote=False))


def _table(header, rows) -> list[str]:
    out = ["| " + " | ".join(md(h) for h in header) + " |",
           "|" + "---|" * len(header)]
    for row in rows:
        out.append("| " + " | ".join(c[0] if isinstance(c, tuple) else md(c) for c in row)
                   + " |")
    return out


def _figure(key: str, data: dict, filename: str | None) -> list[str]:
    out = [f"## {md(data['titles'][key])}", ""]
    if filename is None:
        return out + [f"*Figure omitted: {md(data['notes'][key])}.*", ""]
    out += [f"![{md(data['titles'][key])}]({quote(filename)})", "", md(text.CAPTIONS[key])]
    extra = text.figure_extra(key, data["figures"][key])
    return out + ([f"\n{md(extra)}"] if extra else []) + [""]


def render_markdown(data: dict, files: dict[str, str]) -> str:
    """Markdown from report data; `files` maps figure keys to their PNG file names."""
    title = "rlbatch report" + (f": {data['title']}" if data.get("title") else "")
    lines = [f"# {md(title)}", "", "## Decision", ""]
    lines += [md(s) + "\n" for s in text.decision_lines(data["decision"])]
    lines += ["## Summary", ""] + [f"- {md(s)}" for s in text.summary_lines(data)] + [""]
    lines += _table(text.CONFIG_HEADER, text.config_rows(data)) + [""]
    for key in data["titles"]:
        lines += _figure(key, data, files.get(key))
    check = data.get("probe_check")
    if check:
        lines += [f"## {md(text.PROBE_CHECK_TITLE)}", ""]
        lines += [f"- {md(s)}" for s in text.probe_check_summary(check)] + [""]
        lines += _table(text.PROBE_CHECK_HEADER, text.probe_check_rows(check)) + [""]
    rows = [[(f"[{md(r['run_id'])}]({quote(r['link'])})",)] + text.run_cells(r)
            for r in data["runs"]]
    lines += ["## Runs", ""] + _table(text.RUN_HEADER, rows) + [""]
    lines += ["## Warnings", ""] + ([f"- {md(w)}" for w in data["warnings"]] or ["- none"])
    return "\n".join(lines) + "\n"
