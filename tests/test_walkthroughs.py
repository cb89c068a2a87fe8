"""The walk-throughs of docs/integrations.md are fixtures, read from the doc: every trial's
full command line of each walk-through's profile (the baseline, each candidate, the fixed-LR
control; built by the code a command trial runs: `trial_spec` and `launch`) passes the
framework's own checks wherever they run without a GPU (issue 41, acceptance 2):

- verl: `validate_config` (verl/utils/config.py of the installed verl 0.9.1, called as
  verl/trainer/main_ppo.py `main` calls it, with verl's own `need_reference_policy` and
  `need_critic`) on the Hydra config composed from the trial's overrides;
- OpenRLHF: the argument parser and every check of the `__main__` block of
  openrlhf/cli/train_ppo_ray.py (0.11.2), executed as written with `train` replaced by a
  capture, and the GPUs its `train` places on Ray (lines 39-140) fit the one 8-GPU node the
  walk-through names;
- prime-rl: its config classes (`prime_rl.configs`, packages/prime-rl-configs at 559b447)
  cannot run here: that package is not published on the package registry (it installs from
  prime-rl's repository only) and needs Python 3.12 (this project's environment is 3.11).
  What can be checked is: the TOML the walk-through writes parses, defines an evaluation
  source (EvalConfig refuses an `[orchestrator.eval]` block without one, orchestrator.py
  `validate_non_empty_sources`) and turns on no W&B monitor, and every name rlbatch
  appends is one confirmed in the doc (test_framework_keys);
- TRL: the walk-through's shell block runs as written (slow; below).

verl and OpenRLHF, and the few pure-Python modules their config code imports, are installed
by `make setup` with `--no-deps`, so that none can replace torch.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import tomllib

from test_framework_keys import DOCS, walkthrough_configs

REPO = Path(__file__).resolve().parents[1]
NODE_GPUS = 8  # the walk-throughs' node


def trial_commands(title_start: str, tmp_path: Path, text: str | None = None) -> dict:
    """Each trial's full argv of the walk-through's profile, by trial name."""
    from rlbatch.backends.command.preflight import trial_spec
    from rlbatch.core.loading import load_config
    from rlbatch.interop.launch import launch
    from rlbatch.profile.trials import plan_trials

    if text is None:
        (text,) = [c for t, c in walkthrough_configs().items() if t.startswith(title_start)]
    path = tmp_path / "walkthrough.yaml"
    path.write_text(text)
    cfg = load_config(str(path))
    trials = plan_trials(cfg, tmp_path / "runs", cfg.rollout.generation_concurrency, [0])
    assert {t.kind for t in trials} == {"baseline", "sqrt", "control"}, [t.name for t in trials]
    return {t.name: launch(trial_spec(t.config), t.config.command.argv,
                           tmp_path / t.name / "a1", tmp_path / t.name).argv for t in trials}


# ---------------------------------------------------------------- verl
def verl_validate(overrides: list[str]) -> None:
    """verl's own check of a command line, as verl/trainer/main_ppo.py `main` runs it."""
    pytest.importorskip("tensordict")
    from hydra import compose, initialize_config_dir
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    config_dir = Path(importlib.util.find_spec("verl").submodule_search_locations[0])
    with initialize_config_dir(config_dir=str(config_dir / "trainer" / "config"),
                               version_base=None):
        cfg = compose(config_name="ppo_trainer", overrides=overrides)
    validate_config(config=cfg, use_reference_policy=need_reference_policy(cfg),
                    use_critic=need_critic(cfg))


@pytest.mark.filterwarnings("ignore:Disabled critic")
def test_every_trial_of_the_verl_walkthrough_passes_verls_validate_config(tmp_path):
    commands = trial_commands("verl", tmp_path)
    assert len(commands) == 4
    for name, argv in commands.items():
        assert argv[:3] == ["python3", "-m", "verl.trainer.main_ppo"], name
        verl_validate(argv[3:])
    # the check can fail: without the actor's micro-batch size verl refuses the command
    argv = next(iter(commands.values()))[3:]
    without = [w for w in argv if not w.startswith("actor_rollout_ref.actor.ppo_micro_batch")]
    assert len(without) == len(argv) - 1
    with pytest.raises(Exception, match="ppo_micro_batch_size"):
        verl_validate(without)


# ---------------------------------------------------------------- OpenRLHF
def openrlhf_main(argv: list[str]) -> argparse.Namespace:
    """OpenRLHF's parser and checks: the `__main__` block of openrlhf/cli/train_ppo_ray.py,
    run as written after the file's standard-library imports, with `train` capturing the
    arguments it would train with. An AssertionError or SystemExit is OpenRLHF's refusal."""
    pytest.importorskip("pylatexenc")
    file = Path(importlib.util.find_spec("openrlhf").submodule_search_locations[0],
                "cli", "train_ppo_ray.py")
    tree = ast.parse(file.read_text())
    (main,) = [n for n in tree.body if isinstance(n, ast.If) and "__main__" in ast.unparse(n.test)]
    stdlib = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))
              and (getattr(n, "module", None) or n.names[0].name).split(".")[0]
              in sys.stdlib_module_names]
    code = compile(ast.Module(body=stdlib + main.body, type_ignores=[]), str(file), "exec")
    got: list = []
    saved, sys.argv = sys.argv, [str(file), *argv]
    try:
        # OpenRLHF's own code, from the installed wheel
        exec(code, {"__name__": "__main__", "train": got.append})  # noqa: S102
    finally:
        sys.argv = saved
    (args,) = got
    return args


def openrlhf_gpus(a: argparse.Namespace) -> int:
    """The GPUs OpenRLHF's `train` (train_ppo_ray.py lines 39-140, 0.11.2) places on Ray:
    the actor's; the reference's unless colocated with the actor (and it exists only with a
    KL coefficient); vLLM's engines unless `colocate_all` shares the actor's group (not with
    async); the critic's (GAE only) and a reward model's (no remote reward) unless
    `colocate_all`, and the reward's also not with `colocate_critic_reward`."""
    def group(role):
        return role.num_nodes * role.num_gpus_per_node

    t = a.train
    total = group(a.actor)
    if a.algo.kl.init_coef > 0 and not (t.colocate_actor_ref or t.colocate_all):
        total += group(a.ref)
    if (a.vllm.num_engines or 0) > 0 and not (t.colocate_all and not t.async_enable):
        total += a.vllm.num_engines * a.vllm.tensor_parallel_size
    if not t.colocate_all:
        total += group(a.critic) if a.critic.model_name_or_path else 0
        if not a.reward.remote_url and not (a.critic.model_name_or_path and
                                             t.colocate_critic_reward):
            total += group(a.reward)
    return total


def test_every_trial_of_the_openrlhf_walkthrough_passes_openrlhfs_checks_on_one_node(
        tmp_path):
    commands = trial_commands("OpenRLHF", tmp_path)
    assert len(commands) == 4
    for name, argv in commands.items():
        assert argv[:3] == ["python3", "-m", "openrlhf.cli.train_ppo_ray"], name
        args = openrlhf_main(argv[3:])
        assert args.rollout.batch_size * args.rollout.n_samples_per_prompt == \
            args.train.batch_size, name  # one update per step: rlbatch's B
        assert openrlhf_gpus(args) <= NODE_GPUS, (name, openrlhf_gpus(args))
    # the checks can fail: OpenRLHF refuses a group estimator with one sample per prompt,
    # and without colocation the same flags ask for 8 + 8 + 8 GPUs
    argv = next(iter(commands.values()))[3:]
    with pytest.raises(AssertionError, match="n_samples_per_prompt > 1"):
        openrlhf_main([*argv, "--rollout.n_samples_per_prompt", "1"])
    apart = openrlhf_main([w for w in argv if w != "--train.colocate_all"])
    assert openrlhf_gpus(apart) == 24


# ---------------------------------------------------------------- staleness
def staleness_blocks() -> list[dict]:
    """The YAML blocks of docs/integrations.md, "Staleness: rollouts decoded ahead of the
    update": OpenRLHF's whole config, then verl's changes to its walk-through's."""
    import yaml

    body = DOCS.read_text().split("### Staleness: rollouts decoded ahead", 1)[1]
    body = body.split("\n### ", 1)[0]
    return [yaml.safe_load(textwrap.dedent(b))
            for b in re.findall(r"```yaml\n(.*?)```", body, re.DOTALL)]


def stale_trial_commands(data: dict, tmp_path: Path) -> dict:
    """Each trial's full argv of a staleness profile (its stale trials included)."""
    import yaml

    commands = trial_commands("", tmp_path, yaml.safe_dump(data))
    assert any("-k" in name for name in commands), list(commands)
    return commands


def test_every_trial_of_the_openrlhf_staleness_profile_passes_openrlhfs_checks(tmp_path):
    (data, _) = staleness_blocks()
    commands = stale_trial_commands(data, tmp_path)
    assert len(commands) == 10  # the baseline; B0 at 1, 2; B = 1024, 2048 at 0, 1, 2; the control
    for name, argv in commands.items():
        args = openrlhf_main(argv[3:])
        assert args.train.async_enable == ("-k" in name), name
        if "-k" in name:
            assert args.train.async_queue_size == int(name.split("-k")[1].split("-")[0])
        assert openrlhf_gpus(args) == NODE_GPUS, name  # the same 8 at every staleness
    # the check can fail: OpenRLHF refuses --vllm.enable_sleep with its async trainer where
    # vLLM is colocated (it turns sleep off itself otherwise, train_ppo_ray.py 707-715)
    stale = next(a for n, a in commands.items() if "-k" in n)[3:]
    with pytest.raises(AssertionError, match="enable_sleep"):
        openrlhf_main([*stale, "--train.colocate_all", "--vllm.enable_sleep"])


def test_every_trial_of_the_verl_one_step_off_profile_passes_the_recipes_checks(
        tmp_path, monkeypatch):
    """The one-step-off command of the staleness section, in the verl walk-through: every
    trial's overrides compose on the recipe's config (verl 0.9.1,
    experimental/one_step_off_policy/config/one_step_off_ppo_trainer.yaml), pass
    `validate_config` as its main_ppo.py 52-56 calls it, and the recipe trainer's own
    asserts (ray_trainer.py 88: no hybrid engine; 180: async rollout)."""
    import yaml

    pytest.importorskip("tensordict")
    from hydra import compose, initialize_config_dir
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    (_, change) = staleness_blocks()
    (text,) = [c for t, c in walkthrough_configs().items() if t.startswith("verl")]
    data = yaml.safe_load(text)
    data["command"]["argv"] = change["command"]["argv"]
    data["rollout"] = {**data.get("rollout", {}), **change["rollout"]}
    data["profile"] = change["profile"]
    commands = trial_commands("", tmp_path, yaml.safe_dump(data))
    assert len(commands) == 4
    root = Path(importlib.util.find_spec("verl").submodule_search_locations[0])
    monkeypatch.chdir(root.parent)  # the recipe's searchpath: file://verl/trainer/config
    for name, argv in commands.items():
        assert argv[:3] == ["python3", "-m", "verl.experimental.one_step_off_policy.main_ppo"]
        with initialize_config_dir(config_dir=str(root / "experimental" / "one_step_off_policy"
                                                  / "config"), version_base=None):
            cfg = compose(config_name="one_step_off_ppo_trainer",
                          overrides=[w for w in argv[3:] if not w.startswith("+")])
        validate_config(config=cfg, use_reference_policy=need_reference_policy(cfg),
                        use_critic=need_critic(cfg))
        assert not cfg.actor_rollout_ref.hybrid_engine, name
        assert cfg.actor_rollout_ref.rollout.mode == "async", name


# ---------------------------------------------------------------- prime-rl
def prime_rl_toml() -> str:
    body = DOCS.read_text().split("### Walk-through: prime-rl", 1)[1].split("\n### ", 1)[0]
    m = re.search(r"<<'TOML'\n(.*?)\nTOML\n", body, re.DOTALL)
    assert m, "the prime-rl walk-through writes no TOML"
    return m.group(1)


def test_the_prime_rl_walkthrough_toml_evaluates_and_reports_nowhere_else(tmp_path):
    """The checks of prime-rl's own config classes cannot run here (module docstring)."""
    toml = tomllib.loads(prime_rl_toml())
    sources = toml["orchestrator"]["eval"]["source"]
    assert sources and all(s.get("name") for s in sources)
    assert "wandb" not in toml.get("monitors", {})
    assert not {"max_steps", "ckpt"} & set(toml)  # rlbatch sets the run's length, checkpoints
    assert {"batch_size", "group_size"}.isdisjoint(toml["orchestrator"])
    commands = trial_commands("prime-rl", tmp_path)
    for name, argv in commands.items():
        at = argv.index("@")
        assert argv[at + 1] == "reverse-text.toml", name  # the file the walk-through writes
        # the evaluation cadence rlbatch sets is the one the TOML's block takes
        assert "--orchestrator.eval.interval" in argv, name


# ---------------------------------------------------------------- TRL, run as written
def trl_shell_block() -> str:
    """The walk-through's shell block: the section's first code block, the one that starts
    with `make setup` (the blocks after it show what the block prints)."""
    body = DOCS.read_text().split("### Walk-through: TRL", 1)[1].split("\n### ", 1)[0]
    return re.findall(r"```\n(.*?)```", body, re.DOTALL)[0]


def test_the_trl_walkthroughs_shell_block_is_found_and_runs_rlbatch_profile():
    """The slow test's set-up, run fast: the shell block it runs line by line is the one that
    sets up and profiles (an expected-output block after it once broke the unpacking)."""
    lines = trl_shell_block().splitlines()
    assert lines[0].startswith("make setup")
    assert lines[-1].startswith(".venv/bin/rlbatch profile trl.yaml")


@pytest.mark.landing_free
def test_model_build_path_prints_only_the_folder(tiny_model_dir, capsys):
    """`MODEL=$(rlbatch model build --path)`, the walk-through's line that names the model:
    stdout is the model's folder and nothing else."""
    from helpers.cli import run_cli

    code, out, _ = run_cli(["model", "build", "--path"], capsys)
    assert code == 0 and out == f"{tiny_model_dir}\n"
    code, _, err = run_cli(["model", "build", "--random", "--path"], capsys)
    assert code == 2 and err.strip().splitlines() == [
        "error: --path: for the tiny model only; with --random use --json"]


@pytest.mark.slow
@pytest.mark.trained
@pytest.mark.lands
def test_the_trl_walkthrough_runs_as_written(tmp_path):
    """Every line of the walk-through's shell block, in a fresh folder beside this
    checkout's virtual environment, except `make setup`, which built the environment this
    test runs in. Slow: a real TRL profile, about four minutes on 2 cores. The fast tests of
    the same contracts: test_framework_keys::test_every_walkthrough_config_is_valid (the
    config parses and passes rlbatch's checks), test_command::test_trl_flags_count_optimizer_steps_and_resume_from_the_newest_checkpoint
    (the flags rlbatch gives TRL), test_model_build_path_prints_only_the_folder (the
    line that names the model) and
    test_the_trl_walkthroughs_shell_block_is_found_and_runs_rlbatch_profile (the block)."""
    lines = trl_shell_block().splitlines()
    (tmp_path / ".venv").symlink_to(REPO / ".venv")
    script = "set -euo pipefail\n" + "\n".join(lines[1:]) + "\n"
    done = subprocess.run(["bash", "-c", script], cwd=tmp_path, capture_output=True,
                          text=True, timeout=1800, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "decision:" in done.stdout, done.stdout[-3000:]
    profile = json.loads((tmp_path / "profiles" / "trl" / "profile.json").read_text())
    trials = profile["trials"]
    assert trials and all(t["failure"] is None and t["status"] != "failed" for t in trials), \
        [(t["trial"], t["status"], t["failure"]) for t in trials]


@pytest.mark.parametrize("framework, words", [
    ("trl", ["--model_name_or_path", "$MODEL"]),
    ("trl", ["--model_name_or_path", "/no/such/model"]),
    ("openrlhf", ["--actor.model_name_or_path", "./no-such-model"]),
    ("verl", ["actor_rollout_ref.model.path=~/no-such-model"])])
def test_a_model_path_that_is_no_folder_is_refused_before_any_trial(framework, words,
                                                                      tmp_path, capsys):
    """A local model path that does not exist (or a shell variable left unexpanded, as a
    quoted heredoc leaves it) would be taken for a hub name and fail in every trial on a
    download that never names it: `config check` and `profile` refuse it in one line."""
    from helpers.cli import run_cli

    (text,) = [c for t, c in walkthrough_configs().items() if t.startswith("TRL")]
    text = re.sub(r"argv: \[.*?\]\n", f"argv: {json.dumps([sys.executable, *words])}\n",
                  text, flags=re.DOTALL).replace("framework: trl", f"framework: {framework}")
    if framework == "openrlhf":
        text = re.sub(r"target: \{.*?\}", "target: {metric: eval/reward, value: 0.5}", text)
    config = tmp_path / "c.yaml"
    config.write_text(text)
    for args in (["config", "check", config], ["profile", config, "--out", tmp_path / "p"]):
        code, _, err = run_cli(args, capsys)
        lines = err.strip().splitlines()
        assert code == 2 and len(lines) == 1, (args, lines)
        assert lines[0].startswith(f"error: command.argv: {words[0].split('=')[0]} "), lines
        assert "no such model folder" in lines[0] and not (tmp_path / "p").exists()
    # a hub name (org/name) is the framework's to resolve
    config.write_text(text.replace(words[-1].split("=")[-1], "org/some-model"))
    code, _, err = run_cli(["config", "check", config], capsys)
    assert code == 0, err


def test_an_openrlhf_eval_set_that_some_trial_would_cut_is_refused(tmp_path, capsys,
                                                                   monkeypatch):
    """OpenRLHF cuts its evaluation set to `--data.max_samples` prompts
    (openrlhf/trainer/ppo_trainer.py, `prepare_datasets`, 3c3be62), which rlbatch sets per
    trial to its steps x P: with a budget that no B divides, the baseline keeps fewer prompts
    than the candidates, and each trial would be evaluated on another set. Refused before
    anything is written, naming the file, the trial and the budget that keeps it whole."""
    from helpers.cli import run_cli

    (text,) = [c for t, c in walkthrough_configs().items() if t.startswith("OpenRLHF")]
    text = text.replace("max_samples: 262144", "max_samples: 250000")
    text = re.sub(r"argv: \[.*?\]\n", "argv: " + json.dumps(
        [sys.executable, "--eval.dataset", "eval.jsonl"]) + "\n", text, flags=re.DOTALL)
    cuts = {name: int(argv[argv.index("--data.max_samples") + 1])
            for name, argv in trial_commands("OpenRLHF", tmp_path, text).items()}
    assert min(cuts.values()) == cuts["base-P128-s0"] == 31360 < cuts["sqrt-P512-s0"]
    config = tmp_path / "o.yaml"
    config.write_text(text)
    monkeypatch.chdir(tmp_path)  # where the command runs, and its relative paths resolve
    (tmp_path / "eval.jsonl").write_text('{"prompt": "x"}\n' * 31361)
    for args in (["config", "check", config], ["profile", config, "--out", tmp_path / "p"]):
        code, _, err = run_cli(args, capsys)
        assert code == 2 and err.strip().splitlines() == [(
            "error: command.argv: --eval.dataset eval.jsonl: 31,361 prompts, more than the "
            "31,360 OpenRLHF keeps of it in the trial with P = 128 (it cuts the evaluation "
            "set at --data.max_samples, which rlbatch sets from budget.max_samples): use at "
            "most 31,360 prompts, or set budget.max_samples to at least 250,888")], err
        assert not (tmp_path / "p").exists()
    (tmp_path / "eval.jsonl").write_text('{"prompt": "x"}\n' * 31360)  # kept whole by all
    code, _, err = run_cli(["config", "check", config], capsys)
    assert code == 0, err


def test_the_report_and_the_docs_agree_on_what_a_trls_training_seconds_hold():
    """TRL's log does not time checkpoint saves apart, so a followed TRL run's seconds hold
    them: the report's caption, the run's `train_s_source` and docs/integrations.md say so
    alike (the caption said "checkpointing excluded" for every run)."""
    from rlbatch.backends.command.follow import TRAIN_S_SOURCE
    from rlbatch.report.text import CAPTIONS

    assert TRAIN_S_SOURCE["trl"].endswith("checkpoint saves included")
    assert "included for TRL" in CAPTIONS["invariance_time"]
    (row,) = [r for r in DOCS.read_text().splitlines() if r.startswith("| TRL (`trl grpo`) |")]
    assert "checkpoint saves stay in `train_s`" in row


def heredoc_yaml(block: str) -> dict:
    """The YAML a shell block writes with `cat > FILE <<YAML`, its $MODEL a placeholder."""
    import yaml

    body = block.split("<<YAML", 1)[1].split("\n", 1)[1].split("\nYAML", 1)[0]
    return yaml.safe_load(body.replace("$MODEL", "MODEL"))


def test_the_guides_trl_recipe_is_the_walkthroughs_config():
    """docs/guide.md's TRL recipe, which a newcomer runs with its cost stated before it
    starts, writes the walk-through's config: the same batch, baseline, target, budget,
    cadences and profile settings, and TRL's same flags (the walk-through's block is the
    one the slow test runs as written)."""
    guide = (DOCS.parent / "guide.md").read_text()
    block = next(b for b in re.findall(r"```\n(.*?)```", guide, re.DOTALL) if "<<YAML" in b)
    mine, theirs = heredoc_yaml(block), heredoc_yaml(trl_shell_block())
    for key in ("backend", "batch", "optimizer", "target", "budget", "eval", "checkpoint"):
        assert mine[key] == theirs[key], key
    assert {k: v for k, v in theirs["profile"].items() if k not in ("seeds", "confirm_seeds")} \
        == mine["profile"]
    assert theirs["profile"]["seeds"] == theirs["profile"]["confirm_seeds"] == 1  # defaults
    assert mine["command"]["argv"][1:] == theirs["command"]["argv"][1:]
    assert Path(theirs["command"]["argv"][0]).name == mine["command"]["argv"][0] == "trl"
