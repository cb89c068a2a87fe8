"""Every setting rlbatch emits for another framework exists there (issue 29, point 5), checked
against the framework itself, so that a renamed key fails here and not in a user's job:

- verl: its own Hydra config (the `ppo_trainer` config of the installed wheel, composed with
  hydra-core) with the overrides of `rlbatch plan` and of a command trial; an unknown key
  fails composition;
- OpenRLHF: the flags its PPO entry point defines (every `add_argument` of
  `openrlhf/cli/train_ppo_ray.py` in the installed wheel, read with `ast`, not imported);
- prime-rl: the names confirmed in docs/integrations.md ("prime-rl names"), each there with
  the source file that defines it.

`make setup` installs verl and OpenRLHF without their dependencies (`pip install --no-deps`,
so they cannot replace torch); these tests read their files (tests/test_walkthroughs.py runs
their own checks).
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import re
from pathlib import Path

import pytest

from rlbatch.interop.ingest import openrlhf as openrlhf_ingest
from rlbatch.interop.ingest.common import FrameworkConfig
from rlbatch.interop.launch import TrialSpec, launch
from rlbatch.interop.plan import make_plan

DOCS = Path(__file__).resolve().parents[1] / "docs" / "integrations.md"


def _package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)  # a top-level package: found, not imported
    assert spec is not None and spec.submodule_search_locations, (
        f"{name} is not installed: `make setup` installs it with --no-deps for these tests")
    return Path(next(iter(spec.submodule_search_locations)))


def _specs(framework: str) -> list[TrialSpec]:
    base = {"framework": framework, "prompts": 64, "samples_per_prompt": 8, "minibatches": 4,
            "epochs": 2, "lr": 2e-6, "seed": 3, "eval_every_samples": 4096,
            "checkpoint_every_samples": 8192, "max_samples": 65536, "concurrency": 128}
    stale = [TrialSpec(algorithm="grpo", critic_lr=None, staleness=2, **base)] \
        if framework in ("openrlhf", "prime-rl") else []  # their own knob for it
    return [TrialSpec(algorithm="grpo", critic_lr=None, **base),
            TrialSpec(algorithm="ppo", critic_lr=9e-6, **base), *stale]


def _plan_settings(framework: str) -> list[dict]:
    """`rlbatch plan`'s settings for a base with warm-up, a step budget and mini-batches, GRPO
    and PPO."""
    out = []
    for critic in (None, 9e-6):
        base = FrameworkConfig(framework=framework, prompts_per_step=128, samples_per_prompt=8,
                               lr=1e-6, critic_lr=critic, mini_batch_prompts=32,
                               warmup_steps=10, total_steps=500)
        out += [c["settings"] for c in make_plan(base, [64, 256], per_device_batch=8)
                ["candidates"]]
    return out


# ---------------------------------------------------------------- verl
def _compose_verl(overrides: list[str]):
    pytest.importorskip("hydra")
    from hydra import compose, initialize_config_dir

    config_dir = _package_dir("verl") / "trainer" / "config"
    with initialize_config_dir(config_dir=str(config_dir), version_base=None):
        return compose(config_name="ppo_trainer", overrides=overrides)


def _select(cfg, key: str):
    from omegaconf import OmegaConf

    return OmegaConf.select(cfg, key, throw_on_missing=False)


def test_verl_composes_every_override_of_a_trial_and_of_plan(tmp_path):
    from hydra.errors import ConfigCompositionException

    must = ["actor_rollout_ref.rollout.name=vllm"]  # mandatory (???) in verl's own config
    for spec in _specs("verl"):
        ln = launch(spec, [], tmp_path / "a", tmp_path)
        appended = [w for w in ln.argv if not w.startswith("+")]
        cfg = _compose_verl(must + appended)
        for word in appended:  # each value arrived under its key
            key, value = word.split("=", 1)
            got = _select(cfg, key)
            assert str(got).lower() == value.lower() or \
                (isinstance(got, (int, float)) and float(got) == float(value)) or \
                (key == "trainer.logger" and list(got) == ["console", "wandb", "file"]), \
                (key, got)  # verl's own loggers (ppo_trainer.yaml) and its file logger
        # the runtime env the log path is appended under exists (a `+` key is never refused)
        assert _select(cfg, "ray_kwargs.ray_init.runtime_env") is not None
    for settings in _plan_settings("verl"):
        _compose_verl(must + [f"{k}={v}" for k, v in settings.items()])
    with pytest.raises(ConfigCompositionException, match="Could not override"):
        _compose_verl([*must, "trainer.test_freqq=2"])  # the check can fail


def test_verl_one_step_off_composes_every_override_of_a_trial_at_staleness_1(tmp_path,
                                                                          monkeypatch):
    """The one-step-off entry (rollout.max_staleness 1 on verl) runs the
    `one_step_off_ppo_trainer` config, `ppo_trainer` under its own keys, searched for at
    `verl/trainer/config` from where the command runs: a trial's overrides compose there
    too, and the config says what makes it one step off (log-probabilities from the
    rollout, its clip against them)."""
    pytest.importorskip("hydra")
    from hydra import compose, initialize_config_dir

    root = _package_dir("verl")
    monkeypatch.chdir(root.parent)  # its searchpath, file://verl/trainer/config
    spec = _specs("verl")[0]
    ln = launch(dataclasses.replace(spec, staleness=1),
                ["python3", "-m", "verl.experimental.one_step_off_policy.main_ppo"],
                tmp_path / "a", tmp_path)
    appended = [w for w in ln.argv[3:] if not w.startswith("+")]
    with initialize_config_dir(config_dir=str(root / "experimental" / "one_step_off_policy" /
                                              "config"), version_base=None):
        cfg = compose(config_name="one_step_off_ppo_trainer",
                      overrides=["actor_rollout_ref.rollout.name=vllm", *appended])
    for word in appended:
        key, value = word.split("=", 1)
        got = _select(cfg, key)
        assert str(got).lower() == value.lower() or \
            (isinstance(got, (int, float)) and float(got) == float(value)) or \
            (key == "trainer.logger" and list(got) == ["console", "wandb", "file"]), (key, got)
    assert _select(cfg, "actor_rollout_ref.rollout.calculate_log_probs") is True
    assert _select(cfg, "algorithm.rollout_correction.bypass_mode") is True


# ---------------------------------------------------------------- OpenRLHF
def openrlhf_flags(path: Path) -> set[str]:
    """Every option string of `parser.add_argument(...)` in the file: literal names, and
    f-string names inside `for NAME in (constants):` loops expanded over the constants."""
    tree = ast.parse(path.read_text())
    flags: set[str] = set()

    def visit(node, env: dict) -> None:
        if isinstance(node, ast.For) and isinstance(node.target, ast.Name) and \
                isinstance(node.iter, (ast.Tuple, ast.List)):
            for value in (e.value for e in node.iter.elts if isinstance(e, ast.Constant)):
                for child in node.body:
                    visit(child, {**env, node.target.id: value})
            return
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
            for arg in node.args:
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    flags.add(arg.value)
                elif isinstance(arg, ast.JoinedStr):
                    flags.add("".join(str(v.value) if isinstance(v, ast.Constant) else
                                      env[v.value.id] for v in arg.values))
        for child in ast.iter_child_nodes(node):
            visit(child, env)

    visit(tree, {})
    return flags


def test_openrlhf_defines_every_flag_of_a_trial_plan_and_ingest(tmp_path):
    flags = openrlhf_flags(_package_dir("openrlhf") / "cli" / "train_ppo_ray.py")
    assert len(flags) > 100 and "--actor.adam.lr" in flags  # the loop over actor, critic
    emitted = set()
    for spec in _specs("openrlhf"):
        emitted |= {w for w in launch(spec, [], tmp_path / "a", tmp_path).argv
                    if w.startswith("--")}
    for settings in _plan_settings("openrlhf"):
        emitted |= set(settings)
    emitted |= set(openrlhf_ingest.DOTTED.values())  # what ingest reads from launch scripts
    assert sorted(emitted - flags) == []
    assert "--train.max_steps" not in flags  # the check can fail: no such flag exists


# ---------------------------------------------------------------- prime-rl
def confirmed_prime_rl_names() -> set[str]:
    """The names of the table under "### prime-rl names" in docs/integrations.md."""
    text = DOCS.read_text()
    section = text.split("### prime-rl names", 1)[1].split("\n#", 1)[0]
    return {m.group(1) for m in re.finditer(r"^\| `([^`]+)` \|", section, re.MULTILINE)}


def test_prime_rl_flags_are_the_names_confirmed_in_the_docs(tmp_path):
    names = confirmed_prime_rl_names()
    assert "orchestrator.batch_size" in names and "max_steps" in names
    emitted = set()
    for spec in _specs("prime-rl"):
        ln = launch(spec, [], tmp_path / "a", tmp_path)
        emitted |= set(ln.settings)
        emitted |= {w[2:].replace("-", "_") for w in ln.argv
                    if w.startswith("--") and w[2:].replace("-", "_") not in ln.settings}
    for settings in _plan_settings("prime-rl"):
        emitted |= set(settings)
    assert sorted(emitted - names) == []


# ---------------------------------------------------------------- the walk-throughs' configs
def walkthrough_configs() -> dict[str, str]:
    """The config of each "### Walk-through" section of docs/integrations.md: its ```yaml
    block, or the YAML its shell block writes with a heredoc."""
    out = {}
    for section in DOCS.read_text().split("\n### Walk-through: ")[1:]:
        title, body = section.split("\n", 1)
        body = body.split("\n### ", 1)[0].split("\n## ", 1)[0]
        m = re.search(r"```yaml\n(.*?)```", body, re.DOTALL) or \
            re.search(r"<<'?YAML'?[^\n]*\n(.*?)\nYAML\n", body, re.DOTALL)
        assert m, f"walk-through {title!r} holds no config"
        out[title] = m.group(1)
    return out


def test_every_walkthrough_config_is_valid(tmp_path):
    """What a reader copies from docs/integrations.md passes rlbatch's own config checks
    (the frameworks' own checks of the commands: the tests above)."""
    from rlbatch.core.loading import load_config

    configs = walkthrough_configs()
    assert len(configs) == 5 and any(t.startswith("OpenRLHF") for t in configs)
    for title, text in configs.items():
        path = tmp_path / "walkthrough.yaml"
        path.write_text(text)
        cfg = load_config(str(path))
        assert cfg.backend == "command", title


def test_a_gain_target_is_refused_for_openrlhf_which_never_evaluates_before_training(
        tmp_path, capsys):
    """OpenRLHF (openrlhf/trainer/ppo_trainer.py `fit`, 3c3be62) evaluates only after a
    training step, so a gain over the start cannot be measured: one line naming target.gain
    and what to set instead."""
    from helpers.cli import run_cli

    text = walkthrough_configs()["OpenRLHF (0.10.2 and later)"]
    path = tmp_path / "o.yaml"
    path.write_text(text.replace("value: 0.55}", "value: null, gain: 0.05}"))
    assert "gain: 0.05" in path.read_text()
    code, _, err = run_cli(["config", "check", str(path)], capsys)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, lines
    assert "target.gain: OpenRLHF evaluates only after training steps" in lines[0]
    assert "set target.value" in lines[0]


def walkthrough_commands(title_start: str) -> list[str]:
    """The `rlbatch profile` command lines of one walk-through of docs/integrations.md,
    continuation lines joined."""
    doc = (Path(__file__).parents[1] / "docs" / "integrations.md").read_text()
    body = doc.split(f"### Walk-through: {title_start}", 1)[1].split("\n### ", 1)[0]
    body = body.split("\n## ", 1)[0].replace("\\\n", " ")
    return [" ".join(line.split("#", 1)[0].split()) for line in body.splitlines()
            if line.startswith("rlbatch profile ")]


@pytest.mark.parametrize("walkthrough", ["verl", "OpenRLHF"])
def test_a_ray_job_of_a_ray_driver_asks_for_no_entrypoint_gpus(walkthrough, tmp_path, capsys):
    """Ray reserves a job's entrypoint_num_gpus for the entrypoint, apart from the actors it
    starts (ray/dashboard/modules/job/sdk.py `submit_job`, Ray 2.60), so verl's and
    OpenRLHF's drivers, which ask Ray for their actors' GPUs, would find them taken:
    `--trial-gpus` above 0 is refused in one line before anything is written, and the
    walk-throughs' ray-job commands ask for none."""
    from helpers.cli import run_cli

    (text,) = [c for t, c in walkthrough_configs().items() if t.startswith(walkthrough)]
    commands = walkthrough_commands(walkthrough)
    jobs = [c for c in commands if "--executor ray-job" in c]
    assert jobs and not any("--trial-gpus" in c for c in jobs), commands
    config = tmp_path / "w.yaml"
    config.write_text(text)
    out = tmp_path / "p"
    code, _, err = run_cli(["profile", config, "--out", out, "--executor", "ray-job",
                            "--address", "http://127.0.0.1:9", "--trial-gpus", "8"], capsys)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, lines
    assert lines[0].startswith("error: --trial-gpus 8: a Ray job's GPUs are reserved for its "
                               "entrypoint")
    assert "leave --trial-gpus at 0" in lines[0] and not out.exists()


def test_a_ray_job_of_rlbatch_train_may_ask_for_entrypoint_gpus(tmp_path):
    """The built-in trainer trains inside the job's entrypoint: its GPUs are the entrypoint's."""
    from rlbatch.core.loading import load_config
    from rlbatch.profile.executors import check_trial_gpus

    check_trial_gpus("ray-job", 8, load_config(None, preset="quick"))
    check_trial_gpus("ray", 8, load_config(None, preset="quick"))
