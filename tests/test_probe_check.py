"""A probe profile's predictions against runs to the target (`analyze --probes`,
`report --probes`), on the synthetic sweep of test_analysis_cli (known N* and q = 4B
samples/s, so every measured T is known exactly)."""

import json
import math

import pytest

from rlbatch.analysis.analyze import analyze
from rlbatch.analysis.crossing import Target
from rlbatch.analysis.probe_check import check_predictions
from rlbatch.core.errors import DataError
from rlbatch.report.html import _probe_check
from test_analysis_cli import ACC, SWEEP, gm, make_sweep, run_cli


def lr(b):
    return 1e-4 * math.sqrt(b / 128)


def measured_t(b):
    return gm(SWEEP[b]) / (4 * b)  # N* of three seeds (geometric mean) / q


REF_T = measured_t(128)
# predicted T as a multiple of the measured one: errors +10%, -20%, 0%
FACTORS = {64: 1.0, 256: 1.1, 512: 0.8}


def prediction(b, factor, ci_width=0.05):
    t = factor * measured_t(b)
    ratio = t / REF_T
    return {"kind": "sqrt", "sequences_per_step": b, "lr": lr(b), "samples": 1000,
            "time_to_target": t, "time_to_target_ci": [t * (1 - ci_width), t * (1 + ci_width)],
            "time_ratio": ratio, "time_ratio_ci": [ratio * 0.9, ratio * 1.1],
            "verdict": "aligned"}


def probe_profile(decision_b=512):
    preds = {f"sqrt-P{b // 8}": prediction(b, f) for b, f in FACTORS.items()}
    preds["sqrt-P4096"] = prediction(128, 1.0) | {"sequences_per_step": 32768,
                                                   "lr": lr(32768)}
    return {"config": "synthetic", "strategy": "probe", "predictions": preds,
            "decision": {"sequences_per_step": decision_b, "lr": lr(decision_b),
                         "prompts_per_step": decision_b // 8, "samples_per_prompt": 8}}


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    return make_sweep(tmp_path_factory)


@pytest.fixture(scope="module")
def doc(sweep):
    return analyze([sweep], Target(ACC, 0.5), n_boot=200)


def test_rows_match_by_batch_and_lr_and_give_the_errors(doc):
    check = check_predictions(doc, probe_profile())
    rows = {r["sequences_per_step"]: r for r in check["rows"]}
    assert sorted(rows) == [64, 256, 512]
    for b, f in FACTORS.items():
        r = rows[b]
        assert r["measured_time"] == pytest.approx(measured_t(b))
        assert r["time_error"] == pytest.approx(f - 1)
        # the measured ratio is the analysis' own (vs_reference), the same factor off
        assert r["measured_ratio"] == pytest.approx(measured_t(b) / REF_T)
        assert r["ratio_error"] == pytest.approx(f - 1)
        assert r["measured_time_inside"] is (abs(f - 1) <= 0.05)
        assert r["seeds"] == 3
    assert check["unmatched"] == ["sqrt-P4096"]
    s = check["summary"]
    assert s["compared"] == 3
    assert s["median_abs_time_error"] == pytest.approx(0.1)
    assert s["median_time_error"] == pytest.approx(0.0)
    assert s["measured_inside_interval"] == [1, 3]


def test_decision_compared_with_the_recommendation(doc):
    assert doc["recommendation"]["sequences_per_step"] == 512
    same = check_predictions(doc, probe_profile(512))["decision"]
    assert same["same"] is True and same["probe"] == same["analysis"]
    other = check_predictions(doc, probe_profile(128))["decision"]
    assert other["same"] is False


def test_a_wrong_lr_does_not_match(doc):
    prof = probe_profile()
    prof["predictions"]["sqrt-P32"]["lr"] = lr(256) * 1.01
    check = check_predictions(doc, prof)
    assert "sqrt-P32" in check["unmatched"]
    assert 256 not in {r["sequences_per_step"] for r in check["rows"]}


def test_not_a_probe_profile_is_a_data_error(doc):
    with pytest.raises(DataError, match="not a probe profile"):
        check_predictions(doc, {"strategy": "full", "predictions": {}})


def write_profile(d, prof):
    d.mkdir(parents=True, exist_ok=True)
    (d / "profile.json").write_text(json.dumps(prof))
    return d


def test_analyze_cli_prints_the_check_and_json_holds_it(sweep, tmp_path, capsys):
    prof = write_profile(tmp_path / "probe", probe_profile())
    code, out, _ = run_cli(["analyze", str(sweep), "--bootstrap", "200", "--probes",
                            str(prof)], capsys)
    assert code in (0, None)
    assert "probe predictions compared: 3; median |T error| 10.0%" in out
    assert "measured T inside the predicted interval for 1 of 3" in out
    assert "predictions without runs to the target here: sqrt-P4096" in out
    assert "(the same)" in out
    code, out, _ = run_cli(["analyze", str(sweep), "--bootstrap", "200", "--json",
                            "--probes", str(prof)], capsys)
    doc = json.loads(out.strip().splitlines()[-1])
    assert doc["probe_check"]["summary"]["compared"] == 3


@pytest.mark.parametrize("content,needle", [
    ({"strategy": "full"}, "not a probe profile"),
    ({"strategy": "probe", "predictions": []}, "'predictions' must be an object"),
    ({"strategy": "probe", "predictions": {"x": {"time_ratio": "fast"}}},
     "'predictions.x.time_ratio' must be"),
    (None, "no profile.json here"),
])
def test_bad_probe_profile_is_one_line_exit_2(sweep, tmp_path, capsys, content, needle):
    d = tmp_path / "probe"
    d.mkdir()
    if content is not None:
        write_profile(d, content)
    code, out, err = run_cli(["analyze", str(sweep), "--probes", str(d)], capsys)
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0]


def test_report_shows_predictions_beside_measurements(sweep, tmp_path, capsys):
    prof = write_profile(tmp_path / "probe", probe_profile())
    out_md = tmp_path / "r" / "report.md"
    code, _, _ = run_cli(["report", str(sweep), "--probes", str(prof), "--format", "md",
                          "-o", str(out_md)], capsys)
    assert code in (0, None)
    page = out_md.read_text()
    assert "## Probe predictions against runs to the target" in page
    assert "median \\|T error\\| 10.0%" in page
    assert "+10%" in page and "-20%" in page



def test_html_section_renders_the_same_rows(doc):
    check = check_predictions(doc, probe_profile())
    page = _probe_check({"probe_check": check})
    assert page.startswith('<section id="probe_check">')
    assert page.count("<tr>") == 1 + len(check["rows"])  # header + one row each
    assert "+10%" in page and "-20%" in page
    assert _probe_check({}) == ""
