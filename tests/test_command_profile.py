"""`rlbatch profile` with command trials (issue 29): `rlbatch train` itself as the foreign
command gives the decision that the built-in analysis gives on the same runs (acceptance 2),
and trials submitted as jobs to a local Ray cluster that the test starts (acceptance 3).

The first test trains the tiny model through an inner `rlbatch train`: what it assumes of the
machine's arithmetic is that GRPO from the warm start gains 0.1 held-out accuracy within
8,192 samples for both baseline seeds (it gained 0.2 within about 4k wherever measured).
Its assertions are equalities between two readings of the same rows, true wherever the runs
land. The Ray test's command is tests/helpers/log_writer.py, a stand-in that writes verl's log
format (a reward rising with samples the same way at every B), so it needs no model.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from helpers.profile_run import profile_json, started_trials
from helpers.standin_profile import standin_profile
from rlbatch.analysis.analyze import analyze
from rlbatch.analysis.crossing import Target
from rlbatch.core.runlog import read_json, read_jsonl

HELPERS = Path(__file__).resolve().parent / "helpers"
RLBATCH = [sys.executable, "-m", "rlbatch.cli.main"]


_profile = profile_json
_trial_dirs = started_trials


# ---------------------------------------------------------------- rlbatch train as a command
@pytest.mark.lands
@pytest.mark.trained
def test_rlbatch_train_as_a_command_decides_as_the_builtin_analysis_of_its_runs(
        tiny_model_dir, tmp_path):
    cfg = {"extends": "grpo-tiny", "name": "as-command", "backend": "command",
           "command": {"framework": "rlbatch", "poll_s": 0.3,
                       "argv": [*RLBATCH, "train", "--preset", "grpo-tiny",
                                "--set", "eval.prompts=256"]},
           "target": {"metric": "eval/accuracy", "value": None, "gain": 0.1},
           "budget": {"max_samples": 8192}, "eval": {"every_samples": 256, "prompts": 256},
           "checkpoint": {"every_samples": 2048},
           # no early stops: the profile's stop of a trial is written down by the trial's
           # own run (stop code `cannot_win`), while the inner run sees only the SIGTERM that
           # ends its command, so the two readings agree only for trials the profile let end
           # one seed of the baseline and one of the candidate: the contract is that the
           # profile reads each trial as its inner run wrote it, which two trials show as
           # well as four (the decision on two seeds each: test_profile_rules)
           "profile": {"prompts_per_step": [32], "seeds": 1, "confirm_seeds": 0,
                       "fixed_lr_control": False, "concurrency": [], "min_evaluations": 3,
                       "early_stop": False}}
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(cfg))
    doc = _profile(config, tmp_path / "p")
    profile = read_json(tmp_path / "p" / "profile.json")
    followed = {n: d for n, d in _trial_dirs(tmp_path / "p").items()}
    assert sorted(followed) == ["base-P16-s0", "sqrt-P32-s0"]
    inner = {}
    for name, run in followed.items():  # each trial's rows are its inner run's rows
        (own,) = [p for p in (run / "command" / "rlbatch-runs").iterdir() if p.is_dir()]
        inner[name] = own
        for log in ("steps.jsonl", "evals.jsonl"):
            assert read_jsonl(run / log)[0] == read_jsonl(own / log)[0], (name, log)
    # the built-in analysis of the inner runs, as the profile analyses its trials
    ref = str(inner["base-P16-s0"])
    builtin = analyze([str(d) for d in inner.values()], Target("eval/accuracy", None, gain=0.1),
                      reference_run=ref, margin=profile["analysis"]["settings"]["margin"],
                      statistic=profile["analysis"]["settings"]["statistic"])

    def by_batch(result: dict) -> dict:
        return {(c["sequences_per_step"], round(c["lr"], 12)): (
            c["verdict"], c["time_to_target"], c["samples_to_target"], len(c["runs"]))
            for c in result["configs"]}

    assert by_batch(builtin) == by_batch(profile["analysis"])
    rec, mine = builtin["recommendation"], doc["decision"]
    assert (rec["sequences_per_step"], rec["lr"], rec["evidence"]) == \
        (mine["sequences_per_step"], mine["lr"], mine["evidence"])


# ---------------------------------------------------------------- Ray jobs
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def ray_cluster(tmp_path):
    """A local Ray head with its dashboard (the job server); its address; stopped after."""
    pytest.importorskip("ray.job_submission")
    pytest.importorskip("aiohttp")  # ray[default]: the dashboard that serves jobs
    ray = Path(sys.executable).parent / "ray"
    port, dash = _free_port(), _free_port()
    # a home of its own: a ~/.ray/auth_token left by another Ray session on this machine
    # (e.g. `ray.init` in test_profile's slow Ray test) turns token authentication on for
    # the head, and the job client, which has no token, is then refused
    home = tmp_path / "ray-home"
    home.mkdir()
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", HOME=str(home))
    start = subprocess.run([str(ray), "start", "--head", "--num-cpus", "2", "--port", str(port),
                            "--dashboard-host", "127.0.0.1", "--dashboard-port", str(dash),
                            "--include-dashboard", "true", "--disable-usage-stats"],
                           capture_output=True, text=True, check=False, timeout=300, env=env)
    assert start.returncode == 0, start.stderr[-2000:]
    try:
        yield f"http://127.0.0.1:{dash}"
    finally:
        subprocess.run([str(ray), "stop", "--force"], capture_output=True, check=False,
                       timeout=120, env=env)


def test_trials_run_as_jobs_on_a_ray_cluster(ray_cluster, tmp_path):
    from ray.job_submission import JobSubmissionClient

    cfg = {"extends": "grpo-tiny", "name": "ray-jobs", "backend": "command",
           "command": {"framework": "verl", "poll_s": 0.2,
                       "argv": [sys.executable, str(HELPERS / "log_writer.py")]},
           "batch": {"prompts_per_step": 4, "samples_per_prompt": 8},
           "optimizer": {"reference_sequences": 32, "reference_lr": 1e-4},
           "target": {"metric": "eval/x/reward/mean@1", "value": 0.5, "gain": None},
           "budget": {"max_samples": 1024}, "eval": {"every_samples": 64},
           "checkpoint": {"every_samples": 256},
           "profile": {"prompts_per_step": [8], "seeds": 1, "confirm_seeds": 0,
                       "fixed_lr_control": False, "concurrency": [], "min_evaluations": 3}}
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(cfg))
    out = tmp_path / "p"
    doc = _profile(config, out, "--executor", "ray-job", "--address", ray_cluster,
                   "--trial-cpus", "1")
    assert doc["decision"] is not None and not doc["failed_trials"]
    jobs = {j.submission_id: j for j in JobSubmissionClient(ray_cluster).list_jobs()}
    for name, run in _trial_dirs(out).items():
        log = (out / "logs" / f"{name}.log").read_text()
        job = log.splitlines()[0].split()[-1]  # `ray job <id>`, then the job's own output
        assert str(jobs[job].status) in ("SUCCEEDED", "JobStatus.SUCCEEDED")
        assert f"Running entrypoint for job {job}" in log
        assert jobs[job].entrypoint.endswith(f"train {out / 'trials' / name}.yaml --resume "
                                             "--json")
        assert read_json(run / "summary.json")["status"] == "target_reached"


def _standin_profile(tmp_path: Path, name: str, step_s: float) -> Path:
    """The stand-in's profile (verl's log format, a reward rising with samples), each step
    taking `step_s` seconds: the baseline and B = 64."""
    return standin_profile(tmp_path, name, {"LOG_WRITER_STEP_S": step_s})


# ---------------------------------------------------------------- SIGTERM to the profile
def test_sigterm_to_the_profile_stops_its_trials_and_a_rerun_resumes_them(tmp_path):
    """A scheduler's SIGTERM reaches the profile process alone: it stops its running trial
    (which stops its command) instead of leaving them orphaned, exits 143, and the same
    command afterwards resumes the trial from its checkpoint and decides."""
    import os
    import signal
    import time

    from helpers.procs import alive

    config = _standin_profile(tmp_path, "sigterm", step_s=0.3)
    out = tmp_path / "p"
    cmd = [*RLBATCH, "profile", str(config), "--follow", "0", "--out", str(out), "--json"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONUNBUFFERED="1"))
    deadline = time.monotonic() + 120
    steps = None
    while time.monotonic() < deadline:  # the first trial has logged a few steps
        found = list(out.glob("runs/*/steps.jsonl"))
        if found and len(found[0].read_text().splitlines()) >= 6:
            steps = found[0]
            break
        time.sleep(0.1)
    assert steps is not None, "the trial did not start"
    attempt = json.loads(next(out.glob("runs/*/command/attempts/001/attempt.json")).read_text())
    trial_pid = json.loads((steps.parent / "owner.lock").read_text())["pid"]
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err[-2000:]
    assert not alive(trial_pid) and not alive(attempt["pid"])  # nothing left running
    assert read_json(steps.parent / "summary.json")["failure"] == "terminated by SIGTERM"
    doc = _profile(config, out)
    assert doc["decision"] is not None and not doc["failed_trials"]
    again = json.loads((steps.parent / "command" / "attempts" / "002" / "attempt.json")
                       .read_text())
    assert again["resume_step"] >= 4  # from the stand-in's checkpoint, every 4 steps


# ---------------------------------------------------------------- SIGKILL of the profile
def test_a_killed_profile_reruns_no_finished_trial(tmp_path):
    """SIGKILL of the profile (and its trial) once a trial has finished and the next has
    started; the same command afterwards skips the finished trial, leaves its log as it was,
    and runs the rest to a decision. The fast form of test_profile's killed profile (slow),
    on the stand-in command: which trials a re-run starts is the driver's, whatever the
    backend."""
    from helpers.profile_kill import kill_profile_when

    config = _standin_profile(tmp_path, "killed", step_s=0.05)
    out = tmp_path / "p"

    def ready(events: list[dict]) -> bool:
        started = [e for e in events if e["event"] == "started"]
        return any(e["event"] == "finished" for e in events) and len(started) >= 2

    kill_profile_when([*RLBATCH, "profile", str(config), "--follow", "0", "--out", str(out), "--json"], out,
                      ready, timeout_s=120)
    before = read_jsonl(out / "journal.jsonl")[0]
    finished = {e["trial"] for e in before if e["event"] == "finished"}
    logs = {n: (d / "steps.jsonl").read_text() for n, d in _trial_dirs(out).items()
            if n in finished}
    assert logs
    _assert_progress_lines_arrive_while_it_runs(config, out)
    doc = json.loads((out / "profile.json").read_text())
    assert doc["decision"] is not None and not doc["failed_trials"]
    after = read_jsonl(out / "journal.jsonl")[0][len(before):]
    for name, text in logs.items():
        assert not any(e["event"] == "started" and e["trial"] == name for e in after), name
        assert any(e["event"] == "skipped_finished" and e["trial"] == name for e in after)
        assert (_trial_dirs(out)[name] / "steps.jsonl").read_text() == text
    assert {e["trial"] for e in after if e["event"] == "finished"} == {"sqrt-P8-s0"}


def _assert_progress_lines_arrive_while_it_runs(config: Path, out: Path) -> None:
    """Runs the profile with stderr to a pipe (no terminal): a line for each trial that
    starts and ends reaches the reader while the profile still runs, not all at its end."""
    proc = subprocess.Popen([*RLBATCH, "profile", str(config), "--follow", "0", "--out", str(out), "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONUNBUFFERED="1"))
    try:
        first = proc.stderr.readline()
        assert proc.poll() is None, "the profile ended before its first progress line"
        assert first.startswith("trial "), first
        rest = proc.stderr.read()
        assert proc.wait(timeout=120) == 0, rest[-2000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    lines = (first + rest).splitlines()
    mine = [line for line in lines if line.startswith("trial sqrt-P8-s0 (B=64, lr 0.000141): ")]
    assert len(mine) == 2 and "running, " in mine[0] and "running" not in mine[1], lines
    assert json.loads(proc.stdout.read().strip().splitlines()[-1])["decision"] is not None


# ---------------------------------------------------------------- following `next`
def test_follow_runs_the_seeds_next_asks_for_and_decides_again(tmp_path, capsys):
    """`--follow 3`: a look whose decision asks for more seeds is followed in the same folder
    (a line names the look and what it runs), up to three times, as the printed command
    would; the last look is printed in full. The stand-in's seeds differ in step time
    (LOG_WRITER_SEED_JITTER), so one seed each decides nothing and more seeds are asked for;
    B = 64 takes half the steps of B = 32 at every seed."""
    from helpers.cli import run_cli

    config = _standin_profile(tmp_path, "follow", step_s=0.01)
    data = yaml.safe_load(config.read_text())
    data["command"]["env"]["LOG_WRITER_SEED_JITTER"] = "0.25"
    data["profile"]["workers"] = 2
    config.write_text(yaml.safe_dump(data))
    out = tmp_path / "p"
    code, stdout, stderr = run_cli(["profile", config, "--out", out, "--follow", "3"], capsys)
    assert code == 0, stderr[-2000:]
    # the stand-in logs its times, so what each look decides is arithmetic, not timing
    follows = [x for x in stdout.splitlines() if x.startswith("following next (look ")]
    assert follows == ["following next (look 2 of at most 4): profile.seeds=2",
                       "following next (look 3 of at most 4): profile.seeds=3"]
    decisions = [x for x in stdout.splitlines() if x.startswith("decision: ")]
    assert decisions[:2] == ["decision: keep the baseline P=4 G=8 (B=32), lr=0.0001, C=128"] * 2
    assert decisions[2].startswith("decision: P=8 G=8 (B=64), lr=0.000141, C=128: 2x faster "
                                   "than the baseline, across 3 seeds; T ratio 0.5 [")
    assert stdout.count("profile: ") == 3  # each look's decision printed
    assert "to continue this profile" not in stdout  # established: nothing to continue
    assert {f"{k}-s{i}" for k in ("base-P4", "sqrt-P8") for i in range(3)} == \
        set(_trial_dirs(out))
    assert read_json(out / "profile.json")["decision"]["evidence"] == "established"


# ---------------------------------------------------------------- a baseline that fails
def test_a_profile_whose_baseline_failed_exits_2_naming_the_failure(tmp_path):
    """Every trial's command crashes at its third step: there is no decision, and the profile
    says why on stderr in one `error:` line and exits 2, not 0 as if it had decided (the
    decision text, `decision: none (...)`, is still printed)."""
    import os

    config = _standin_profile(tmp_path, "crash", step_s=0.01)
    data = yaml.safe_load(config.read_text())
    data["command"]["env"]["LOG_WRITER_CRASH_AT"] = "3"
    config.write_text(yaml.safe_dump(data))
    out = tmp_path / "p"
    proc = subprocess.run([*RLBATCH, "profile", str(config), "--follow", "0", "--out", str(out)],
                          capture_output=True, text=True, check=False, timeout=600,
                          env=dict(os.environ, PYTHONUNBUFFERED="1"))
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "decision: none (every baseline trial failed" in proc.stdout
    errors = [x for x in proc.stderr.splitlines() if x.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith("error: no decision: every baseline "
                                                     "trial failed (the first, base-P4-s0:")
    profile = read_json(out / "profile.json")
    assert profile["decision"] is None and "base-P4-s0" in profile["failed_trials"]


# ---------------------------------------------------------------- the command checked first
@pytest.mark.parametrize("change, line", [
    ({"argv": ["no-such-trainer"]},
     ("error: command.argv[0]: 'no-such-trainer' is not an executable program on PATH "
      "(or relative to {cwd})")),
    ({"workdir": "no-such-folder"}, "error: command.workdir: no-such-folder is not a folder"),
])
def test_profile_checks_the_command_before_anything_is_written(tmp_path, capsys, monkeypatch,
                                                                change, line):
    """A missing program or working directory (a relative one read from another directory
    included) is refused by `rlbatch profile` in the line `rlbatch train` would print, exit
    2, and no profile folder, instead of `run directory not found` after the first trial
    with the reason only in that trial's log."""
    from helpers.cli import run_cli

    config = _standin_profile(tmp_path, "unchecked", step_s=0.01)
    data = yaml.safe_load(config.read_text())
    data["command"].update(change)
    config.write_text(yaml.safe_dump(data))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    code, _, err = run_cli(["profile", config, "--out", tmp_path / "p"], capsys)
    assert code == 2 and err.strip().splitlines() == [line.format(cwd=elsewhere)]
    assert not (tmp_path / "p").exists()


# ---------------------------------------------------------------- a trial still running
HOLD = ("import os, sys, time\nfrom rlbatch.core.ownership import own\n"
        "os.makedirs(sys.argv[1], exist_ok=True)\n"
        "own(sys.argv[1], 'run directory')\nprint('held', flush=True)\ntime.sleep(300)\n")


def test_a_trial_still_running_elsewhere_is_refused_not_analysed(tmp_path):
    """The profile is SIGKILLed once its first trial has started; that trial's run directory
    is then held by another live process, as an orphaned trial of the killed profile holds
    it. A re-run refuses in one line naming the trial and the holder's PID, exit 2, starts
    no trial and writes no decision (it used to list the trial as failed and read its partial
    rows as final: `decision: none`, exit 0). Nothing of the re-run is written down, so a
    later re-run resumes the trial as test_a_killed_profile_reruns_no_finished_trial does."""
    from helpers.profile_kill import kill_profile_when

    config = _standin_profile(tmp_path, "held", step_s=0.01)
    out = tmp_path / "p"
    cmd = [*RLBATCH, "profile", str(config), "--follow", "0", "--out", str(out), "--json"]
    kill_profile_when(cmd, out, lambda ev: any(e["event"] == "started" for e in ev),
                      timeout_s=120)
    run_dir = _trial_dirs(out)["base-P4-s0"]
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(run_dir)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        before = read_jsonl(out / "journal.jsonl")[0]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=300)
        assert proc.returncode == 2, proc.stderr[-2000:]
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(
            f"error: trial base-P4-s0: its run directory {run_dir} is in use by PID "
            f"{holder.pid} on host {socket.gethostname()} ")
        assert lines[0].endswith("a trial of an earlier profile that is still running: wait "
                                 "for it to end, or stop that process, then re-run this "
                                 "profile")
        after = read_jsonl(out / "journal.jsonl")[0][len(before):]
        assert not any(e["event"] in ("started", "trial_failed") for e in after), after
        assert not (out / "profile.json").exists() or \
            read_json(out / "profile.json").get("decision") is None
    finally:
        holder.kill()
        holder.wait()


# ---------------------------------------------------------------- SIGKILL of the profile alone
def test_a_profile_killed_outright_takes_its_trials_and_their_commands_with_it(tmp_path):
    """Only the profile process is SIGKILLed (not its group, as a scheduler's `kill -9 PID`
    does) while its trial's command, which ignores SIGTERM, hangs. The trial gets SIGTERM
    from the kernel (core/launch.py), writes down its end and stops its command, SIGKILL
    after command.stop_grace_s: both are gone from /proc, and the run says why."""
    import signal
    import time

    from helpers.procs import alive

    config = _standin_profile(tmp_path, "orphans", step_s=0.1)
    data = yaml.safe_load(config.read_text())
    data["command"]["env"].update({"LOG_WRITER_HANG_AT": "4", "LOG_WRITER_TRAP_TERM": "1"})
    data["command"]["stop_grace_s"] = 2
    config.write_text(yaml.safe_dump(data))
    out = tmp_path / "p"
    proc = subprocess.Popen([*RLBATCH, "profile", str(config), "--follow", "0", "--out", str(out), "--json"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    deadline = time.monotonic() + 120
    steps = None
    while time.monotonic() < deadline and steps is None:
        found = list(out.glob("runs/*/steps.jsonl"))
        if found and len(found[0].read_text().splitlines()) >= 3:
            steps = found[0]
        time.sleep(0.1)
    assert steps is not None, "the trial did not start"
    trial_pid = json.loads((steps.parent / "owner.lock").read_text())["pid"]
    command_pid = json.loads(next(out.glob("runs/*/command/attempts/001/attempt.json"))
                             .read_text())["pid"]
    assert alive(trial_pid) and alive(command_pid)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and (alive(trial_pid) or alive(command_pid)):
        time.sleep(0.1)
    assert not alive(trial_pid) and not alive(command_pid)
    assert read_json(steps.parent / "summary.json")["failure"] == "terminated by SIGTERM"
