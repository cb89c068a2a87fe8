"""Run-log writer/reader contract and the phase timer."""

from __future__ import annotations

import json

import pytest

from rlbatch.core.errors import DataError
from rlbatch.core.runlog import (
    STEP_REQUIRED,
    RunWriter,
    make_run_id,
    read_jsonl,
    read_run,
    truncate_jsonl_after_step,
)
from rlbatch.core.timers import PhaseTimer


def _row(step: int) -> dict:
    row = {k: 0.0 for k in STEP_REQUIRED}
    row.update(step=step, samples=128 * step, prompts=16 * step, tokens=600 * step,
               train_s=0.5 * step)
    return row


def test_reader_reports_truncated_last_line(tmp_path):
    with RunWriter(tmp_path) as w:
        for s in (1, 2, 3):
            w.log_step(_row(s))
        w.log_eval({"step": 3, "samples": 384, "train_s": 1.5, "eval/accuracy": 0.5})
        w.write_summary({"status": "running"})
    with open(tmp_path / "steps.jsonl", "a") as fh:  # a kill mid-write
        fh.write('{"step": 4, "samples": 51')
    run = read_run(tmp_path)
    assert [r["step"] for r in run.steps] == [1, 2, 3]
    assert len(run.warnings) == 1 and "steps.jsonl:4" in run.warnings[0]
    assert "truncated" in run.warnings[0]
    assert run.evals[0]["eval/accuracy"] == 0.5


def test_bad_line_in_the_middle_is_an_error(tmp_path):
    (tmp_path / "steps.jsonl").write_text('{"step": 1}\nnot json\n{"step": 3}\n')
    with pytest.raises(DataError) as exc:
        read_jsonl(tmp_path / "steps.jsonl")
    assert "steps.jsonl:2" in str(exc.value)


def test_nonfinite_values_become_null_and_required_keys_enforced(tmp_path):
    with RunWriter(tmp_path) as w:
        row = _row(1)
        row["actor/loss"] = float("nan")
        w.log_step(row)
        with pytest.raises(ValueError):
            w.log_step({"step": 2})
        with pytest.raises(ValueError):
            w.write_summary({"status": "done"})
    stored = json.loads((tmp_path / "steps.jsonl").read_text().splitlines()[0])
    assert stored["actor/loss"] is None


def test_truncate_after_step_drops_later_rows_and_cut_line(tmp_path):
    path = tmp_path / "steps.jsonl"
    path.write_text("".join(json.dumps({"step": s}) + "\n" for s in range(1, 6)) + '{"ste')
    truncate_jsonl_after_step(path, 3)
    rows, warnings = read_jsonl(path)
    assert [r["step"] for r in rows] == [1, 2, 3] and warnings == []


def test_run_id_is_stable_and_sensitive():
    a = {"algorithm": "grpo", "batch": {"prompts_per_step": 16, "samples_per_prompt": 8},
         "derived": {"actor_lr": 1e-4}, "output_dir": "x"}
    b = dict(a, output_dir="elsewhere")
    assert make_run_id(a, 0) == make_run_id(b, 0)  # output dir is not part of identity
    assert make_run_id(a, 0) != make_run_id(a, 1)
    assert make_run_id(a, 0).startswith("grpo-P16xG8-lr0.0001-s0-")


def test_phase_timer_with_fake_clock():
    ticks = iter([0.0, 1.0, 1.0, 3.5, 10.0, 10.25])
    syncs = []
    t = PhaseTimer(sync=lambda: syncs.append(1), warmup_steps=1, clock=lambda: next(ticks))
    with t.phase("rollout"):
        pass
    with t.phase("update"):
        pass
    times, warm = t.end_step()
    assert times == {"rollout": 1.0, "update": 2.5} and warm
    with t.phase("rollout"):
        pass
    times, warm = t.end_step()
    assert times == {"rollout": 0.25} and not warm
    assert t.warmup_totals == {"rollout": 1.0, "update": 2.5}
    assert t.totals == {"rollout": 0.25}
    assert len(syncs) == 6  # device sync at both boundaries of every phase


def test_phase_timer_reassign_moves_seconds_without_counting_them_twice():
    ticks = iter([0.0, 4.0])
    t = PhaseTimer(clock=lambda: next(ticks))
    with t.phase("actor_update"):
        pass
    t.reassign("actor_update", "noise_scale", 1.5)  # probe time measured inside the update
    t.reassign("actor_update", "noise_scale", 9.0)  # never more than the phase holds
    times, _ = t.end_step()
    assert times == {"actor_update": 0.0, "noise_scale": 4.0}


def test_tracker_sinks_do_not_change_run_identity():
    from rlbatch.analysis.runs import configuration

    a = {"algorithm": "grpo", "batch": {"prompts_per_step": 16, "samples_per_prompt": 8},
         "derived": {"actor_lr": 1e-4}, "seed": 0}
    b = dict(a, trackers=["tensorboard", "mlflow"])
    assert make_run_id(a, 0) == make_run_id(b, 0)
    assert configuration(a) == configuration(b)


def test_last_jsonl_row_reads_the_last_complete_row_from_the_end(tmp_path):
    from rlbatch.core.runlog import last_jsonl_row

    p = tmp_path / "steps.jsonl"
    assert last_jsonl_row(p) is None
    p.write_bytes(b"")
    assert last_jsonl_row(p) is None
    rows = [{"step": i, "samples": 128 * i, "pad": "x" * 40} for i in range(50)]
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert last_jsonl_row(p) == rows[-1]
    with open(p, "ab") as f:
        f.write(b'{"step": 50, "sam')  # killed mid-write: passed over, as read_jsonl does
    assert last_jsonl_row(p) == rows[-1] == read_jsonl(p)[0][-1]
    # a tail shorter than the file starts inside a row: that piece is not taken for a row
    for tail in (30, 64, 100, 200):
        assert last_jsonl_row(p, tail_bytes=tail) == rows[-1]
