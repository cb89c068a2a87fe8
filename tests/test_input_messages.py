"""Messages for bad input and hung in-process rewards (issue 16): a config path that is a
directory, `--set` errors naming the `--set`, damaged checkpoints and tiny-model cache (one
line, exit 2, no run directory or one marked failed with that line), the in-process reward
timeout (`rollout/deadline.py`) and the handlers it must leave as they were. Real files, the
real CLI, real sleeping reward functions (tests/helpers/cheap_rewards.py)."""

from __future__ import annotations

import json
import shutil
import signal
import threading
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest

from helpers.cli import run_cli, set_flags
from rlbatch.core.config import RewardConfig, TaskConfig
from rlbatch.core.errors import ConfigError, Terminated
from rlbatch.core.loading import load_config
from rlbatch.core.runlog import read_run
from rlbatch.rollout.datasets import build_task
from rlbatch.rollout.models import checkpoint_problem
from rlbatch.rollout.reward_runner import Call, RewardRunner
from rlbatch.rollout.tasks import Example
from test_reliability import _rlbatch

# every trained test here holds wherever a run lands (tests/README.md)
pytestmark = pytest.mark.landing_free

HELPERS = Path(__file__).resolve().parent / "helpers"


def _one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err
    return lines[0][len("error: "):]


# ---------------------------------------------------------------- config paths and --set

def test_config_path_that_is_a_directory_says_so(tmp_path, capsys):
    folder = tmp_path / "configs"
    folder.mkdir()
    for args in (["config", "check", str(folder)],
                 ["train", str(folder), "--out", str(tmp_path / "runs")]):
        code, _, err = run_cli(args, capsys)
        assert code == 2
        assert _one_error_line(err) == f"{folder}: config file is a directory, not a YAML file"
    assert not (tmp_path / "runs").exists()
    missing = tmp_path / "nope.yaml"
    code, _, err = run_cli(["config", "check", str(missing)], capsys)
    assert (code, err) == (2, f"error: {missing}: config file not found\n")
    for name in ("sub.yaml", "sub"):  # `extends:` naming a directory, with and without .yaml
        (folder / name).mkdir()
    for name in ("sub.yaml", "sub"):
        child = tmp_path / f"child-{name}.yaml"
        child.write_text(f"# a child\nextends: configs/{name}\n")
        with pytest.raises(ConfigError) as exc:
            load_config(child)
        assert str(exc.value) == (f"{child}:2: extended file configs/{name} is a directory, "
                                  "not a YAML file")


@pytest.mark.parametrize("item, expected", [
    # a key on the way holds a value: the --set is named, and the line it contradicts
    ("batch.prompts_per_step.x=3", ("--set batch.prompts_per_step.x: batch.prompts_per_step "
     "is 16 (preset:grpo-tiny:9), not a section; it has no key 'x'")),
    ("name.first=a", ("--set name.first: name is 'grpo-tiny' (preset:grpo-tiny:3), not a "
     "section; it has no key 'first'")),
    # unknown keys, at the top (before: blamed the preset's first line) and inside a section
    ("foo.bar=3", "--set foo.bar: unknown key 'foo'; valid keys: name, model,"),
    ("batch.foo=3", "--set batch.foo: unknown key 'batch.foo'; valid keys: prompts_per_step,"),
    # bad values, named once
    ("batch.prompts_per_step=abc", ("--set batch.prompts_per_step: Input should be a valid "
     "integer, unable to parse string as an integer (got 'abc')")),
    ("batch.prompts_per_step=", ("--set batch.prompts_per_step: Input should be a valid integer "
     "(got None)")),
    # a whole section replaced: the preset's lines for its old keys no longer apply
    ("batch={prompts_per_step: abc}", ("--set batch: batch.prompts_per_step: Input should be a "
     "valid integer")),
    ("batch.minibatches_per_step=3", ("--set batch.minibatches_per_step: "
     "batch.minibatches_per_step (3) must divide")),
    # malformed items
    ("batch", "--set expects key=value, got 'batch'"),
    ("batch..x=1", "--set has an empty key in 'batch..x=1'"),
    ("extends=ppo-tiny", "--set extends: `extends` names a preset or file inside a config file"),
    ("derived.sequences_per_step=4", ("--set derived.sequences_per_step: `derived` values are "
     "computed")),
])
def test_set_errors_name_the_set(item, expected):
    with pytest.raises(ConfigError) as exc:
        load_config(preset="grpo-tiny", overrides=[item])
    message = str(exc.value)
    assert message.startswith(expected), message
    assert "\n" not in message


def test_set_and_file_errors_each_name_their_own_origin(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("extends: grpo-tiny\nbatch: 3\n")
    with pytest.raises(ConfigError) as exc:
        load_config(bad, overrides=["batch.prompts_per_step=4"])
    assert str(exc.value) == (f"--set batch.prompts_per_step: batch is 3 ({bad}:2), not a "
                              "section; it has no key 'prompts_per_step'")
    # a --set beside a bad value in the file: the file's line is still the one named
    bad.write_text("extends: grpo-tiny\nbatch:\n  prompts_per_step: abc\n")
    with pytest.raises(ConfigError) as exc:
        load_config(bad, overrides=["batch.samples_per_prompt=4", "optimizer.lr=0.01"])
    assert str(exc.value).startswith(f"{bad}:3: batch.prompts_per_step: Input should be")
    # and a --set that replaces the bad value fixes it
    cfg = load_config(bad, overrides=["batch.prompts_per_step=4"])
    assert cfg.batch.prompts_per_step == 4


def test_set_errors_through_the_cli_are_one_line_exit_2(tmp_path, capsys):
    for item in ("batch.prompts_per_step.x=3", "foo.bar=3", "batch"):
        code, _, err = run_cli(["train", "--preset", "grpo-tiny", "--out", str(tmp_path),
                                "--set", item], capsys)
        assert code == 2 and _one_error_line(err).startswith("--set ")
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------- damaged models

def _cut(path: Path, keep) -> None:
    data = path.read_bytes()
    path.write_bytes(data[:keep(len(data))])


DAMAGE = {
    "weights cut to 1,000 bytes": (lambda d: _cut(d / "model.safetensors", lambda n: 1000),
                                   ("model.safetensors is cut short (1,000 bytes, less than its "
                                   "header)")),
    "weights emptied": (lambda d: _cut(d / "model.safetensors", lambda n: 0),
                        "model.safetensors is cut short (0 bytes"),
    "last 100 bytes of weights lost": (lambda d: _cut(d / "model.safetensors", lambda n: n - 100),
                                       ("model.safetensors is 3,162,524 bytes where its header "
                                       "describes 3,162,624 (cut short or overwritten)")),
    "weights header overwritten": (lambda d: (d / "model.safetensors").write_bytes(
        b"\x10\x00\x00\x00\x00\x00\x00\x00{not a header!} " + b"\x00" * 64),
        "model.safetensors has a damaged header"),
    "config.json garbage": (lambda d: (d / "config.json").write_text("garbage{"),
                            "config.json is not valid JSON"),
    "config.json a list": (lambda d: (d / "config.json").write_text("[1, 2]"),
                           "config.json is not a JSON object"),
    "tokenizer.json empty": (lambda d: (d / "tokenizer.json").write_text(""),
                             "tokenizer.json is not valid JSON"),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_damaged_checkpoint_is_one_line_and_no_run_directory(tiny_model_dir, tmp_path, capsys,
                                                              damage):
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    assert (model / "model.safetensors").stat().st_size == 3_162_624  # the cuts above assume it
    spoil, problem = DAMAGE[damage]
    spoil(model)
    code, _, err = run_cli(["train", "--preset", "grpo-tiny", "--out", str(tmp_path / "runs"),
                            "--set", f"model={model}"], capsys)
    assert code == 2
    line = _one_error_line(err)
    assert line.startswith(f"model: checkpoint '{model}' is damaged: {problem}"), line
    assert "rlbatch model build" not in line  # not rlbatch's cache: no rebuild hint
    assert not (tmp_path / "runs").exists()  # found before anything was written


def test_checkpoint_that_fails_to_load_marks_the_run_failed(tiny_model_dir, tmp_path, capsys):
    """A tokenizer file of the wrong form passes the structural checks and fails in the
    loader (a KeyError inside transformers): one line, and the run directory says so."""
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    (model / "tokenizer.json").write_text('{"a": 1}')
    code, _, err = run_cli(["train", "--preset", "grpo-tiny", "--out", str(tmp_path / "runs"),
                            "--set", f"model={model}"], capsys)
    line = _one_error_line(err)
    assert code == 2 and line == f"model: cannot load '{model}': KeyError: 'added_tokens'"
    (run,) = (tmp_path / "runs").iterdir()
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["failure"] == line


def _damaged_cache(tiny_model_dir: Path, root: Path, spoil) -> Path:
    entry = root / "models" / tiny_model_dir.name
    shutil.copytree(tiny_model_dir, entry)
    spoil(entry)
    return entry


HINT = "; delete that folder (it is rebuilt on next use) or run `rlbatch model build --task " \
       "addition --digits 3 --force`"


def test_damaged_tiny_model_cache_says_how_to_rebuild(tiny_model_dir, tmp_path, capsys,
                                                       monkeypatch):
    root = tmp_path / "cache"
    entry = _damaged_cache(tiny_model_dir, root, DAMAGE["weights cut to 1,000 bytes"][0])
    monkeypatch.setenv("RLBATCH_CACHE", str(root))
    expected = (f"model: the cached tiny model {entry} is damaged: model.safetensors is cut "
                f"short (1,000 bytes, less than its header){HINT}")
    for args in (["train", "--preset", "grpo-tiny", "--out", str(tmp_path / "runs")],
                 ["model", "build"]):
        code, _, err = run_cli(args, capsys)
        assert code == 2 and _one_error_line(err) == expected
    assert not (tmp_path / "runs").exists()
    assert (entry / "model.safetensors").stat().st_size == 1000  # nothing rebuilt silently


def test_tiny_cache_with_other_shapes_fails_the_run_in_one_line(tiny_model_dir, tmp_path,
                                                                  monkeypatch):
    """Weights of other shapes than config.json (hidden size 64): only the loader can tell.
    A real process, so that transformers' own load report (a table on stderr) would show."""
    def shrink(entry: Path) -> None:
        config = json.loads((entry / "config.json").read_text())
        (entry / "config.json").write_text(json.dumps({**config, "hidden_size": 64}))

    root = tmp_path / "cache"
    entry = _damaged_cache(tiny_model_dir, root, shrink)
    monkeypatch.setenv("RLBATCH_CACHE", str(root))
    res = _rlbatch("train", "--preset", "grpo-tiny", "--out", str(tmp_path / "runs"))
    assert res.returncode == 2
    line = _one_error_line(res.stderr)
    assert line.startswith(f"model: cannot load '{entry}': its weights have other shapes than "
                           "its config.json gives: model.embed_tokens.weight is [20, 128] in "
                           "the weights, [20, 64] by config.json")  # the first by name
    assert line.endswith(HINT)
    (run,) = (tmp_path / "runs").iterdir()
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["failure"] == line


@pytest.mark.slow
def test_model_build_force_rebuilds_a_damaged_cache(tiny_model_dir, tmp_path, capsys,
                                                    monkeypatch):
    """The hint's command works: `rlbatch model build --force` replaces the damaged entry
    (a full build: 7 CPU minutes here, 12-18 minutes of wall time on the loaded 2 cores)."""
    root = tmp_path / "cache"
    entry = _damaged_cache(tiny_model_dir, root, DAMAGE["config.json garbage"][0])
    monkeypatch.setenv("RLBATCH_CACHE", str(root))
    code, _, _ = run_cli(["model", "build", "--task", "addition", "--digits", "3", "--force"],
                         capsys)
    assert code == 0
    assert checkpoint_problem(entry) is None
    assert json.loads((entry / "config.json").read_text())["hidden_size"] == 128


# ---------------------------------------------------------------- in-process reward timeouts

@pytest.fixture
def cheap(monkeypatch):
    monkeypatch.syspath_prepend(str(HELPERS))
    import cheap_rewards

    return cheap_rewards


def _calls(*completions: str) -> list[Call]:
    return [Call("p", c, Example("p", "ok"), i) for i, c in enumerate(completions)]


def _runner(spec: str, **reward) -> RewardRunner:
    task = build_task(TaskConfig(name="addition", reward=spec))
    return RewardRunner(task, spec, 1e-6, RewardConfig(**reward))


def _alarm_state():
    return signal.getsignal(signal.SIGALRM), signal.getitimer(signal.ITIMER_REAL)


@pytest.mark.parametrize("spec, reward", [
    ("cheap_rewards:sleepy", {}),  # declared cheap
    ("cheap_rewards:swallowing", {}),  # catches Exception around its sleep
    ("faulty_rewards:scripted", {"workers": 0}),  # not cheap, but no pool
])
def test_in_process_call_past_the_timeout_is_a_timeout_fault(cheap, monkeypatch, spec, reward):
    monkeypatch.syspath_prepend(str(HELPERS))
    runner = _runner(spec, timeout_s=0.2, **reward)
    assert not runner.pooled
    before = _alarm_state()
    scored = runner.score(_calls("ok", "hang", "wrong", "hang", "ok"))
    assert scored.faults == [None, "timeout", None, "timeout", None]
    assert scored.values == [1.0, None, 0.0, None, 1.0]
    assert scored.counts() == {"errors": 0, "timeouts": 2, "nonfinite": 0}
    assert scored.messages[1] == "no result within 0.2 s (in-process call interrupted)"
    assert _alarm_state() == before  # no handler or timer left behind


def test_builtin_reward_path_gets_the_timeout_too(cheap):
    """Built-in rewards take the same in-process path (`task.reward`); a slow one is cut."""
    task = SimpleNamespace(reward=cheap.sleepy)
    runner = RewardRunner(task, "exact", 1e-6, RewardConfig(timeout_s=0.2))
    assert not runner.pooled
    assert runner.score(_calls("hang", "ok")).faults == ["timeout", None]


def test_outer_alarm_handler_and_timer_are_kept(cheap):
    fired: list[int] = []

    def outer(signum, frame):
        fired.append(signum)

    runner = _runner("cheap_rewards:sleepy", timeout_s=0.3)
    previous = signal.signal(signal.SIGALRM, outer)
    try:
        # an outer timer far away: untouched, and still pending afterwards
        signal.setitimer(signal.ITIMER_REAL, 60.0)
        assert runner.score(_calls("hang")).faults == ["timeout"]
        assert signal.getsignal(signal.SIGALRM) is outer
        left = signal.getitimer(signal.ITIMER_REAL)[0]
        assert 0 < left <= 60.0 and fired == []
        # an outer timer due inside the call: delivered to its handler once, then our timeout
        signal.setitimer(signal.ITIMER_REAL, 0.05)
        assert runner.score(_calls("hang")).faults == ["timeout"]
        assert fired == [signal.SIGALRM]
        assert signal.getsignal(signal.SIGALRM) is outer
        assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_sigterm_during_an_in_process_call_ends_the_run_not_the_call(cheap):
    """`rlbatch train` turns SIGTERM into `Terminated`; arriving mid-call it must propagate
    (the run is marked failed and resumable), not be counted as a reward error."""
    def on_term(signum, frame):
        raise Terminated(signum)

    runner = _runner("cheap_rewards:terminates", timeout_s=30)
    before = _alarm_state()
    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        with pytest.raises(Terminated):
            runner.score(_calls("ok"))
        assert signal.getsignal(signal.SIGTERM) is on_term
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert _alarm_state() == before


def test_off_the_main_thread_calls_run_without_a_timeout_and_say_so(cheap):
    """SIGALRM reaches only the main thread: elsewhere the call is not cut, with a warning."""
    runner = _runner("cheap_rewards:sleepy", timeout_s=0.05)
    runner.task = SimpleNamespace(reward=lambda p, c, e: (threading.Event().wait(0.3), 1.0)[1])
    out: dict = {}

    def work():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out["faults"] = runner.score(_calls("ok")).faults
            out["warnings"] = [str(w.message) for w in caught]

    thread = threading.Thread(target=work)
    thread.start()
    thread.join(30)
    assert out["faults"] == [None]
    assert out["warnings"] == [("reward.timeout_s does not apply to in-process reward calls "
                               "outside the main thread or POSIX (SIGALRM)")]


def test_training_with_a_hanging_cheap_reward_runs_to_its_budget(tiny_model_dir, tmp_path):
    """`rlbatch train` with a cheap reward that hangs on every 50th call: each hang is a
    timeout fault, counted and logged, and the run trains its whole budget (it does not stop
    at the target, so where the model lands cannot end it early)."""
    res = _rlbatch("train", "--preset", "grpo-tiny", "--out", str(tmp_path), "--json", *set_flags([
        "task.reward=cheap_rewards:hangs_every_50th", "reward.timeout_s=0.2",
        "batch.prompts_per_step=8", "budget.max_samples=64", "budget.stop_at_target=false",
        "eval.prompts=16", "eval.every_samples=64"]))
    assert res.returncode == 0, res.stderr[-2000:]
    (run_dir,) = tmp_path.iterdir()
    run = read_run(run_dir)
    # the status names whether the target was crossed on the way; the budget ended the run
    crossed = run.summary["target"]["reached"]
    assert run.summary["status"] == ("target_reached" if crossed else "budget_exhausted")
    assert [r["samples"] for r in run.steps] == [64] and run.summary["samples"] == 64
    train_calls = run.steps[-1]["samples"]
    eval_calls = 16 * len(run.evals)  # one response per held-out prompt (k = 1)
    timeouts = (sum(r["reward/timeouts"] for r in run.steps)
                + sum(e.get("eval/reward_timeouts", 0) for e in run.evals))
    assert timeouts >= 1 and timeouts == (train_calls + eval_calls) // 50  # each hang cut
    assert all(r["reward/errors"] == 0 for r in run.steps)
    logged = [json.loads(x) for x in (run_dir / "reward_errors.jsonl").read_text().splitlines()]
    assert logged[0]["kind"] == "timeout"
    assert logged[0]["function"] == "cheap_rewards:hangs_every_50th"
    assert logged[0]["message"] == "no result within 0.2 s (in-process call interrupted)"
