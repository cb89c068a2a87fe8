"""`rlbatch report` end to end on synthetic run logs and a synthetic profile.json: one
self-contained HTML file, Markdown with PNGs beside it, escaping of every logged string,
omitted figures, relocated profiles and the CLI's one-line errors."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote

import pytest

from rlbatch.analysis.figures import FIGURES
from rlbatch.cli.main import main
from rlbatch.report.build import build_report
from test_report_figures import ACC, run_config, write_profile, write_run, write_sweep

EVIL = "<script>alert(1)</script>"
ESCAPED = "&lt;script&gt;alert(1)&lt;/script&gt;"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(autouse=True)
def _no_fsync(monkeypatch):
    import os

    monkeypatch.setattr(os, "fsync", lambda fd: None)  # speed only


@pytest.fixture(scope="module")
def profile_report(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        import os

        mp.setattr(os, "fsync", lambda fd: None)
        root = tmp_path_factory.mktemp("report")
        prof = write_profile(root / "profile")
        out = root / "out" / "report.html"
        result = build_report([str(prof)], out)
    return prof, out, result


def test_profile_report_is_one_self_contained_file(profile_report):
    _, out, result = profile_report
    page = out.read_text()
    assert result["omitted"] == {} and set(result["figures"]) == set(FIGURES)
    assert len(re.findall(r'<img src="data:image/png;base64,', page)) == len(FIGURES)
    assert "<script" not in page.lower() and "<link" not in page.lower()
    urls = re.findall(r'(?:src|href)="([^"]*)"', page)
    assert not [u for u in urls if re.match(r"[a-z]+://", u) or u.startswith("//")]
    assert "Content-Security-Policy" in page and "@import" not in page and "url(" not in page
    links = [u for u in urls if not u.startswith("data:")]
    assert len(links) == 6 and all((out.parent / unquote(u)).is_dir() for u in links)
    assert "P = 32 prompts x G = 8 samples per prompt (B = 256)" in page
    assert "decode concurrency C = 64" in page
    assert "Measured saving: 37.5% (90% interval [37.5%, 37.5%])" in page
    assert "Predicted saving (McCandlish model" in page
    assert "Profiling cost: 19 s" in page


def test_markdown_has_the_same_content_and_pngs_beside_it(profile_report, tmp_path):
    prof, _, _ = profile_report
    out = tmp_path / "md" / "rep.md"
    result = build_report([str(prof)], out, fmt="md")
    text = out.read_text()
    pngs = sorted(p.name for p in out.parent.glob("*.png"))
    assert pngs == sorted(f"rep-{k}.png" for k in FIGURES)
    assert all((out.parent / p).read_bytes().startswith(PNG_MAGIC) for p in pngs)
    assert all(f"](rep-{k}.png)" in text for k in FIGURES)
    assert "Measured saving: 37.5%" in text and "## Runs" in text
    assert len(result["files"]) == 1 + len(FIGURES)


def test_moved_profile_finds_its_runs_under_runs(profile_report, tmp_path):
    prof, _, _ = profile_report
    moved = tmp_path / "moved"
    shutil.copytree(prof, moved)
    shutil.rmtree(prof / "runs")  # the recorded run paths no longer exist
    try:
        result = build_report([str(moved)], tmp_path / "r.html")
    finally:
        shutil.copytree(moved / "runs", prof / "runs")
    assert result["omitted"] == {}
    page = (tmp_path / "r.html").read_text()
    assert 'href="moved/runs/base-s0/"' in page


def test_profile_without_runs_omits_log_figures_with_a_note(profile_report, tmp_path):
    prof, _, _ = profile_report
    alone = tmp_path / "alone"
    alone.mkdir()
    shutil.copy(prof / "profile.json", alone / "profile.json")
    shutil.rmtree(prof / "runs")
    try:
        result = build_report([str(alone)], tmp_path / "r.html")
    finally:
        write_sweep(prof / "runs")
    assert set(result["omitted"]) == {"invariance_samples", "invariance_time", "phases"}
    page = (tmp_path / "r.html").read_text()
    assert "Figure omitted: no run logged the target metric." in page
    assert "Measured saving: 37.5%" in page  # the decision comes from profile.json


def test_sweep_report_runs_the_analysis(tmp_path):
    root = write_sweep(tmp_path / "sweep")
    result = build_report([str(root)], tmp_path / "r.html", target=f"{ACC}=0.5",
                          reference=str(root / "base-s0"))
    assert result["omitted"] == {}
    page = (tmp_path / "r.html").read_text()
    assert "rollout/tokens_per_s (no decode sweep" in page


def test_every_logged_string_is_escaped(tmp_path):
    root = tmp_path / "evil"
    metric = f"eval/{EVIL}"
    for seed in (0, 1):
        cfg = run_config(128, "sqrt", seed, root, name=EVIL, task=EVIL, metric=metric,
                         algorithm=EVIL)
        cfg["optimizer"]["lr_scaling"] = EVIL + r" $\frac{$"  # mathtext must not parse it
        write_run(root / f"evil-s{seed}", cfg, 4, 0.5, {
            "time/rollout": 0.25, "time/reward": 0.0625, "time/actor_update": 0.125,
            "time/critic_update": 0.0, "time/other": 0.0625}, metric=metric)
    out = tmp_path / "r.html"
    result = build_report([str(root)], out)
    page = out.read_text()
    assert EVIL not in page and "<script" not in page.lower()
    assert f"eval/{ESCAPED}" in page  # target metric and logged-metrics line
    assert f"<td>{ESCAPED}</td>" in page  # config name and task in the runs table
    assert "invariance_samples" in result["figures"]
    md_out = tmp_path / "r.md"
    build_report([str(root)], md_out, fmt="md")
    assert EVIL not in md_out.read_text() and ESCAPED in md_out.read_text()


def test_cli_json_and_one_line_errors(tmp_path, capsys):
    root = write_sweep(tmp_path / "sweep")
    with pytest.raises(SystemExit) as ok:  # typer exits 0 when the command returns
        main(["report", str(root), "-o", str(tmp_path / "r.html"), "--json"])
    assert ok.value.code in (0, None)
    doc = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert doc["report"] == str(tmp_path / "r.html") and doc["format"] == "html"
    for argv, needle in (
            ([str(root), "--format", "pdf"], "--format must be one of html, md"),
            ([str(tmp_path / "nope")], "path not found"),
            ([str(root), "--target", "eval/accuracy"], "--target: expected METRIC=VALUE")):
        with pytest.raises(SystemExit) as exc:
            main(["report", *argv, "-o", str(tmp_path / "x.html")])
        err = capsys.readouterr().err.strip().splitlines()
        assert exc.value.code == 2 and len(err) == 1 and needle in err[0], err


def test_report_and_figure_data_import_neither_torch_nor_matplotlib():
    code = ("import sys, rlbatch.report.build, rlbatch.analysis.figures, rlbatch.cli.report_cmds;"
            "bad = [m for m in ('torch', 'matplotlib') if m in sys.modules];"
            "assert not bad, bad")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=Path(__file__).parent, check=False)
    assert proc.returncode == 0, proc.stderr



def test_markdown_escaping_keeps_entities_intact():
    from rlbatch.report.markdown import md

    assert md("it's <b>|x_y</b> & #1 [a]*") == \
        r"it's &lt;b&gt;\|x\_y&lt;/b&gt; &amp; #1 \[a\]\*"
