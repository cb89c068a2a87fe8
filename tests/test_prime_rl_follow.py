"""Following prime-rl's metrics.jsonl as a trial's command writes it (issue 54, findings 1 and
4-7): the log as it stands before the first step, a line cut by a kill and the resumed
attempt appending after it, evaluations finishing out of step order, the time each step's
policy exists, and the time the run was down. The lines are prime-rl's as
tests/helpers/prime_rl_log.py writes them (its module text cites prime-rl 559b447).
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from helpers import prime_rl_log
from rlbatch.backends.command.follow import Attempt, Follower
from rlbatch.core.errors import DataError
from rlbatch.interop.ingest import IngestOptions

OPTS = IngestOptions(prompts_per_step=4, samples_per_prompt=4, lr=1e-6, seed=0)


def _follow(path: Path, opts: IngestOptions = OPTS) -> tuple[list, list, Follower]:
    f = Follower("prime-rl", opts)
    steps, evals, _ = f.read([Attempt(1, path, True, -1)])
    return steps, evals, f


def _write(path: Path, lines: list[dict], cut: str = "") -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in lines) + cut)
    return path


# ---------------------------------------------------------------- finding 1
def test_a_log_opened_at_set_up_is_nothing_yet_not_a_failure(tmp_path):
    """prime-rl's FileMonitor opens metrics.jsonl for append at set-up (monitors/file.py
    25-31), minutes before the first step; the base model's evaluation may be its first
    line. Both are a command still starting."""
    empty = tmp_path / "empty" / "metrics.jsonl"
    empty.parent.mkdir()
    empty.touch()
    assert _follow(empty)[:2] == ([], [])
    first = prime_rl_log.attempt_lines(8)
    base_eval = [r for r in first if str(r.get("step")) == "1.0"][:1]
    assert base_eval and prime_rl_log.ACC in base_eval[0]
    assert _follow(_write(tmp_path / "metrics.jsonl", base_eval))[:2] == ([], [])
    # the orchestrator's first shipped batches, before the trainer's first step
    shipped = [r for r in first[:3] if "progress/total_rollouts" in r]
    assert shipped and _follow(_write(tmp_path / "metrics.jsonl", shipped))[0] == []


# ---------------------------------------------------------------- finding 4
def test_a_line_cut_by_a_kill_and_the_resumed_attempts_first_line_read_as_one(tmp_path):
    """A kill cuts a line (no newline); the resumed attempt appends to the same file, and
    the two make one line. The cut part is dropped (warned), the resumed attempt's line
    read, and the rows are the uninterrupted run's but for the clock."""
    whole = prime_rl_log.attempt_lines(12)
    cut_at = next(i for i, r in enumerate(whole) if r.get("progress/rollouts") and r["step"] == 7)
    first = whole[:cut_at]
    cut = json.dumps(whole[cut_at])[:25]  # the kill's cut line
    resumed = prime_rl_log.attempt_lines(12, start=4, t0=5000.0)
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in first) + cut
                    + "".join(json.dumps(r) + "\n" for r in resumed))
    steps, evals, f = _follow(path)
    ref_steps, ref_evals, _ = _follow(_write(tmp_path / "ref.jsonl", whole))

    def clockless(rows):
        return [{k: v for k, v in r.items() if k != "train_s"} for r in rows]

    assert clockless(steps) == clockless(ref_steps)
    assert clockless(evals) == clockless(ref_evals)
    assert any("a line cut mid-write" in w for w in f.warnings)


# ---------------------------------------------------------------- finding 6
def test_evaluations_finishing_out_of_step_order_drop_no_row(tmp_path):
    """Each (env, step) evaluation is finalized on its own (orchestrator/eval_sink.py 24-35,
    86-93): the evaluation fired at step 8 may be logged after the one fired at step 12. It
    is an evaluation, never a restart."""
    lines = prime_rl_log.attempt_lines(16, interval=4, eval_lag=2)
    evals = [i for i, r in enumerate(lines) if prime_rl_log.ACC in r and r["step"] >= 8]
    assert len(evals) >= 2
    i8, i12 = evals[0], evals[1]
    swapped = list(lines)
    swapped[i8], swapped[i12] = lines[i12], lines[i8]
    steps, got, f = _follow(_write(tmp_path / "metrics.jsonl", swapped))
    ref_steps, ref, _ = _follow(_write(tmp_path / "ref.jsonl", lines))
    assert steps == ref_steps and got == ref
    assert not any("logged again" in w for w in f.warnings)


# ---------------------------------------------------------------- finding 7
def test_the_time_the_run_was_down_is_not_training_time(tmp_path):
    """Killed after step 7 shipped, resumed from step 4 an hour later into the same file:
    the resumed attempt's clock starts at its own first step, so the rows' train_s is the
    uninterrupted run's, the hour left out."""
    whole = prime_rl_log.attempt_lines(12)
    cut = next(i for i, r in enumerate(whole) if r.get("progress/rollouts") and r["step"] == 7)
    resumed = prime_rl_log.attempt_lines(12, start=4, t0=1000.0 + 3600.0 + 4.0)
    steps, _, _ = _follow(_write(tmp_path / "metrics.jsonl", whole[:cut + 1] + resumed))
    ref, _, _ = _follow(_write(tmp_path / "ref.jsonl", whole))
    assert [r["step"] for r in steps] == [r["step"] for r in ref]
    assert max(r["train_s"] for r in steps) < 100  # no hour in it
    # after the resume, every step takes as long as in the uninterrupted run
    got = [b["train_s"] - a["train_s"] for a, b in itertools.pairwise(steps[4:])]
    want = [b["train_s"] - a["train_s"] for a, b in itertools.pairwise(ref[4:])]
    assert got == pytest.approx(want)


# ---------------------------------------------------------------- finding 5
def _pipeline(b: int, steps: int, gen_s_per_sample: float, train_s_per_sample: float,
              every: int, t0: float = 1000.0) -> list[dict]:
    """prime-rl's loop for batch size `b` (samples per step), in the order lines reach the
    file: the orchestrator generates batch s once policy s - 2 exists and logs step s when
    it ships it (orchestrator.py 101-104, 662-747); the trainer trains step k on batch k
    once it is shipped and logs step k when policy k exists (train.py 575-693). Evaluation
    accuracy rises with the samples the policy was trained on, alike at any b (policy
    version v: v x b samples); an evaluation fires every `every` steps."""
    events: list[tuple[float, dict]] = []
    shipped: list[float] = []
    trained: list[float] = []
    t_train = t0
    for s in range(1, steps + 1):
        ready = trained[s - 3] if s >= 3 else t0
        start = max(ready, shipped[-1] if shipped else t0)
        shipped.append(start + gen_s_per_sample * b)
        events.append((shipped[-1], {"step": s, "time": shipped[-1], "time/step":
                                     gen_s_per_sample * b, "progress/rollouts": b,
                                     "progress/total_rollouts": b * (s - 1),
                                     "progress/tasks": b // 4,
                                     "progress/total_tasks": b // 4 * (s - 1),
                                     "train/agg/all/agent/reward/mean": 0.1}))
        if s % every == 0:
            v = len([t for t in trained if t <= shipped[-1]])
            events.append((shipped[-1] + 1e-3, {
                "step": float(s), "time": shipped[-1] + 1e-3,
                prime_rl_log.ACC: round(0.2 + 1e-4 * v * b, 9),
                f"eval/{prime_rl_log.ENV}/policy_version": float(v)}))
        t_train = max(t_train, shipped[-1]) + train_s_per_sample * b
        trained.append(t_train)
        events.append((t_train, {"step": s, "time": t_train, "loss/mean": 0.01,
                                 "optim/lr": 1e-6, "time/step": train_s_per_sample * b,
                                 "time/save_ckpt": 0.0}))
    return [row for _, row in sorted(events, key=lambda e: e[0])]


def _time_to(steps: list, evals: list, value: float) -> float:
    return next(r["train_s"] for r in evals if r[prime_rl_log.ACC] >= value)


def test_b_and_4b_with_equal_per_sample_learning_and_cost_take_equal_time(tmp_path):
    """The orchestrator runs 2 steps ahead of the trainer. With learning and cost identical
    per sample, B and 4B reach the target in the same time (generation, overlapped, is 1% of
    the cost, so the larger batch's longer first step moves T by under 1%). A step is dated
    by its trainer line (policy s exists), so the T ratio reads 1.00; dated by the
    orchestrator's line it read about 0.88 (the bias of 1.5 steps is 1.5/n of T)."""
    times = {}
    for b, steps, every in ((64, 48, 1), (256, 12, 1)):
        opts = IngestOptions(prompts_per_step=b // 4, samples_per_prompt=4, lr=1e-6, seed=0)
        lines = _pipeline(b, steps, gen_s_per_sample=1e-4, train_s_per_sample=1e-2,
                          every=every)
        rows, evals, _ = _follow(_write(tmp_path / f"b{b}.jsonl", lines), opts)
        assert [r["samples"] for r in rows][-1] == b * steps
        times[b] = _time_to(rows, evals, 0.2 + 1e-4 * 40 * 64)
    assert times[256] / times[64] == pytest.approx(1.0, abs=0.02)


def test_a_stray_orchestrator_line_fails_and_a_restart_does_not(tmp_path):
    """The ordering rule on prime-rl's strictly ordered writers: an orchestrator line for
    step 3 after step 8 followed by step 9 is a stray line (a DataError naming the line);
    the same line followed by step 4 is a restart."""
    lines = prime_rl_log.attempt_lines(12)
    i = next(i for i, r in enumerate(lines) if r.get("progress/rollouts") and r["step"] == 8)
    stray = dict(lines[i], step=3)
    path = _write(tmp_path / "metrics.jsonl", lines[:i + 1] + [stray] + lines[i + 1:])
    with pytest.raises(DataError, match=rf"^{path}:{i + 2}: a line for step 3 after step 8, "
                                        "then step 9"):
        _follow(path)
