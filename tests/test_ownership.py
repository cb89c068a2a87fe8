"""One owner per run directory, exit codes that tell the truth, signals, the resume check,
escaped reward errors and reward workers' process groups (issue 32; docs/reliability.md).

The two-process, signal and forking cases run the real CLI in real processes; the rewards
that misbehave are in tests/helpers/hostile_rewards.py.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from helpers.procs import alive, with_default_stop_signals
from rlbatch.core.config import RewardConfig
from rlbatch.core.errors import ConfigError, RunFailed, sanitize, stop_signal
from rlbatch.core.loading import load_config
from rlbatch.core.ownership import LOCK_FILE, InUse, disown, own
from rlbatch.core.runlog import atomic_write_json, read_json, read_run
from rlbatch.rollout.reward_runner import Call, RewardRunner, call_in_process
from rlbatch.rollout.tasks import Example

# every trained test here holds wherever a run lands (tests/README.md)
pytestmark = pytest.mark.landing_free

HELPERS = Path(__file__).resolve().parent / "helpers"
T512 = ["budget.max_samples=512", "eval.every_samples=256", "eval.prompts=64"]
HOST = socket.gethostname()


def _env(**extra) -> dict:
    path = os.pathsep.join(p for p in (str(HELPERS), os.environ.get("PYTHONPATH")) if p)
    return dict(os.environ, PYTHONPATH=path, PYTHONUNBUFFERED="1", **extra)


def _train_cmd(out: Path, sets: list[str]) -> list[str]:
    return [sys.executable, "-m", "rlbatch.cli.main", "train", "--preset", "grpo-tiny",
            "--out", str(out), *[x for s in sets for x in ("--set", s)]]


def _wait(predicate, proc=None, timeout=300.0, what="the condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (found := predicate()):
            return found
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"process ended ({proc.returncode}) before {what}: "
                                 f"{proc.communicate()[1][-2000:]}")
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _owner_pid(root: Path) -> int | None:
    for lock in root.glob(f"*/{LOCK_FILE}"):
        try:
            return json.loads(lock.read_text())["pid"]
        except (OSError, ValueError, KeyError):
            return None
    return None


# ---------------------------------------------------------------- one owner

def test_a_second_process_is_refused_and_a_dead_owners_lock_is_taken_over(tmp_path):
    holder = subprocess.Popen(
        [sys.executable, "-c", ("import sys, time\nfrom rlbatch.core.ownership import own\n"
         "own(sys.argv[1], 'run directory'); print('owned', flush=True); time.sleep(600)"),
         str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "owned"
        with pytest.raises(InUse, match=rf"run directory .* is in use by PID {holder.pid} on "
                                        rf"host {HOST} "):
            own(tmp_path, "run directory")
    finally:
        holder.kill()
        holder.wait()
    own(tmp_path, "run directory")  # its owner died: the kernel released the lock
    try:
        assert json.loads((tmp_path / LOCK_FILE).read_text())["pid"] == os.getpid()
        own(tmp_path, "run directory")  # re-entrant within one process
    finally:
        disown(tmp_path)


def _hold(directory: Path) -> subprocess.Popen:
    """A process that owns `directory` until it is killed."""
    holder = subprocess.Popen(
        [sys.executable, "-c", ("import sys, time\nfrom rlbatch.core.ownership import own\n"
         "own(sys.argv[1], 'x'); print('owned', flush=True); time.sleep(600)"),
         str(directory)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "owned"
    return holder


def test_a_second_profile_on_one_folder_is_refused_before_it_runs(tmp_path, capsys):
    from helpers.cli import run_cli

    out = tmp_path / "p"
    out.mkdir()
    holder = _hold(out)
    try:
        code, _, err = run_cli(["profile", "--preset", "quick", "--out", out], capsys)
    finally:
        holder.kill()
        holder.wait()
    lines = [x for x in err.splitlines() if x.strip()]
    assert code == 2 and len(lines) == 1, err
    assert lines[0].startswith(f"error: profile directory {out.resolve()} is in use by PID "
                               f"{holder.pid} on host {HOST} ")
    assert sorted(p.name for p in out.iterdir()) == [LOCK_FILE]  # nothing else made


@pytest.mark.trained
def test_two_trainings_on_one_out_the_second_is_refused_and_the_first_is_intact(tmp_path):
    """The issue's case: `rlbatch train T512 --out r` twice. The first owner is paused
    (SIGSTOP) while it holds the run, so the second, `--fresh` and `--resume` all meet a live
    owner whatever the machine's speed; then it finishes with one row per step."""
    out = tmp_path / "r"
    first = subprocess.Popen(_train_cmd(out, T512), env=_env(), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        _wait(lambda: _owner_pid(out) == first.pid, first, what="the first to own its run")
        first.send_signal(signal.SIGSTOP)
        for extra in ([], ["--fresh"], ["--resume"]):
            second = subprocess.run(_train_cmd(out, T512) + extra, env=_env(),
                                    capture_output=True, text=True, timeout=600, check=False)
            lines = second.stderr.strip().splitlines()
            assert second.returncode == 2, second.stderr
            assert len(lines) == 1 and "Traceback" not in second.stderr
            assert f"is in use by PID {first.pid} on host {HOST} " in lines[0], lines
        first.send_signal(signal.SIGCONT)
        _, err = first.communicate(timeout=600)
    finally:
        first.kill()
    assert first.returncode == 0, err
    run = read_run(next(out.iterdir()))
    assert [r["step"] for r in run.steps] == [1, 2, 3, 4]
    assert [r["step"] for r in run.evals] == [0, 2, 4]
    reached = run.summary["target"]["reached"]
    assert run.summary["status"] == ("target_reached" if reached else "budget_exhausted")


# ---------------------------------------------------------------- the resume check

def _new_run(tmp_path):
    from rlbatch.backends.builtin.runstate import open_run

    cfg = load_config(None, preset="grpo-tiny", overrides=[f"output_dir={tmp_path}"])
    state = open_run(cfg)
    atomic_write_json(state.dir / "summary.json", {"status": "failed", "failure": "x"})
    return cfg, state


def test_resume_refuses_a_run_whose_recorded_config_was_edited(tmp_path):
    from rlbatch.backends.builtin.runstate import open_run

    cfg, state = _new_run(tmp_path)
    try:
        path = state.dir / "config.yaml"
        recorded = yaml.safe_load(path.read_text())
        recorded["optimizer"]["reference_lr"] = 0.01
        path.write_text(yaml.safe_dump(recorded, sort_keys=False))
        with pytest.raises(ConfigError) as info:
            open_run(cfg, resume=True)
        message = str(info.value)
        assert message.startswith(f"{path}: no longer matches its run id {state.dir.name} "
                                  "(changed: optimizer.reference_lr)")
        assert "\n" not in message
        path.write_text(yaml.safe_dump(cfg.resolved_dict(), sort_keys=False))
        assert open_run(cfg, resume=True).resuming  # restored: it resumes
    finally:
        disown(state.dir)


def test_sys_exit_inside_a_run_is_a_failure_not_exit_status_0(tmp_path):
    from rlbatch.backends.builtin.runstate import run_recorded

    _, state = _new_run(tmp_path)
    try:
        state.truncate_logs()
        with pytest.raises(RunFailed, match=r"run failed: SystemExit: 0$"):
            run_recorded(state, lambda: sys.exit(0), lambda: None)
        summary = read_json(state.dir / "summary.json")
        assert summary["status"] == "failed" and summary["failure"] == "SystemExit: 0"
    finally:
        disown(state.dir)



def test_a_stop_signal_that_library_code_replaced_still_ends_the_run_as_the_signal(tmp_path):
    """SIGTERM inside `torch.save`: its zip writer's cleanup raises a RuntimeError of its own
    while the signal's exception unwinds through it. The run still ends as terminated (exit
    143 in the CLI), not as that RuntimeError (exit 1)."""
    import io
    import signal

    import torch

    from rlbatch.backends.builtin.runstate import run_recorded
    from rlbatch.core.errors import Terminated, stop_signal

    class SignalMidWrite(io.BytesIO):
        def write(self, data):
            if self.tell() > 1024:
                raise stop_signal(signal.SIGTERM)  # what cli.common's handler raises
            return super().write(data)

    def body():
        torch.save({"w": torch.zeros(4096)}, SignalMidWrite())

    _, state = _new_run(tmp_path)
    try:
        state.truncate_logs()
        with pytest.raises(Terminated) as info:
            run_recorded(state, body, lambda: None)
        assert info.value.__cause__ is not None  # torch's own error, kept as the cause
        summary = read_json(state.dir / "summary.json")
        assert summary["status"] == "failed" and summary["failure"] == "terminated by SIGTERM"
    finally:
        stop_signal(None)
        disown(state.dir)

# ---------------------------------------------------------------- rewards

def test_sanitize_escapes_terminal_control_characters():
    text = "\x1b[2J\x1b[31mFAKE: all good\r\x07\x08\x7f\x9b\u202e é\n\t"
    assert sanitize(text) == "\\x1b[2J\\x1b[31mFAKE: all good\\r\\x07\\x08\\x7f\\x9b\\u202e é" \
                             "\\n\\t"
    assert sanitize(text, multiline=True).endswith("é\n\t")


def _pool(monkeypatch, name: str, timeout_s: float = 30.0, workers: int = 2) -> RewardRunner:
    monkeypatch.syspath_prepend(str(HELPERS))
    runner = RewardRunner(None, f"hostile_rewards:{name}", 1e-6,
                          RewardConfig(workers=workers, timeout_s=timeout_s))
    assert runner.pooled
    return runner


@pytest.mark.parametrize("name, message", [
    ("escape", "RuntimeError: \\x1b[2J\\x1b[31mFAKE: all good"),
    ("exits_0", ("the reward function raised SystemExit(0); a reward must return a value, "
                "not exit or interrupt the run")),
    ("exits_3", "the reward function raised SystemExit(3); "),
    ("interrupts", "the reward function raised KeyboardInterrupt; "),
])
def test_pool_reward_faults_are_one_safe_line_each(monkeypatch, capfd, name, message):
    runner = _pool(monkeypatch, name)
    try:
        scored = runner.score([Call("p", "ok", Example("p", "ok"), i) for i in range(8)])
        assert runner.pool.replaced == 0  # a fault, not a dead worker
    finally:
        runner.close()
    assert scored.faults == ["error"] * 8
    assert all(m.startswith(message) for m in scored.messages), scored.messages[0]
    assert "\x1b" not in scored.messages[0] and "\r" not in scored.messages[0]
    err = capfd.readouterr().err
    assert "Traceback" not in err and "\x1b" not in err


@pytest.mark.parametrize("name, message", [
    ("escape_cheap", "RuntimeError: \\x1b[2J\\x1b[31mFAKE: all good"),
    ("exits_0_cheap", "the reward function raised SystemExit(0); "),
    ("interrupts_cheap", "the reward function raised KeyboardInterrupt; "),
])
def test_in_process_reward_faults_are_named(monkeypatch, name, message):
    monkeypatch.syspath_prepend(str(HELPERS))
    import hostile_rewards

    fn = getattr(hostile_rewards, name)
    call = Call("p", "ok", Example("p", "ok"), 0)
    previous = signal.signal(signal.SIGINT, lambda *a: None)  # as `rlbatch train` installs one
    try:
        kind, value, text = call_in_process(fn, call)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert kind == "error" and value is None and text.startswith(message), text
    try:  # a stop signal that arrived meanwhile is raised, whatever the function did
        stop_signal(signal.SIGTERM)
        with pytest.raises(Exception, match="terminated by SIGTERM"):
            call_in_process(lambda p, c, e: 1.0, call)
    finally:
        stop_signal(None)


def _pids(folder: Path) -> list[int]:
    return [int(p.name) for p in folder.iterdir()]


def test_children_of_pool_rewards_die_with_their_worker(monkeypatch, tmp_path):
    """A reward that starts a child: the child is killed with its worker's process group,
    when the pool closes and when a hung worker is replaced."""
    monkeypatch.setenv("HOSTILE_PIDS", str(tmp_path))
    runner = _pool(monkeypatch, "forks")
    try:
        assert runner.score([Call("p", "ok", Example("p", "ok"), i) for i in range(8)]).values \
            == [1.0] * 8
        children = _wait(lambda: _pids(tmp_path), what="the children's PIDs")
        assert all(alive(pid) for pid in children)
    finally:
        runner.close()
    _wait(lambda: not any(alive(pid) for pid in children), timeout=10, what="children to die")
    for p in tmp_path.iterdir():
        p.unlink()
    runner = _pool(monkeypatch, "forks_then_hangs", timeout_s=1.0, workers=1)
    try:
        scored = runner.score([Call("p", "ok", Example("p", "ok"), 0)])
        assert scored.faults == ["timeout"] and runner.pool.replaced == 1
        child = _pids(tmp_path)
        assert len(child) == 1
        _wait(lambda: not alive(child[0]), timeout=10, what="the replaced worker's child")
    finally:
        runner.close()


@pytest.mark.trained
def test_a_forking_reward_leaves_no_child_after_the_run(tmp_path):
    pids = tmp_path / "pids"
    pids.mkdir()
    res = subprocess.run(_train_cmd(tmp_path / "r", [*T512, "task.reward=hostile_rewards:forks",
                                                     "reward.workers=2"]),
                         env=_env(HOSTILE_PIDS=str(pids)), capture_output=True, text=True,
                         check=False, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    children = _pids(pids)
    assert len(children) >= 2  # one per worker
    _wait(lambda: not any(alive(pid) for pid in children), timeout=10, what="children to die")


@pytest.mark.trained
@pytest.mark.parametrize("reward, workers, message", [
    ("escape_cheap", 2, "RuntimeError: \\x1b[2J\\x1b[31mFAKE: all good"),
    ("escape", 2, "RuntimeError: \\x1b[2J\\x1b[31mFAKE: all good"),
    ("exits_0_cheap", 2, "the reward function raised SystemExit(0)"),
    ("interrupts", 2, "the reward function raised KeyboardInterrupt"),
])
def test_reward_faults_through_the_cli_are_named_and_escaped(tmp_path, reward, workers,
                                                             message):
    res = subprocess.run(_train_cmd(tmp_path, [*T512, f"task.reward=hostile_rewards:{reward}",
                                               f"reward.workers={workers}"]),
                         env=_env(), capture_output=True, text=True, timeout=900, check=False)
    assert res.returncode == 2, res.stderr[-3000:]
    assert "\x1b" not in res.stderr and "\r" not in res.stderr
    assert "Traceback" not in res.stderr
    lines = [x for x in res.stderr.splitlines() if not x.startswith("grpo-tiny: ")]
    assert len(lines) <= 3, lines  # one fault line, the error line, at most a progress line
    assert message in lines[0], lines
    assert lines[-1].startswith("error: task.reward: hostile_rewards:")
    run_dir = next(tmp_path.iterdir())
    summary = read_json(run_dir / "summary.json")
    assert summary["status"] == "failed"
    faults = (run_dir / "reward_errors.jsonl").read_text()
    assert "\x1b" not in faults and json.loads(faults.splitlines()[0])["message"].startswith(
        message)


@pytest.mark.trained
def test_os_exit_in_an_in_process_reward_leaves_a_resumable_interrupted_run(tmp_path):
    """`os._exit` runs no Python code after it, so nothing records it (docs/reliability.md):
    the exit status is the function's, the summary stays `running`, and the next `train`
    of that config names the run as interrupted and offers --resume, which continues it."""
    sets = [*T512, "task.reward=hostile_rewards:os_exit_cheap"]
    res = subprocess.run(_train_cmd(tmp_path, sets), env=_env(), capture_output=True,
                         text=True, timeout=900, check=False)
    assert res.returncode == 0 and res.stdout == "", (res.returncode, res.stderr[-2000:])
    run_dir = next(p for p in tmp_path.iterdir() if p.is_dir())
    assert read_json(run_dir / "summary.json")["status"] == "running"
    again = subprocess.run(_train_cmd(tmp_path, sets), env=_env(), capture_output=True,
                           text=True, timeout=900, check=False)
    lines = again.stderr.strip().splitlines()
    assert again.returncode == 2 and len(lines) == 1, again.stderr
    assert "holds an interrupted run: pass --resume" in lines[0]


# ---------------------------------------------------------------- signals

@pytest.mark.trained
@pytest.mark.parametrize("sig, times, code, failure", [
    (signal.SIGHUP, 1, 128 + signal.SIGHUP, "terminated by SIGHUP"),
    (signal.SIGINT, 5, 130, "interrupted by SIGINT"),
])
def test_signals_are_written_down_once_and_without_a_traceback(tmp_path, sig, times, code,
                                                               failure):
    """SIGHUP (a closed terminal) is handled as SIGTERM is; five Ctrl-Cs 2 ms apart cannot
    skip the status write, nor reach the exit's atexit callbacks."""
    proc = subprocess.Popen(with_default_stop_signals(
        _train_cmd(tmp_path, [*T512, "budget.max_samples=4096"])), env=_env(),
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        steps = _wait(lambda: next((p for p in tmp_path.glob("*/steps.jsonl")
                                    if p.read_text().strip()), None), proc, what="a step")
        for _ in range(times):
            proc.send_signal(sig)
            time.sleep(0.002)
        _, err = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert proc.returncode == code, err
    assert "Traceback" not in err and "Exception ignored" not in err, err
    summary = read_json(steps.parent / "summary.json")
    assert summary["status"] == "failed" and summary["failure"] == failure
    assert summary["steps"] < 32


# ---------------------------------------------------------------- inputs that void a run

@pytest.mark.parametrize("key", ["rollout.temperature", "eval.temperature"])
def test_a_temperature_below_the_floor_is_refused(key):
    with pytest.raises(ConfigError, match=rf"{key}: Input should be greater than or equal to "
                                          r"0.01 \(got '1e-320'\)"):
        load_config(None, preset="grpo-tiny", overrides=[f"{key}=1e-320"])
    assert load_config(None, preset="grpo-tiny", overrides=[f"{key}=0.01"])


def test_eval_prompts_beyond_the_held_out_set_names_both_numbers(tmp_path):
    from rlbatch.core.config import TaskConfig
    from rlbatch.rollout.datasets import build_task, check_eval_prompts

    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{100 + i}+1=", "answer": str(101 + i)})
                            + "\n" for i in range(40)))
    task = build_task(TaskConfig(name="dataset", path=str(data)))
    with pytest.raises(ConfigError) as info:
        check_eval_prompts(task, 64, str(data))
    assert str(info.value) == (f"eval.prompts = 64 is more than the 4 held-out prompts of {data}"
                               ": set eval.prompts to at most 4, or give a larger held-out set "
                               "with task.eval_path")
    check_eval_prompts(task, 4, str(data))
    check_eval_prompts(build_task(TaskConfig(name="addition")), 10**6)  # drawn, not listed


def test_an_accuracy_outside_0_1_is_warned_about_once(tmp_path, capsys):
    _, state = _new_run(tmp_path)
    try:
        state.truncate_logs()
        capsys.readouterr()
        for step, acc in ((0, 0.5), (1, 2.66e29), (2, -1.0)):
            state.log_eval({"step": step, "samples": step, "train_s": 0.0,
                            "eval/accuracy": acc}, 0.0)
        err = capsys.readouterr().err.splitlines()
    finally:
        state.writer.close()
        disown(state.dir)
    assert err == [("warning: eval/accuracy = 2.66e+29 at step 1 is outside [0, 1]: task.reward "
                   "exact returns values outside [0, 1], so eval/accuracy is not an accuracy "
                   "and a target on it means little")]


def test_a_symlink_loop_as_a_dataset_is_named(tmp_path):
    from rlbatch.core.errors import DataError
    from rlbatch.rollout.datasets import load_rows

    (tmp_path / "a.jsonl").symlink_to(tmp_path / "b.jsonl")
    (tmp_path / "b.jsonl").symlink_to(tmp_path / "a.jsonl")
    (tmp_path / "c.jsonl").symlink_to(tmp_path / "gone.jsonl")
    with pytest.raises(DataError, match=r"a\.jsonl: a symbolic link loop \(too many levels"):
        load_rows(str(tmp_path / "a.jsonl"))
    with pytest.raises(DataError, match=r"c\.jsonl: a symbolic link to '.*gone\.jsonl', which "
                                        r"does not exist"):
        load_rows(str(tmp_path / "c.jsonl"))
    with pytest.raises(DataError, match=r"d\.jsonl: file not found$"):
        load_rows(str(tmp_path / "d.jsonl"))


def test_a_signal_ignored_at_start_stays_ignored():
    """`nohup rlbatch train` ignores SIGHUP, and `rlbatch train &` in a script ignores SIGINT:
    the trainer's handlers must not undo that."""
    code = ("import os, signal\nfrom rlbatch.cli.common import stop_signals\n"
            "signal.signal(signal.SIGHUP, signal.SIG_IGN)\nwith stop_signals():\n"
            "    os.kill(os.getpid(), signal.SIGHUP)\n"
            "    print(signal.getsignal(signal.SIGHUP) is signal.SIG_IGN)\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=False)
    assert res.returncode == 0 and res.stdout.strip() == "True", res.stderr


@pytest.mark.slow
@pytest.mark.trained
def test_a_hand_started_train_cannot_take_a_running_profile_trial(tmp_path):
    """A profile's trial is an `rlbatch train` process that owns its run directory: a user's
    own `rlbatch train` of the same trial config (plain, `--fresh` or `--resume`) is refused
    in one line naming the trial's PID while the trial lives. The trial is paused (SIGSTOP)
    meanwhile, so this holds whatever the machine's speed. Slow: the lock it meets is the
    one every `rlbatch train` takes, checked fast by
    test_two_trainings_on_one_out_the_second_is_refused_and_the_first_is_intact (plain,
    `--fresh` and `--resume` refused in one line naming the owner's PID)."""
    out = tmp_path / "p"
    profile = subprocess.Popen(
        [sys.executable, "-m", "rlbatch.cli.main", "profile", "--preset", "quick", "--follow",
         "0", "--out", str(out)], env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def trial_lock():
        for lock in out.rglob(LOCK_FILE):
            try:
                info = json.loads(lock.read_text())
            except (OSError, ValueError):
                continue
            if info.get("pid") not in (None, profile.pid):
                return info
        return None

    trial = None
    try:
        info = _wait(trial_lock, profile, timeout=600, what="a trial to own its run")
        trial = info["pid"]
        os.kill(trial, signal.SIGSTOP)
        assert info["command"].startswith("rlbatch train "), info
        argv = Path(f"/proc/{trial}/cmdline").read_bytes().split(b"\0")
        config = os.fsdecode(argv[argv.index(b"train") + 1])  # the trial's own config file
        for extra in ([], ["--fresh"], ["--resume"]):
            hand = subprocess.run([sys.executable, "-m", "rlbatch.cli.main", "train", config,
                                   *extra], env=_env(), capture_output=True, text=True,
                                  timeout=600, check=False)
            lines = hand.stderr.strip().splitlines()
            assert hand.returncode == 2 and len(lines) == 1, hand.stderr
            assert f"is in use by PID {trial} on host {HOST} " in lines[0], lines
        os.kill(trial, signal.SIGCONT)
        assert alive(trial) and profile.poll() is None  # both carry on
    finally:
        if trial is not None and alive(trial):
            os.kill(trial, signal.SIGCONT)
        profile.terminate()
        profile.communicate(timeout=120)
