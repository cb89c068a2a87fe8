"""One self-contained HTML file: inline CSS, figures as base64 PNG data URIs, no scripts and
no network requests (a Content-Security-Policy meta tag forbids any). Every string that
comes from configs, tasks or logs goes through `esc` (html.escape); links to run folders
are relative and URL-quoted. Renders only."""

from __future__ import annotations

import base64
import html
from urllib.parse import quote

from rlbatch.report import text

CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"
CSS = """
body { font-family: system-ui, -apple-system, 'Segoe UI', sans-serif; margin: 2em auto;
       max-width: 1100px; padding: 0 1em; color: #222; line-height: 1.45; }
h1 { font-size: 1.6em; } h2 { font-size: 1.25em; border-bottom: 1px solid #ddd; }
.decision { background: #f3f8ff; border: 1px solid #c7dcf5; padding: 0.6em 1em; }
figure { margin: 1em 0; } figure img { max-width: 100%; height: auto; border: 1px solid #eee; }
figcaption, .note { font-size: 0.9em; color: #555; }
table { border-collapse: collapse; font-size: 0.82em; margin: 0.5em 0; }
th, td { border: 1px solid #ddd; padding: 0.25em 0.5em; text-align: left; vertical-align: top; }
th { background: #f6f6f6; } td.num { text-align: right; white-space: nowrap; }
.warn { color: #8a5a00; }
"""


def esc(value) -> str:
    return html.escape(str(value), quote=True)


def _table(header, rows, numeric=()) -> str:
    head = "".join(f"<th>{esc(h)}</th>" for h in header)
    body = []
    for row in rows:
        cells = []
        for i, cell in enumerate(row):
            raw = cell if isinstance(cell, tuple) else None  # (html, ) = pre-escaped markup
            cls = ' class="num"' if i in numeric else ""
            cells.append(f"<td{cls}>{raw[0] if raw else esc(cell)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _figure(key: str, data: dict, png: bytes | None) -> str:
    title = esc(data["titles"][key])
    if png is None:
        return (f'<section id="{esc(key)}"><h2>{title}</h2>'
                f'<p class="note">Figure omitted: {esc(data["notes"][key])}.</p></section>')
    src = "data:image/png;base64," + base64.b64encode(png).decode("ascii")
    extra = text.figure_extra(key, data["figures"][key])
    extra_html = f"<br>{esc(extra)}" if extra else ""
    return (f'<section id="{esc(key)}"><h2>{title}</h2><figure>'
            f'<img src="{src}" alt="{title}" data-figure="{esc(key)}">'
            f"<figcaption>{esc(text.CAPTIONS[key])}{extra_html}</figcaption></figure></section>")


def _runs(data: dict) -> str:
    rows = []
    for r in data["runs"]:
        link = f'<a href="{esc(quote(r["link"]))}">{esc(r["run_id"])}</a>'
        rows.append([(link,)] + text.run_cells(r))
    return _table(text.RUN_HEADER, rows, numeric=(4, 5, 6, 7))


def _probe_check(data: dict) -> str:
    check = data.get("probe_check")
    if not check:
        return ""
    lines = "".join(f"<li>{esc(x)}</li>" for x in text.probe_check_summary(check))
    table = _table(text.PROBE_CHECK_HEADER, text.probe_check_rows(check),
                   numeric=tuple(range(1, 8)))
    return (f'<section id="probe_check"><h2>{esc(text.PROBE_CHECK_TITLE)}</h2>'
            f"<ul>{lines}</ul>{table}</section>")


def render_html(data: dict, images: dict[str, bytes]) -> str:
    """The report page from report data (analysis.figures.report_data) and figure PNGs."""
    title = "rlbatch report" + (f": {data['title']}" if data.get("title") else "")
    decision = "".join(f"<p>{esc(line)}</p>" for line in text.decision_lines(data["decision"]))
    summary = "".join(f"<li>{esc(line)}</li>" for line in text.summary_lines(data))
    figures = "\n".join(_figure(k, data, images.get(k)) for k in data["titles"])
    warnings = "".join(f'<li class="warn">{esc(w)}</li>' for w in data["warnings"])
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{esc(CSP)}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{esc(title)}</title>
<style>{CSS}</style>
</head>
<body>
<h1>{esc(title)}</h1>
<section id="decision"><h2>Decision</h2><div class="decision">{decision}</div></section>
<section id="summary"><h2>Summary</h2><ul>{summary}</ul>
{_table(text.CONFIG_HEADER, text.config_rows(data), numeric=(2, 3, 4, 5, 6))}</section>
{figures}
{_probe_check(data)}
<section id="runs"><h2>Runs</h2>{_runs(data)}</section>
<section id="warnings"><h2>Warnings</h2><ul>{warnings or '<li>none</li>'}</ul></section>
</body>
</html>
"""
