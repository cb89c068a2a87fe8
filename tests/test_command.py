"""`backend: command`: a trial as the user's own training command (issue 29; docs/integrations.md).

What is tested here, without a model: the words appended for each framework (interop/launch.py),
joining attempts (backends/command/follow.py), and the process control of `rlbatch train`
with a command (backends/command/run.py): a finished command, a crash, a hang, a STOP file, a
signal and a resume. The command in these tests is tests/helpers/log_writer.py, a stand-in
that writes verl's file-logger format and trains nothing; the real third-party trainer is in
tests/test_command_trl.py (TRL's own `trl grpo`). The real frameworks' option names are
checked in tests/test_framework_keys.py.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from helpers.cli import run_cli
from helpers.procs import alive
from rlbatch.backends.command import health as command_health
from rlbatch.backends.command.follow import (
    Attempt,
    Follower,
    continue_rows,
    join,
    output_tail,
)
from rlbatch.core.ownership import disown
from rlbatch.core.runlog import STOP_FILE, read_json, read_jsonl
from rlbatch.interop.ingest import IngestOptions, convert
from rlbatch.interop.launch import TrialSpec, launch

HELPERS = Path(__file__).resolve().parent / "helpers"
WRITER = [sys.executable, str(HELPERS / "log_writer.py")]
METRIC = "eval/x/reward/mean@1"


def _spec(framework: str, **kw) -> TrialSpec:
    base = {"framework": framework, "algorithm": "grpo", "prompts": 16,
            "samples_per_prompt": 8, "minibatches": 1, "epochs": 1, "lr": 1.5e-4,
            "critic_lr": None, "seed": 7, "eval_every_samples": 512,
            "checkpoint_every_samples": 1024, "max_samples": 4096, "concurrency": 64}
    return TrialSpec(**{**base, **kw})


def _pairs(argv: list[str]) -> dict:
    return dict(w.split("=", 1) for w in argv if "=" in w)


# ---------------------------------------------------------------- the words appended
def test_verl_overrides_convert_samples_to_rollout_steps_and_resume(tmp_path):
    spec = _spec("verl")
    ln = launch(spec, ["python3", "-m", "verl.trainer.main_ppo"], tmp_path / "a1", tmp_path)
    kv = _pairs(ln.argv)
    assert ln.argv[:3] == ["python3", "-m", "verl.trainer.main_ppo"]  # the user's words first
    assert kv["data.train_batch_size"] == "16" and kv["actor_rollout_ref.rollout.n"] == "8"
    assert kv["actor_rollout_ref.actor.optim.lr"] == "0.00015"
    assert kv["trainer.test_freq"] == "4" and kv["trainer.save_freq"] == "8"  # 512 / 128 ...
    assert kv["trainer.total_training_steps"] == "32"  # 4096 / 128
    assert kv["data.seed"] == "7" and kv["actor_rollout_ref.rollout.max_num_seqs"] == "64"
    assert kv["trainer.val_before_train"] == "true" and ln.resume_step == -1
    assert kv["trainer.max_actor_ckpt_to_keep"] == kv["trainer.max_critic_ckpt_to_keep"] == "2"
    assert ln.env["VERL_FILE_LOGGER_PATH"] == str(tmp_path / "a1" / "verl.jsonl")
    # a checkpoint verl would resume from: validation is not repeated, rows after step 8 go
    ckpt = tmp_path / "verl-checkpoints"
    (ckpt / "global_step_8").mkdir(parents=True)
    (ckpt / "latest_checkpointed_iteration.txt").write_text("8")
    again = launch(spec, ["v"], tmp_path / "a2", tmp_path)
    assert _pairs(again.argv)["trainer.val_before_train"] == "false"
    assert again.resume_step == 8 and again.log != ln.log  # verl truncates its log file


def test_trl_flags_count_optimizer_steps_and_resume_from_the_newest_checkpoint(tmp_path):
    spec = _spec("trl", per_device_batch=32, minibatches=2)  # B 128, 4 micro-steps, 2 updates
    ln = launch(spec, ["trl", "grpo"], tmp_path / "a1", tmp_path)
    words = ln.argv
    flag = {words[i][2:]: words[i + 1] for i in range(2, len(words), 2)}
    assert flag["steps_per_generation"] == "4" and flag["gradient_accumulation_steps"] == "2"
    assert ln.updates_per_step == 2
    assert flag["max_steps"] == "64" and flag["eval_steps"] == "8" and flag["save_steps"] == "16"
    assert flag["eval_on_start"] == "true" and "resume_from_checkpoint" not in flag
    assert flag["save_total_limit"] == "2"  # transformers keeps every checkpoint by default
    assert ln.env["TENSORBOARD_LOGGING_DIR"] == str(tmp_path / "a1" / "tensorboard")
    out = tmp_path / "trl-output"
    for n, complete in ((16, True), (32, True), (48, False)):  # 48: cut before its state
        (out / f"checkpoint-{n}").mkdir(parents=True)
        if complete:
            (out / f"checkpoint-{n}" / "trainer_state.json").write_text("{}")
    again = launch(spec, ["trl", "grpo"], tmp_path / "a2", tmp_path)
    assert again.argv[again.argv.index("--resume_from_checkpoint") + 1] == \
        str(out / "checkpoint-32")
    assert again.resume_step == 16 and "--eval_on_start" not in again.argv


def test_openrlhf_prime_rl_and_rlbatch_words(tmp_path):
    o = launch(_spec("openrlhf"), ["ray", "job", "--", "python3", "-m",
                                   "openrlhf.cli.train_ppo_ray"], tmp_path / "o", tmp_path)
    flags = o.argv[6:]
    assert flags[flags.index("--rollout.batch_size") + 1] == "16"
    assert flags[flags.index("--train.batch_size") + 1] == "128"  # samples per update
    assert flags[flags.index("--eval.steps") + 1] == "4"
    assert "--ckpt.load_enable" not in flags  # a fresh attempt: no checkpoint to load
    assert flags[flags.index("--data.max_samples") + 1] == str(32 * 16)  # prompts of 32 steps
    assert flags[flags.index("--ckpt.best_metric_key") + 1] == "none"  # no "best" saves
    p = launch(_spec("prime-rl"), ["uv", "run", "rl", "@", "rl.toml"], tmp_path / "p", tmp_path)
    assert p.argv[p.argv.index("--orchestrator.batch-size") + 1] == "128"
    assert p.argv[p.argv.index("--max-steps") + 1] == "32" and "--resume.step" not in p.argv
    assert "--clean" in p.argv  # a fresh attempt into a folder an earlier one wrote to
    assert p.argv[p.argv.index("--ckpt.keep-last") + 1] == "2"
    assert p.shared and p.log == tmp_path / "prime-rl" / "trial" / "metrics.jsonl"
    ckpts = tmp_path / "prime-rl" / "trial" / "checkpoints"
    for step, halves in ((8, ("trainer", "orchestrator")), (12, ("orchestrator",))):
        # prime-rl 559b447: the orchestrator's half (progress.pt) is written when batch N
        # ships, the trainer's (DCP, `.metadata` last) after step N trains; step 12 is a
        # kill between the two
        for half in halves:
            (ckpts / f"step_{step}" / half).mkdir(parents=True)
            name = ".metadata" if half == "trainer" else "progress.pt"
            (ckpts / f"step_{step}" / half / name).write_bytes(b"x")
    (ckpts / "step_16" / "trainer").mkdir(parents=True)  # DCP save cut before .metadata
    p2 = launch(_spec("prime-rl"), ["rl"], tmp_path / "p2", tmp_path)
    assert p2.argv[p2.argv.index("--resume.step") + 1] == "8" and p2.resume_step == 8
    assert "--clean" not in p2.argv and "--resume" not in p2.argv
    r = launch(_spec("rlbatch"), ["rlbatch", "train", "base.yaml"], tmp_path / "r", tmp_path)
    sets = [r.argv[i + 1] for i, w in enumerate(r.argv) if w == "--set"]
    assert "optimizer.lr=0.00015" in sets and "batch.prompts_per_step=16" in sets
    assert r.argv[-4:] == ["--out", str(tmp_path / "rlbatch-runs"), "--resume", "--json"]
    assert r.shared and r.resume_step == -1  # rlbatch train resumes itself, into one log


# ---------------------------------------------------------------- joining attempts
def _rows(steps, t0=0.0, dt=1.0):
    return [{"step": s, "samples": 8 * s, "train_s": t0 + dt * (i + 1)}
            for i, s in enumerate(steps)]


def test_a_resumed_attempt_replaces_rows_after_its_checkpoint_and_continues_the_clock():
    first = _rows([1, 2, 3, 4, 5])  # killed after step 5; its checkpoint was step 3
    evals = [{"step": 2, "samples": 16, "train_s": 2.0}, {"step": 4, "samples": 32, "train_s": 4.0}]
    second = _rows([4, 5, 6], dt=2.0)  # the new attempt's own clock starts at 0
    steps, ev = join(first, evals, second, [{"step": 6, "samples": 48, "train_s": 6.0}], 3)
    assert [r["step"] for r in steps] == [1, 2, 3, 4, 5, 6]
    assert [r["train_s"] for r in steps] == [1.0, 2.0, 3.0, 5.0, 7.0, 9.0]
    assert [(e["step"], e["train_s"]) for e in ev] == [(2, 2.0), (6, 9.0)]
    # a fresh start (-1) replaces everything; an unknown checkpoint cuts where rows start
    assert join(first, evals, _rows([1]), [], -1)[0] == _rows([1])
    assert [r["step"] for r in join(first, evals, _rows([5, 6]), [], None)[0]] == \
        [1, 2, 3, 4, 5, 6]


def test_cumulative_tokens_continue_across_a_resume_and_a_rotated_log():
    """A converter counts tokens from the start of the log it reads: a resumed attempt's
    rows (and a rotated log's) count from 0 again. Joined, they continue from the kept rows'
    count; rows that already continue it are left alone; where the kept rows have no count,
    the new rows' restarting one is dropped rather than mixed in."""
    def rows(steps, per=10, start=0):
        return [{"step": s, "samples": 8 * s, "train_s": float(i + 1), "tokens": start + per * (i + 1)}
                for i, s in enumerate(steps)]

    first = rows([1, 2, 3, 4, 5])
    steps, _ = join(first, [], rows([4, 5, 6]), [], 3)
    assert [r["tokens"] for r in steps] == [10, 20, 30, 40, 50, 60]
    steps, _ = join(first, [], rows([4, 5, 6], start=30), [], 3)  # a count that continues
    assert [r["tokens"] for r in steps] == [10, 20, 30, 40, 50, 60]
    bare = [{k: v for k, v in r.items() if k != "tokens"} for r in first]
    steps, _ = join(bare, [], rows([4, 5, 6]), [], 3)
    assert all("tokens" not in r for r in steps)
    steps, _, lost = continue_rows(first, [], rows([6, 7]), [])  # rotated before step 6
    assert lost and [r["tokens"] for r in steps] == [10, 20, 30, 40, 50, 60, 70]


def test_following_a_growing_log_converts_only_when_it_changes(tmp_path):
    log = tmp_path / "verl.jsonl"
    log.write_text("")
    opts = IngestOptions(prompts_per_step=16, samples_per_prompt=8, lr=1e-4)
    follower = Follower("verl", opts)
    attempts = [Attempt(1, log, False, -1)]
    assert follower.read(attempts) == ([], [], True)  # nothing logged yet is not an error
    lines = [json.dumps({"step": s, "data": {"timing_s/step": 0.5, "critic/score/mean": s / 4,
                                             "response_length/mean": 5.0}}) for s in (1, 2, 3)]
    with open(log, "a") as fh:
        fh.write(lines[0] + "\n" + lines[1][:20])  # a line cut mid-write waits for the rest
        fh.flush()
        steps, _, changed = follower.read(attempts)
        assert changed and [r["step"] for r in steps] == [1]
        assert follower.read(attempts)[2] is False and follower.conversions == 2
        fh.write(lines[1][20:] + "\n" + lines[2] + "\n")
    steps, _, _ = follower.read(attempts)
    assert steps == list(convert("verl", log, opts).steps)  # what `rlbatch ingest` reads
    assert [r["train_s"] for r in steps] == [0.5, 1.0, 1.5]


def test_output_tail_names_the_exception_not_the_launcher(tmp_path):
    out = tmp_path / "output.log"
    out.write_text("loading\n  File x, line 3\nRuntimeError: reward server refused\n"
                   "Traceback (most recent call last):\n  File y\n"
                   "subprocess.CalledProcessError: Command '[...]' returned non-zero exit "
                   "status 1.\n")
    assert output_tail(out) == "RuntimeError: reward server refused"
    out.write_text("step 1\rstep 2\rKilled\n")
    assert output_tail(out) == "Killed"


# ---------------------------------------------------------------- rlbatch train with a command
def _config(tmp_path: Path, **env) -> Path:
    cfg = {"extends": "grpo-tiny", "name": "stand-in", "backend": "command",
           "command": {"framework": "verl", "argv": WRITER, "poll_s": 0.1,
                       "idle_timeout_s": 5, "stop_grace_s": 2,
                       "env": {k: str(v) for k, v in env.items()}},
           "batch": {"prompts_per_step": 4, "samples_per_prompt": 8},
           "optimizer": {"reference_sequences": 32, "reference_lr": 1e-4},
           "target": {"metric": METRIC, "value": 0.9, "gain": None},
           "budget": {"max_samples": 640, "stop_at_target": False},
           "eval": {"every_samples": 64}, "checkpoint": {"every_samples": 128},
           "output_dir": str(tmp_path / "runs")}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _run_dir(tmp_path: Path) -> Path:
    return next(p for p in (tmp_path / "runs").iterdir() if p.is_dir())


def test_a_command_runs_to_its_budget_and_its_rows_are_what_ingest_reads(tmp_path, capsys):
    code, out, err = run_cli(["train", _config(tmp_path), "--json"], capsys)
    assert code == 0, err
    summary = json.loads(out.splitlines()[-1])
    assert summary["status"] == "target_reached" and summary["samples"] == 640  # 20 steps
    run = _run_dir(tmp_path)
    steps, evals = read_jsonl(run / "steps.jsonl")[0], read_jsonl(run / "evals.jsonl")[0]
    log = run / "command" / "attempts" / "001" / "verl.jsonl"
    conv = convert("verl", log, IngestOptions(prompts_per_step=4, samples_per_prompt=8))
    assert steps == list(conv.steps) and evals == list(conv.evals)
    assert [e["step"] for e in evals] == [0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20]
    assert summary["target"]["samples"] == 576  # the first evaluation >= 0.9: step 18
    manifest = read_json(run / "manifest.json")
    assert manifest["backend"] == "command:verl"
    assert summary["command"]["train_s_source"] == manifest["train_s_source"]
    # run again: a finished run is not started again
    code, out, _ = run_cli(["train", _config(tmp_path), "--json"], capsys)
    assert code == 0 and not (run / "command" / "attempts" / "002").exists()


def test_a_command_in_another_workdir_writes_where_rlbatch_reads(tmp_path, capsys,
                                                                   monkeypatch):
    """Relative run paths (`output_dir: runs`, as `--out profiles/x` gives) with
    `command.workdir` elsewhere: every path handed to the command is absolute, so the
    command writes its log and checkpoints where rlbatch follows them, not under workdir."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    config = yaml.safe_load(_config(tmp_path).read_text())
    config["output_dir"] = "runs"
    config["command"]["workdir"] = str(elsewhere)
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(config))
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(["train", "c.yaml", "--json"], capsys)
    assert code == 0, err
    assert json.loads(out.splitlines()[-1])["samples"] == 640
    (attempt,) = [read_json(p) for p in _run_dir(tmp_path).glob("**/attempt.json")]
    assert Path(attempt["log"]).is_absolute() and Path(attempt["log"]).is_file()
    assert list(elsewhere.iterdir()) == []  # nothing written under the command's workdir


def test_a_crashing_command_fails_the_run_in_one_line(tmp_path, capsys):
    code, _, err = run_cli(["train", _config(tmp_path, LOG_WRITER_CRASH_AT=5)], capsys)
    lines = [x for x in err.strip().splitlines() if not x.startswith("stand-in: ")]  # progress
    assert code == 2 and len(lines) == 1, err
    assert "exited with status 1 after 4 logged step(s): RuntimeError: stand-in trainer: " \
           "crash at step 5" in lines[0]
    summary = read_json(_run_dir(tmp_path) / "summary.json")
    assert summary["status"] == "failed" and summary["steps"] == 4
    assert summary["failure"] == lines[0][len("error: "):]


def test_a_silent_command_is_stopped_and_fails_after_the_idle_timeout(tmp_path, capsys):
    pids = tmp_path / "pids"
    pids.mkdir()
    code, _, err = run_cli(["train", _config(tmp_path, LOG_WRITER_HANG_AT=3,
                                             LOG_WRITER_PIDS=pids, LOG_WRITER_CHILD=1)],
                           capsys)
    assert code == 2 and "its log did not grow for 5 s (command.idle_timeout_s) after 2 " \
                          "logged step(s)" in err
    for f in pids.iterdir():  # the command and its child: the whole group is gone
        assert not alive(int(f.read_text()))


def _wait_for(predicate, timeout=60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError("timed out")


def _train(config: Path, *extra) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "rlbatch.cli.main", "train", str(config),
                             "--json", *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def _steps(tmp_path: Path) -> list[dict]:
    runs = tmp_path / "runs"
    if not runs.exists() or not any(runs.iterdir()):
        return []
    return read_jsonl(_run_dir(tmp_path) / "steps.jsonl")[0]


def test_a_stop_file_stops_the_command_as_a_profile_early_stop_does(tmp_path):
    pids = tmp_path / "pids"
    pids.mkdir()
    proc = _train(_config(tmp_path, LOG_WRITER_STEP_S=0.3, LOG_WRITER_PIDS=pids,
                          LOG_WRITER_CHILD=1))
    _wait_for(lambda: len(_steps(tmp_path)) >= 2)
    (_run_dir(tmp_path) / STOP_FILE).write_text("cannot_win: a test")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    summary = json.loads(out.splitlines()[-1])
    assert summary["status"] == "stopped" and summary["stop_code"] == "cannot_win"
    assert summary["samples"] < 640
    for f in pids.iterdir():
        assert not alive(int(f.read_text()))


def test_a_train_killed_outright_takes_its_command_with_it(tmp_path):
    """`rlbatch train` is SIGKILLed while its command, which ignores SIGTERM, hangs: the
    kernel's parent-death signal (SIGKILL, exec_child.py) ends the command too, checked in
    /proc, instead of leaving it holding its GPU."""
    pids = tmp_path / "pids"
    pids.mkdir()
    proc = _train(_config(tmp_path, LOG_WRITER_STEP_S=0.1, LOG_WRITER_HANG_AT=3,
                          LOG_WRITER_TRAP_TERM=1, LOG_WRITER_PIDS=pids))
    _wait_for(lambda: len(_steps(tmp_path)) >= 2)
    command = [int(f.read_text()) for f in pids.iterdir()]
    assert len(command) == 1 and alive(command[0])
    proc.kill()
    proc.communicate(timeout=60)
    _wait_for(lambda: not alive(command[0]), timeout=10)


@pytest.mark.parametrize("fault", ["LOG_WRITER_ROTATE_AT", "LOG_WRITER_TRUNCATE_AT"])
def test_a_rotated_or_truncated_log_keeps_the_rows_already_read(tmp_path, capsys, fault):
    """The stand-in moves its log aside (or truncates it) before step 12 and writes on: the
    run keeps steps 1..11 as read, continues with 12..20, its clock running on (train_s at
    step 20 is the 20 steps' time, not the 9 after the fault, which shortened T in the
    candidate's favour), and a warning names the log."""
    code, out, err = run_cli(["train", _config(tmp_path, LOG_WRITER_STEP_S=0.1,
                                               **{fault: 12}), "--json"], capsys)
    assert code == 0, err
    summary = json.loads(out.splitlines()[-1])
    steps = read_jsonl(_run_dir(tmp_path) / "steps.jsonl")[0]
    assert [r["step"] for r in steps] == list(range(1, 21))
    assert [r["train_s"] for r in steps] == pytest.approx([0.1 * s for s in range(1, 21)])
    warned = [w for w in summary["command"]["warnings"] if "rotated or truncated" in w]
    # the first read after the fault saw either the new rows or, before them, an empty log
    assert len(warned) == 1 and ("start at step 12, after steps 1..11 were read" in warned[0]
                                 or "hold no step, after 11 were read" in warned[0])


def test_a_deleted_log_fails_the_run_in_one_line_and_keeps_its_rows(tmp_path, capsys):
    """The stand-in deletes its log before step 4 and writes on into the deleted file: the
    run fails in one line naming the log (a deleted log is not a run that ended short: its
    later steps happened, unseen), and the 3 steps read are kept for a resume."""
    code, _, err = run_cli(["train", _config(tmp_path, LOG_WRITER_STEP_S=0.1,
                                             LOG_WRITER_DELETE_AT=4)], capsys)
    assert code == 2, err
    errors = [x for x in err.splitlines() if x.startswith("error:")]
    log = _run_dir(tmp_path) / "command" / "attempts" / "001" / "verl.jsonl"
    assert len(errors) == 1 and f"deleted its log {log} (the rows read from it are kept)" \
        in errors[0], err
    steps = read_jsonl(_run_dir(tmp_path) / "steps.jsonl")[0]
    assert [r["step"] for r in steps] == [1, 2, 3]
    summary = read_json(_run_dir(tmp_path) / "summary.json")
    assert summary["status"] == "failed" and "deleted its log" in summary["failure"]


def _one_line_end(tmp_path: Path, capsys, code: int, **env) -> tuple[str, dict]:
    """`rlbatch train` of the stand-in with `env`: it exits `code` with one line on stderr
    (besides the progress lines); that line and the run's summary."""
    got, _, err = run_cli(["train", _config(tmp_path, **env)], capsys)
    lines = [x for x in err.strip().splitlines() if not x.startswith("stand-in: ")]
    assert got == code and len(lines) == 1, err
    return lines[0], read_json(_run_dir(tmp_path) / "summary.json")


def test_a_command_whose_loss_turns_non_finite_is_diverged_not_slow(tmp_path, capsys):
    """The stand-in logs its loss and gradient norm as NaN from step 6 (a diverged update):
    the converter stores them as null ("measured, not finite"), and the run used to go on to
    its budget as a run that was merely slow to cross. Now, after nonfinite.max_consecutive
    (3) such steps in a row, the run is `diverged`, its command is stopped, `rlbatch train`
    exits 3 with one line that says which values and from which step, and a warning names the
    first such step."""
    line, summary = _one_line_end(tmp_path, capsys, 3, LOG_WRITER_STEP_S=0.2,
                                  LOG_WRITER_NAN_FROM=6)
    assert re.fullmatch(r"error: the run diverged: the command logged non-finite actor/loss, "
                        r"actor/grad_norm at \d+ consecutive steps \(6\.\.\d+; "
                        r"nonfinite\.max_consecutive 3\)", line), line
    assert summary["status"] == "diverged" and summary["stop_reason"] == line[len(
        "error: the run "):]
    assert 8 <= summary["steps"] < 20  # stopped once diverged, not run to its budget
    assert "step 6: the command logged actor/loss, actor/grad_norm non-finite (NaN or inf)" \
        in summary["command"]["warnings"]


def test_a_target_metric_that_stops_being_logged_fails_the_run_in_one_line(tmp_path, capsys):
    """The stand-in renames its validation metric from step 8 on, before the target (0.9) is
    crossed: the run used to go on, never crossing, and a profile stopped it `no_crossing` as
    if it were slow. Now the third evaluation without the target metric fails the run with
    one line naming the metric, the last step that had it and what the evaluations log."""
    line, summary = _one_line_end(tmp_path, capsys, 2, LOG_WRITER_STEP_S=0.1,
                                  LOG_WRITER_RENAME_AT=8)
    assert re.search(r"stopped logging the target metric eval/x/reward/mean@1 "
                     r"\(target\.metric\): the last at step 6, none in the \d+ evaluations "
                     r"since \(steps 8\.\.\d+; they log eval/x/score@1\)", line), line
    assert summary["status"] == "failed" and summary["steps"] < 20


def test_non_finite_steps_and_a_lost_target_are_read_from_the_rows():
    from rlbatch.backends.command.health import nonfinite_evals, nonfinite_steps, target_lost

    def step(n, **kw):
        return {"step": n, "actor/loss": 0.1, "actor/grad_norm": 1.0, **kw}

    steps = [step(1), step(2, **{"actor/loss": None}), step(3), step(4, **{"reward/mean": None}),
             step(5, **{"actor/grad_norm": None}), step(6, **{"actor/grad_norm": None})]
    d = nonfinite_steps(steps)
    assert (d.total, d.run, d.run_from, d.keys) == (4, 3, 4, ("actor/grad_norm", "reward/mean"))
    assert (d.first, d.first_keys) == (2, ("actor/loss",))
    assert nonfinite_steps([step(1), {"step": 2}]).total == 0  # a key not logged is not null
    m = "eval/acc"
    evals = [{"step": 0, m: 0.1}, {"step": 2, m: None}, {"step": 4, "eval/other": 1.0},
             {"step": 6, "eval/other": 1.0}]
    assert nonfinite_evals(evals, m) == [2]
    assert target_lost(evals, m) is None  # two without it: not yet
    assert target_lost([*evals, {"step": 8}], m) == (
        "stopped logging the target metric eval/acc (target.metric): the last at step 2, none "
        "in the 3 evaluations since (steps 4..8; they log eval/other)")
    # evaluation sets logged apart, three rows within one interval: not taken for a loss
    apart = [{"step": 0, "samples": 0, m: 0.1}] + [{"step": 2, "samples": 64, "eval/b": 1.0}] * 3
    assert target_lost(apart, m, every=64) is None
    assert target_lost([*apart, {"step": 4, "samples": 128}], m, every=64) is None
    assert target_lost([*apart, {"step": 6, "samples": 192}], m, every=64) is not None
    assert target_lost(evals[2:] + [{"step": 8}], m).startswith(
        "logged no target metric eval/acc (target.metric) in its 3 evaluations (steps 4..8")


def test_a_chatty_commands_output_is_kept_under_its_cap(tmp_path, capsys, monkeypatch):
    """The stand-in prints 20 kB per step (400 kB in all) against a cap set to 50 kB here
    (64 MiB by default): output.log is cut back to its head each time it passes the cap, with
    a line saying how much was cut, so it ends under the cap and one step's output; its head
    is kept, and the bytes cut are counted in the summary."""
    monkeypatch.setattr(command_health, "OUTPUT_CAP", 50_000)
    monkeypatch.setattr(command_health, "OUTPUT_HEAD", 10_000)
    code, out, err = run_cli(["train", _config(tmp_path, LOG_WRITER_STEP_S=0.05,
                                               LOG_WRITER_OUTPUT_BYTES=20_000), "--json"], capsys)
    assert code == 0, err
    summary = json.loads(out.splitlines()[-1])
    output = Path(summary["command"]["output"]).read_bytes()
    assert len(output) <= 50_000 + 20_000, len(output)  # uncapped: 400 kB
    assert output.count(b"bytes of output cut here") >= 1
    assert output.startswith(b"stand-in trainer: steps 1..20")  # its head is kept
    dropped = summary["command"]["output_dropped_bytes"]
    assert dropped > 0 and len(output) + dropped >= 20 * 20_000  # nothing unaccounted for


def test_a_checkpoint_that_fails_every_resume_is_named_not_retried_forever(tmp_path, capsys):
    """Attempt 1 crashes at step 6 after checkpointing step 4; the checkpoint then cannot be
    loaded. Attempts 2 and 3 (each `--resume`) exit 1 before logging a step; it used to be
    retried at every re-run. The fourth re-run is refused before anything starts, in one
    line naming the checkpoint and what to do, exit 2, and no attempt folder is made."""
    once, corrupt = tmp_path / "crashed", tmp_path / "corrupt"
    config = _config(tmp_path, LOG_WRITER_CRASH_AT=6, LOG_WRITER_CRASH_ONCE=once,
                     LOG_WRITER_CORRUPT_CKPT=corrupt)
    code, _, err = run_cli(["train", config], capsys)
    assert code == 2 and "crash at step 6" in err
    corrupt.write_text("")
    for _ in range(2):
        code, _, err = run_cli(["train", config, "--resume"], capsys)
        assert code == 2 and "exited with status 1 after 4 logged step(s)" in err \
            and "cannot load" in err, err
    code, _, err = run_cli(["train", config, "--resume"], capsys)
    lines = [x for x in err.strip().splitlines() if not x.startswith("stand-in: ")]
    run = _run_dir(tmp_path)
    ckpt = run / "command" / "verl-checkpoints" / "global_step_4"
    assert code == 2 and len(lines) == 1, err
    assert lines[0].endswith(
        f"attempts 2 and 3 were each given the checkpoint {ckpt} (step 4) and exited with an "
        "error (status 1, 1) before logging a step after it: the checkpoint may be "
        "unreadable; remove it so that the next attempt does not resume from it, or start "
        "the run over with --fresh"), lines[0]
    assert sorted(p.name for p in (run / "command" / "attempts").iterdir()) == \
        ["001", "002", "003"]
    # removed, the run starts over (verl's auto resume finds no checkpoint) and finishes
    shutil.rmtree(run / "command" / "verl-checkpoints")
    code, out, err = run_cli(["train", config, "--resume", "--json"], capsys)
    assert code == 0 and json.loads(out.splitlines()[-1])["samples"] == 640, err


def test_a_verl_trials_checkpoint_saves_are_not_training_time(tmp_path, capsys):
    """The stand-in saves every 4 steps, 0.3 s each, timed inside the step as verl times it
    (verl-project/verl 1dda039, ray_trainer.py 1508 and 1711): the trial's train_s is the
    steps' own 0.1 s each, the saves out of it (they were in it: train_s at step 20 was
    3.5 s, not 2.0)."""
    code, _, err = run_cli(["train", _config(tmp_path, LOG_WRITER_STEP_S=0.1,
                                               LOG_WRITER_SAVE_S=0.3), "--json"], capsys)
    assert code == 0, err
    steps = read_jsonl(_run_dir(tmp_path) / "steps.jsonl")[0]
    assert [r["train_s"] for r in steps] == pytest.approx([0.1 * s for s in range(1, 21)])
    assert [r["verl/timing_s/save_checkpoint"] for r in steps
            if "verl/timing_s/save_checkpoint" in r] == [0.3] * 5


def test_continue_rows_keeps_what_a_shorter_log_lost():
    """The pure rule: a log that still holds every step read is taken as it is; one that now
    starts later is continued (train_s shifted when it restarted); one cut at its end keeps
    the rows read past the cut."""
    from rlbatch.backends.command.follow import continue_rows

    def rows(first, last, t0=0.0):
        return [{"step": s, "train_s": t0 + s - first + 1} for s in range(first, last + 1)]

    same = continue_rows(rows(1, 3), [], rows(1, 5), [])
    assert same == (rows(1, 5), [], None)
    steps, _, what = continue_rows(rows(1, 5), [], rows(6, 7), [])
    assert [r["step"] for r in steps] == list(range(1, 8)) and \
        [r["train_s"] for r in steps] == [1, 2, 3, 4, 5, 6, 7]
    assert what == "start at step 6, after steps 1..5 were read"
    steps, _, what = continue_rows(rows(1, 5), [], rows(1, 2), [])
    assert [r["step"] for r in steps] == [1, 2, 3, 4, 5] and what.startswith("end at step 2")
    steps, _, what = continue_rows(rows(1, 5), [{"step": 4}], [], [])
    assert steps == rows(1, 5) and what == "hold no step, after 5 were read"


def test_an_attempt_that_started_over_is_not_spliced_as_a_resume(tmp_path, capsys):
    """The stand-in crashes after step 5 (its checkpoint: step 4); the resumed attempt is
    given that checkpoint but starts over from step 1, as a trainer that could not load it
    does. Its rows are the run's rows from step 1, on its own clock; spliced after the first
    attempt's steps 1..4, steps 1..4 would have been trained twice and their time counted
    once more than the learning curve shows."""
    once, restart = tmp_path / "crashed", tmp_path / "restart"
    config = _config(tmp_path, LOG_WRITER_STEP_S=0.1, LOG_WRITER_CRASH_AT=6,
                     LOG_WRITER_CRASH_ONCE=once, LOG_WRITER_RESTART_IF=restart)
    code, _, err = run_cli(["train", config], capsys)
    assert code == 2 and once.exists(), err
    restart.write_text("ignore the checkpoint")
    code, out, err = run_cli(["train", config, "--resume", "--json"], capsys)
    assert code == 0, err
    summary = json.loads(out.splitlines()[-1])
    run = _run_dir(tmp_path)
    second = json.loads((run / "command" / "attempts" / "002" / "attempt.json").read_text())
    assert second["resume_step"] == 4
    steps = read_jsonl(run / "steps.jsonl")[0]
    assert [r["step"] for r in steps] == list(range(1, 21))
    assert [r["train_s"] for r in steps] == pytest.approx([0.1 * s for s in range(1, 21)])
    assert any("attempt 2 was given the checkpoint at step 4 but logged step 1 again" in w
               for w in summary["command"]["warnings"])


def test_a_kill_inside_a_verl_checkpoint_save_resumes_from_the_one_before(tmp_path, capsys):
    """verl saves inside the step, before logging it, and names the new checkpoint in its
    tracker file last (ray_trainer.py `_save_checkpoint`, 1dda039; the stand-in's `_save`): a
    SIGKILL inside the save at step 8 leaves steps 1..7 logged, `global_step_8` half-written
    and the tracker at 4. The resumed attempt continues from step 4, and the run's rows are
    the uninterrupted run's: steps 1..20 once each, 0.1 s a step."""
    once = tmp_path / "killed"
    config = _config(tmp_path, LOG_WRITER_STEP_S=0.1, LOG_WRITER_KILL_IN_SAVE_AT=8,
                     LOG_WRITER_CRASH_ONCE=once)
    code, _, err = run_cli(["train", config], capsys)
    assert code == 2 and once.exists(), err
    run = _run_dir(tmp_path)
    assert [r["step"] for r in read_jsonl(run / "steps.jsonl")[0]] == list(range(1, 8))
    code, _, err = run_cli(["train", config, "--resume"], capsys)
    assert code == 0, err
    second = json.loads((run / "command" / "attempts" / "002" / "attempt.json").read_text())
    assert second["resume_step"] == 4
    steps = read_jsonl(run / "steps.jsonl")[0]
    assert [r["step"] for r in steps] == list(range(1, 21))
    assert [r["train_s"] for r in steps] == pytest.approx([0.1 * s for s in range(1, 21)])
    evals = read_jsonl(run / "evals.jsonl")[0]
    assert [e["step"] for e in evals] == [0, *range(2, 21, 2)]


def test_a_run_failed_by_a_bad_log_line_resumes_once_the_trainer_is_fixed(tmp_path, capsys):
    """The stand-in writes a line that is not verl's before step 7 (its checkpoint: step 4):
    the run fails in one line, and the re-run resumes it from the checkpoint with the rows
    read before the bad line (steps 1..4) joined to the new attempt's. The first attempt's
    log is not read again: it used to fail every re-run within a second, as it said it
    would resume."""
    once = tmp_path / "bad-line-written"
    config = _config(tmp_path, LOG_WRITER_STEP_S=0.1, LOG_WRITER_BAD_LINE_AT=7,
                     LOG_WRITER_CRASH_ONCE=once)
    code, _, err = run_cli(["train", config], capsys)
    assert code == 2 and once.exists() and "its log cannot be read" in err, err
    code, out, err = run_cli(["train", config, "--resume", "--json"], capsys)
    assert code == 0, err
    run = _run_dir(tmp_path)
    steps = read_jsonl(run / "steps.jsonl")[0]
    assert [r["step"] for r in steps] == list(range(1, 21))
    assert [r["train_s"] for r in steps] == pytest.approx([0.1 * s for s in range(1, 21)])
    second = json.loads((run / "command" / "attempts" / "002" / "attempt.json").read_text())
    assert second["resume_step"] == 4 and json.loads(out.splitlines()[-1])["steps"] == 20


def test_a_run_begun_by_an_earlier_release_is_resumed_not_started_over(tmp_path, capsys):
    """A failed run as an earlier release left it: its config.yaml lacks a setting added
    since (`rollout.simulated_latency_s`, default 0) and still has the `profile` section
    that release counted, so its directory carries another id. `rlbatch train --resume`
    finds it (core/runmatch.py), says so in one line, and continues it from its checkpoint
    there, instead of starting the run over in a new directory."""
    once = tmp_path / "crashed"
    config = _config(tmp_path, LOG_WRITER_STEP_S=0.05, LOG_WRITER_CRASH_AT=6,
                     LOG_WRITER_CRASH_ONCE=once)
    code, _, err = run_cli(["train", config], capsys)
    assert code == 2, err
    run = _run_dir(tmp_path)
    older = run.with_name(run.name.rsplit("-", 1)[0] + "-0ldre1ea")
    disown(run)  # the first run's lock, which this process still holds (a separate process
    run.rename(older)  # in real use)
    recorded = yaml.safe_load((older / "config.yaml").read_text())
    assert recorded["rollout"].pop("simulated_latency_s") == 0.0
    recorded["profile"] = {"seeds": 1, "statistic": "crossing"}
    (older / "config.yaml").write_text(yaml.safe_dump(recorded))
    code, _out, err = run_cli(["train", config, "--resume", "--json"], capsys)
    assert code == 0, err
    assert [p.name for p in (tmp_path / "runs").iterdir()] == [older.name]
    notes = [x for x in err.splitlines() if x.startswith("note: ")]
    assert notes == [(f"note: {older} was written by an earlier rlbatch (its id today would be "
                     f"{run.name}); its recorded config is this run's, the settings added "
                     "since at their defaults (rollout.simulated_latency_s): it is this run, "
                     "continued as it is")]
    second = json.loads((older / "command" / "attempts" / "002" / "attempt.json").read_text())
    assert second["resume_step"] == 4
    assert [r["step"] for r in read_jsonl(older / "steps.jsonl")[0]] == list(range(1, 21))


def test_an_earlier_release_run_is_matched_only_when_nothing_else_differs():
    """What runmatch accepts: settings the record lacks at their current default; what it
    refuses: such a setting at another value, a changed value, a setting the record has that
    no longer exists, a derived value that changed."""
    from rlbatch.core.loading import load_config
    from rlbatch.core.runmatch import added_at_default

    resolved = load_config(preset="grpo-tiny").resolved_dict()

    def without(d: dict, section: str, key: str) -> dict:
        out = json.loads(json.dumps(d))
        del out[section][key]
        return out

    older = without(resolved, "rollout", "simulated_latency_s")
    assert added_at_default(resolved, older) == ["rollout.simulated_latency_s"]
    assert added_at_default(resolved, resolved) == []
    latency = json.loads(json.dumps(resolved))
    latency["rollout"]["simulated_latency_s"] = 0.25
    assert added_at_default(latency, older) is None
    changed = json.loads(json.dumps(older))
    changed["batch"]["prompts_per_step"] += 1
    assert added_at_default(resolved, changed) is None
    gone = json.loads(json.dumps(resolved))
    gone["rollout"]["a_setting_since_removed"] = 1
    assert added_at_default(resolved, gone) is None
    derived = json.loads(json.dumps(older))
    derived["derived"]["actor_lr"] *= 2
    assert added_at_default(resolved, derived) is None


def test_a_daemon_the_command_left_behind_ends_with_the_run(tmp_path):
    """The command leaves a daemon that called `setsid` with an empty environment (outside
    its process group, without its token) and then finishes its budget. `rlbatch train`,
    its subreaper, adopted the daemon and stops it when the run ends: gone from /proc."""
    pids = tmp_path / "pids"
    pids.mkdir()
    proc = _train(_config(tmp_path, LOG_WRITER_PIDS=pids, LOG_WRITER_DAEMON=1))
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert json.loads(out.splitlines()[-1])["status"] == "target_reached"
    daemon = int((pids / "daemon.pid").read_text())
    try:
        _wait_for(lambda: not alive(daemon), timeout=10)
    finally:  # where the run did not stop it, the test does
        with contextlib.suppress(ProcessLookupError):
            os.kill(daemon, signal.SIGKILL)


def test_sigterm_is_written_down_and_resume_continues_from_the_checkpoint(tmp_path):
    """Killed after step 5 (its checkpoint: step 4), resumed: the rows of steps 5.. come from
    the second attempt, train_s runs on from step 4's, nothing is lost or logged twice."""
    config = _config(tmp_path, LOG_WRITER_STEP_S=0.3)
    proc = _train(config)
    _wait_for(lambda: len(_steps(tmp_path)) >= 5)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, err
    run = _run_dir(tmp_path)
    first = read_jsonl(run / "steps.jsonl")[0]
    assert read_json(run / "summary.json")["failure"] == "terminated by SIGTERM"
    kept = [r for r in first if r["step"] <= 4]
    resumed = _train(config, "--resume")
    out, err = resumed.communicate(timeout=120)
    assert resumed.returncode == 0, err
    steps = read_jsonl(run / "steps.jsonl")[0]
    assert [r["step"] for r in steps] == list(range(1, 21))
    assert steps[:4] == kept  # the first attempt's rows up to its checkpoint, unchanged
    # 5 tokens x 32 sequences a step, counted on across the resume (the second attempt's
    # converter counts from its own first step)
    assert [r["tokens"] for r in steps] == [160 * s for s in range(1, 21)]
    t = [r["train_s"] for r in steps]
    assert all(b > a for a, b in itertools.pairwise(t)) and t[4] == pytest.approx(t[3] + 0.3)
    second = json.loads((run / "command" / "attempts" / "002" / "attempt.json").read_text())
    assert second["resume_step"] == 4
    assert _pairs(second["argv"])["trainer.val_before_train"] == "false"
    summary = json.loads(out.splitlines()[-1])
    assert summary["command"]["attempts"] == 2 and summary["steps"] == 20


def test_bad_command_config_is_one_line_before_anything_is_written(tmp_path, capsys):
    path = _config(tmp_path)
    cfg = yaml.safe_load(path.read_text())
    cfg["command"]["argv"] = ["no-such-trainer-program"]
    path.write_text(yaml.safe_dump(cfg))
    code, _, err = run_cli(["train", path], capsys)
    assert code == 2 and err.strip().splitlines() == [
        ("error: command.argv[0]: 'no-such-trainer-program' is not an executable program on "
         f"PATH (or relative to {os.getcwd()})")]
    assert not (tmp_path / "runs").exists()
    code, _, err2 = run_cli(["config", "check", path], capsys)  # checks what train checks
    assert code == 2 and err2 == err
    code, _, err = run_cli(["train", "--preset", "grpo-tiny", "--set", "backend=command"],
                           capsys)
    assert code == 2 and "backend: command and a command: section go together" in err


def test_the_program_is_looked_up_as_the_command_will_run_it(tmp_path, capsys):
    """The command runs with `command.env` over rlbatch's environment, so a program found only
    on `command.env.PATH` is accepted; a folder named as the program is refused in one line
    (it would fail every trial with exit 127)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    program = bin_dir / "my-trainer"
    program.write_text("#!/bin/sh\nexit 0\n")
    program.chmod(0o755)
    (tmp_path / "a-folder").mkdir()
    path = _config(tmp_path)
    cfg = yaml.safe_load(path.read_text())
    cfg["command"]["argv"] = ["my-trainer"]
    cfg["command"]["env"] = {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    path.write_text(yaml.safe_dump(cfg))
    code, _, err = run_cli(["config", "check", path], capsys)
    assert code == 0, err
    cfg["command"]["env"] = {"PATH": "/nonexistent"}
    path.write_text(yaml.safe_dump(cfg))
    code, _, err = run_cli(["config", "check", path], capsys)
    assert code == 2 and err.strip().splitlines() == [
        ("error: command.argv[0]: 'my-trainer' is not an executable program on "
         f"command.env.PATH (or relative to {os.getcwd()})")]
    cfg["command"] = {**cfg["command"], "argv": ["./a-folder"], "env": {},
                      "workdir": str(tmp_path)}
    path.write_text(yaml.safe_dump(cfg))
    code, _, err = run_cli(["config", "check", path], capsys)
    assert code == 2 and err.strip().splitlines() == [
        ("error: command.argv[0]: './a-folder' is not an executable program on PATH (or "
         f"relative to {tmp_path})")]


def test_trials_and_shims_start_with_the_working_directory_last_on_sys_path(tmp_path):
    """Files named like standard modules beside the user's run (`inspect.py`, `typing.py`,
    `ctypes.py`) break `python -m`, which puts the working directory first on sys.path: that
    is shown first, so the test fails wherever the fault does not exist. A profile's trial
    (`trial_command`) and the command's exec shim start through core/launch.py instead: the
    trial reaches its own error about the missing config, the shim runs its program, and a
    module of the working directory (a reward module) is still found, last."""
    from rlbatch.core.launch import module_argv
    from rlbatch.profile.executors import trial_command

    for name in ("inspect", "typing", "ctypes"):
        (tmp_path / f"{name}.py").write_text(f'raise ImportError("the user\'s {name}.py")\n')
    (tmp_path / "mymod.py").write_text(
        "import sys\nprint(sys.argv[1:], sys.path.index('') == len(sys.path) - 1)\n")
    env = dict(os.environ, PYTHONUNBUFFERED="1")

    def run(argv: list[str]) -> subprocess.CompletedProcess:
        return subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True,
                              check=False, timeout=120)

    plain = run([sys.executable, "-m", "rlbatch.cli.main", "--help"])
    assert plain.returncode == 1 and "ImportError: the user's" in plain.stderr
    trial = run(trial_command(tmp_path / "missing.yaml"))
    assert trial.returncode == 2, trial.stderr[-2000:]
    assert trial.stderr.startswith("error:") and "missing.yaml" in trial.stderr
    assert "ImportError" not in trial.stderr
    shim = run(module_argv("rlbatch.backends.command.exec_child", str(os.getpid()),
                           sys.executable, "-c", "print('the program ran')"))
    assert (shim.returncode, shim.stdout) == (0, "the program ran\n"), shim.stderr[-2000:]
    mine = run(module_argv("mymod", "a", "b"))
    assert (mine.returncode, mine.stdout) == (0, "['a', 'b'] True\n"), mine.stderr
