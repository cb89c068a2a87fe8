"""Staleness on the user's trainer (`backend: command`): `rollout.max_staleness` as each
framework's own setting (interop/staleness.py), the refusals where a framework or the
user's command cannot run it, and profiles crossing it on the OpenRLHF and prime-rl
stand-ins. tests/test_framework_keys.py checks the names against OpenRLHF's parser, verl's
Hydra config (the one-step-off entry's too) and the confirmed prime-rl names."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

from helpers.cli import run_cli
from rlbatch.core.errors import ConfigError
from rlbatch.core.runlog import read_json
from rlbatch.interop.launch import TrialSpec, launch
from test_lifecycle import HELPERS, PRIME, PRIME_ACC, _config, _eval_set, _profile

ONE_STEP_OFF = ["python3", "-m", "verl.experimental.one_step_off_policy.main_ppo"]


def _spec(framework: str, k: int) -> TrialSpec:
    return TrialSpec(framework=framework, algorithm="grpo", prompts=64, samples_per_prompt=8,
                     minibatches=4, epochs=1, lr=2e-6, critic_lr=None, seed=3,
                     eval_every_samples=4096, checkpoint_every_samples=8192,
                     max_samples=65536, concurrency=128, staleness=k)


def _argv(framework: str, k: int, tmp_path: Path, base: list[str] | None = None) -> list[str]:
    base = base or []
    return launch(_spec(framework, k), base, tmp_path / "a", tmp_path).argv[len(base):]


def test_each_framework_gets_its_own_setting_for_a_staleness(tmp_path):
    """At k = 2: rlbatch's own key, OpenRLHF's async trainer with a queue of 2, prime-rl's
    bound on off-policy steps; at 0 none of them (the synchronous command, as before). verl's
    one-step-off entry runs at 1 and takes no word for it."""
    rl = _argv("rlbatch", 2, tmp_path)
    assert "rollout.max_staleness=2" in rl and not any(
        "max_staleness" in w for w in _argv("rlbatch", 0, tmp_path))
    o = _argv("openrlhf", 2, tmp_path)
    assert "--train.async_enable" in o
    assert o[o.index("--train.async_queue_size") + 1] == "2"
    assert not {"--train.async_enable", "--train.async_queue_size"} & set(
        _argv("openrlhf", 0, tmp_path))
    p = _argv("prime-rl", 2, tmp_path)
    assert p[p.index("--orchestrator.max-off-policy-steps") + 1] == "2"
    assert "--orchestrator.max-off-policy-steps" not in _argv("prime-rl", 0, tmp_path)
    assert _argv("verl", 1, tmp_path, ONE_STEP_OFF) == _argv(
        "verl", 0, tmp_path, ["python3", "-m", "verl.trainer.main_ppo"])
    with pytest.raises(ConfigError, match="one_step_off_policy.main_ppo runs at 1"):
        _argv("verl", 0, tmp_path, ONE_STEP_OFF)
    with pytest.raises(ConfigError, match="trl grpo"):
        _argv("trl", 1, tmp_path)


def _command_config(tmp_path: Path, framework: str, argv: list[str], rollout: int,
                    profile: list[int]) -> Path:
    cfg = {"extends": "grpo-tiny", "name": "stale-command", "backend": "command",
           "command": {"framework": framework, "argv": argv, "workdir": str(tmp_path)},
           "optimizer": {"reference_sequences": 32, "reference_lr": 1e-4},
           "rollout": {"max_staleness": rollout},
           "profile": {"prompts_per_step": [8], "max_staleness": profile, "concurrency": []}}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.mark.parametrize("framework, argv, rollout, profile, says", [
    ("trl", ["grpo"], 1, [1], "rollout.max_staleness 1: `trl grpo`"),
    ("verl", ["-m", "verl.trainer.main_ppo"], 0, [0, 1],
     "rollout.max_staleness 1: verl's staleness is its entry point"),
    ("verl", ["-m", "verl.experimental.one_step_off_policy.main_ppo"], 0, [0],
     "set rollout.max_staleness: 1"),
    ("prime-rl", [], 0, [0, 2], "profile.max_staleness: prime-rl always decodes one step"),
    ("openrlhf", ["--train.async_enable"], 0, [0, 1],
     "command.argv: --train.async_enable is rlbatch's to set"),
    ("openrlhf", ["--train.colocate_all", "--vllm.enable_sleep"], 0, [0, 1],
     "refuses --vllm.enable_sleep with --train.colocate_all"),
])
def test_a_staleness_a_framework_cannot_run_is_refused_in_one_line(
        framework, argv, rollout, profile, says, tmp_path, capsys):
    path = _command_config(tmp_path, framework, [sys.executable, *argv], rollout, profile)
    code, _, err = run_cli(["config", "check", path], capsys)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, lines
    assert says in lines[0]


def test_openrlhf_async_on_its_stand_in_reads_as_throughput_bought_at_no_samples(tmp_path):
    """A profile crossing B with staleness 0 and 1 on the OpenRLHF stand-in, whose async
    trainer overlaps each batch's generation (2 of its 6.5 time units a step) with the
    rest: each stale configuration needs its synchronous twin's samples (the stand-in's
    learning is per sample) and runs 6.5 / 4.5 = 1.44x its throughput, which the profile's
    staleness lines report; each trial ran with the queue its staleness asks for."""
    argv = [sys.executable, str(HELPERS / "openrlhf_trainer.py"),
            "--eval.dataset", str(_eval_set(tmp_path))]
    env = {"OPENRLHF_STANDIN_STARTUP_S": "0.2", "OPENRLHF_STANDIN_SAMPLE_S": "0.0005"}
    config = _config(tmp_path, "openrlhf", argv, env, "eval/eval_math_pass1", 0.35,
                     profile={"max_staleness": [0, 1], "early_stop": False})
    _profile(config, tmp_path / "p")
    doc = read_json(tmp_path / "p" / "profile.json")
    assert not doc["failed_trials"]
    assert sorted(t["trial"] for t in doc["trials"]) == [
        "base-P4-s0", "sqrt-P4-k1-s0", "sqrt-P8-k1-s0", "sqrt-P8-s0"]
    stale = {c["sequences_per_step"]: c for c in doc["analysis"]["staleness"]}
    assert set(stale) == {32, 64}
    for c in stale.values():
        assert c["samples_ratio"] == pytest.approx(1.0, abs=1e-9)
        assert c["throughput_ratio"] == pytest.approx(6.5 / 4.5, rel=0.01)
    for t in doc["trials"]:
        attempts = sorted((Path(t["run_dir"]) / "command" / "attempts").glob("*/attempt.json"))
        settings = read_json(attempts[0])["settings"]
        want = 1 if "-k1-" in t["trial"] else None
        assert settings.get("--train.async_queue_size") == want, t["trial"]
        assert settings.get("--train.async_enable") == (True if want else None)


def test_prime_rl_staleness_reaches_its_orchestrator(tmp_path):
    """A prime-rl profile from staleness 1 (prime-rl has no 0) crossing 1 and 2: each trial's
    resolved orchestrator config on the stand-in holds the bound of its staleness."""
    env = {"PRIME_STANDIN_STARTUP_S": "0.2", "PRIME_STANDIN_SAMPLE_S": "0.0005"}
    config = _config(tmp_path, "prime-rl", PRIME, env, PRIME_ACC, 0.45,
                     profile={"max_staleness": [1, 2], "early_stop": False})
    data = yaml.safe_load(config.read_text())
    data["rollout"] = {"max_staleness": 1}
    config.write_text(yaml.safe_dump(data))
    _profile(config, tmp_path / "p")
    doc = read_json(tmp_path / "p" / "profile.json")
    assert not doc["failed_trials"]
    bounds = {}
    for t in doc["trials"]:
        toml = Path(t["run_dir"]) / "command" / "prime-rl" / "trial" / "configs" / \
            "orchestrator.toml"
        bounds[t["trial"]] = toml.read_text().split("max_off_policy_steps = ")[1].split()[0]
    assert bounds == {"base-P4-s0": "1", "sqrt-P4-k2-s0": "2", "sqrt-P8-s0": "1",
                      "sqrt-P8-k2-s0": "2"}
