"""`rlbatch plan`: exact per-framework settings, LR values and unit conversions.

Hand-computed cases: base P0 = 128 prompts x G = 8 = B0 = 1024, eta0 = 1e-6, so sqrt scaling
gives 1.41421e-06 at B = 2048, 2e-06 at 4096 and 2.82843e-06 at 8192 (linear: 2x, 4x, 8x).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from helpers.cli import run_cli
from rlbatch.interop.ingest import read_framework_config
from rlbatch.interop.plan import make_plan, merge_base

FIX = Path(__file__).parent / "fixtures" / "ingest"
BASE = ["--base-prompts", "128", "--samples-per-prompt", "8", "--base-lr", "1e-6"]


def plan_json(args, capsys) -> dict:
    code, out, err = run_cli(["plan", *args, "--json"], capsys)
    assert code in (0, None), err
    return json.loads(out.strip().splitlines()[-1])


def by_p(doc: dict) -> dict:
    return {c["prompts_per_step"]: c for c in doc["candidates"]}


def test_verl_sqrt_overrides_one_update_per_step(capsys):
    doc = plan_json(["--framework", "verl", *BASE, "--prompts", "256,512,1024"], capsys)
    c = by_p(doc)
    assert c[256]["args"] == [
        "data.train_batch_size=256", "actor_rollout_ref.rollout.n=8",
        "actor_rollout_ref.actor.ppo_mini_batch_size=256",
        "actor_rollout_ref.actor.optim.lr=1.41421e-06"]
    assert c[512]["args"][3] == "actor_rollout_ref.actor.optim.lr=2e-06"
    assert c[1024]["args"][3] == "actor_rollout_ref.actor.optim.lr=2.82843e-06"
    for p, b in ((256, 2048), (512, 4096), (1024, 8192)):
        assert c[p]["sequences_per_step"] == b
        assert c[p]["lr"] == pytest.approx(1e-6 * math.sqrt(b / 1024), rel=1e-12)
        assert c[p]["updates_per_step"] == 1
    assert "per rollout step" in doc["warnings"][0] and "samples" in doc["warnings"][0]


def test_openrlhf_units_prompts_and_samples(capsys):
    doc = plan_json(["--framework", "openrlhf", *BASE, "--prompts", "256,512", "--rule", "linear"],
                    capsys)
    c = by_p(doc)
    # without a base script: the dotted flags of OpenRLHF 0.10.2 and later, the flat ones named
    assert c[256]["args"] == ["--rollout.batch_size 256", "--rollout.n_samples_per_prompt 8",
                              "--train.batch_size 2048", "--actor.adam.lr 2e-06"]
    assert c[512]["settings"]["--train.batch_size"] == 4096  # samples, not prompts
    assert any("--rollout_batch_size" in n and "0.10.1" in n for n in c[256]["notes"])
    assert c[512]["lr"] == pytest.approx(4e-6)
    assert "optimizer step" in doc["warnings"][0]


def test_mini_batching_keeps_k_and_says_so(capsys):
    doc = plan_json(["--framework", "openrlhf", *BASE, "--prompts", "256,100",
                     "--mini-batch-prompts", "32"], capsys)
    c = by_p(doc)
    assert c[256]["settings"]["--train.batch_size"] == 64 * 8  # P/k with k = 128/32 = 4
    assert c[256]["updates_per_step"] == 4
    assert any("k=4 optimizer updates per rollout step" in w for w in doc["warnings"])
    assert c[100]["mini_batch_prompts"] == 25 and c[100]["minibatches_per_step"] == 4
    doc = plan_json(["--framework", "openrlhf", *BASE, "--prompts", "90",
                     "--mini-batch-prompts", "32"], capsys)
    assert "not divisible" in doc["candidates"][0]["notes"][0]


def test_trl_per_device_completions_and_accumulation(capsys):
    doc = plan_json(["--framework", "trl", *BASE, "--prompts", "256", "--num-processes", "8",
                     "--per-device-batch", "16"], capsys)
    c = doc["candidates"][0]
    assert c["args"] == ["--per_device_train_batch_size 16", "--num_generations 8",
                         "--steps_per_generation 16", "--gradient_accumulation_steps 16",
                         "--learning_rate 1.41421e-06"]
    assert "16 completions x 8 processes x 16 steps = 2048" in c["notes"][0]
    code, _, err = run_cli(["plan", "--framework", "trl", *BASE, "--prompts", "255",
                            "--per-device-batch", "16"], capsys)
    assert code == 2 and "--per-device-batch" in err


def test_prime_rl_batch_size_counts_rollouts(capsys):
    doc = plan_json(["--framework", "prime-rl", *BASE, "--prompts", "512"], capsys)
    assert doc["candidates"][0]["args"] == ["orchestrator.batch_size = 4096",
                                            "orchestrator.group_size = 8",
                                            "trainer.optim.lr = 2e-06"]
    assert ("on the command line instead of the TOML file: --orchestrator.batch-size 4096 "
            "--orchestrator.group-size 8 --trainer.optim.lr 2e-06") in \
        doc["candidates"][0]["notes"]
    code, _, err = run_cli(["plan", "--framework", "prime-rl", *BASE, "--prompts", "512",
                            "--mini-batch-prompts", "64"], capsys)
    assert code == 2 and "one optimizer step" in err


def test_verl_base_script_converts_warmup_and_steps(capsys):
    doc = plan_json(["--framework", "verl", "--base", str(FIX / "verl" / "run_grpo.sh"),
                     "--prompts", "256"], capsys)
    base, c = doc["base"], doc["candidates"][0]
    assert (base["prompts_per_step"], base["samples_per_prompt"], base["lr"]) == (128, 8, 1e-6)
    assert base["mini_batch_prompts"] == 32 and base["warmup_steps"] == 10
    # k = 4 kept; verl's scheduler steps per rollout step: 10 x 1024 samples = 5 x 2048
    assert c["settings"] == {
        "data.train_batch_size": 256, "actor_rollout_ref.rollout.n": 8,
        "actor_rollout_ref.actor.ppo_mini_batch_size": 64,
        "actor_rollout_ref.actor.optim.lr": pytest.approx(1e-6 * math.sqrt(2)),
        "actor_rollout_ref.actor.optim.lr_warmup_steps": 5,
        "trainer.total_training_steps": 100}
    assert c["warmup_samples"] == 10240
    assert "10-step warm-up is converted" in doc["warnings"][0]


def test_verl_yaml_ppo_scales_critic_too():
    base = read_framework_config("verl", FIX / "verl" / "ppo_config.yaml")
    assert base.algorithm == "ppo" and base.critic_mini_batch_prompts == 256
    doc = make_plan(base, [512])
    s = doc["candidates"][0]["settings"]
    assert s["critic.optim.lr"] == pytest.approx(1e-5 * math.sqrt(2))
    assert s["critic.ppo_mini_batch_size"] == 512


def test_openrlhf_base_script():
    base = read_framework_config("openrlhf", FIX / "openrlhf" / "train_grpo_ray.sh")
    assert base.prompts_per_step == 128 and base.samples_per_prompt == 8
    assert base.mini_batch_prompts == 128
    assert base.algorithm == "grpo" and base.seed == 7 and base.warmup_ratio == 0.05
    c = make_plan(base, [256])["candidates"][0]
    assert c["args"][:3] == ["--rollout_batch_size 256", "--n_samples_per_prompt 8",
                             "--train_batch_size 2048"]
    assert any("--lr_warmup_ratio 0.05 unchanged" in n for n in c["notes"])
    assert not any("0.10.1" in n for n in c["notes"])  # the base's own spelling is kept


def test_openrlhf_dotted_base_script_reads_the_same_settings():
    """OpenRLHF 0.10.2 renamed its flags (rollout.batch_size, train.batch_size, actor.adam.lr,
    ...); a script in either spelling gives the same base, and the plan answers in its
    spelling."""
    flat = read_framework_config("openrlhf", FIX / "openrlhf" / "train_grpo_ray.sh")
    dotted = read_framework_config("openrlhf", FIX / "openrlhf" / "train_grpo_ray_dotted.sh")
    keys = ("prompts_per_step", "samples_per_prompt", "mini_batch_prompts", "lr",
            "warmup_ratio", "algorithm", "seed", "epochs_per_step")
    assert [getattr(dotted, k) for k in keys] == [getattr(flat, k) for k in keys]
    assert dotted.extra["flag_style"] == "dotted" and flat.extra["flag_style"] == "flat"
    c = make_plan(dotted, [256])["candidates"][0]
    assert c["args"][:3] == ["--rollout.batch_size 256", "--rollout.n_samples_per_prompt 8",
                             "--train.batch_size 2048"]
    assert any("--actor.lr_warmup_ratio 0.05 unchanged" in n for n in c["notes"])


def test_trl_base_config_warmup_in_optimizer_steps():
    base = read_framework_config("trl", FIX / "trl" / "grpo_config.yaml", num_processes=4)
    assert (base.prompts_per_step, base.samples_per_prompt) == (32, 8)  # 16 x 4 x 4 / 8
    c = make_plan(base, [64])["candidates"][0]
    assert c["settings"] == {"per_device_train_batch_size": 16, "num_generations": 8,
                             "steps_per_generation": 8, "gradient_accumulation_steps": 8,
                             "learning_rate": pytest.approx(1.41421356e-6),
                             "warmup_steps": 10, "max_steps": 250}


def test_prime_rl_base_toml():
    base = read_framework_config("prime-rl", FIX / "prime-rl" / "rl.toml")
    assert (base.prompts_per_step, base.samples_per_prompt, base.lr) == (32, 16, 3e-6)
    c = make_plan(base, [64])["candidates"][0]
    assert c["args"] == ["orchestrator.batch_size = 1024", "orchestrator.group_size = 16",
                         "trainer.optim.lr = 4.24264e-06", "trainer.scheduler.warmup_steps = 10",
                         "max_steps = 50"]


def test_prime_rl_group_size_under_either_name_and_its_default(tmp_path):
    """prime-rl's current key is orchestrator.group_size (older versions:
    rollouts_per_example); left out, prime-rl's default of 1 applies."""
    for text, g in (("[orchestrator]\nbatch_size = 256\ngroup_size = 8\n", 8),
                    ("[orchestrator]\nbatch_size = 256\nrollouts_per_example = 4\n", 4),
                    ("[orchestrator]\nbatch_size = 256\n", 1)):
        path = tmp_path / "rl.toml"
        path.write_text(text)
        base = read_framework_config("prime-rl", path)
        assert (base.prompts_per_step, base.samples_per_prompt) == (256 // g, g)


def test_table_output_prints_overrides_and_warning(capsys):
    code, out, _ = run_cli(["plan", "--framework", "verl", *BASE, "--prompts", "256"], capsys)
    assert code in (0, None)
    assert "  actor_rollout_ref.actor.optim.lr=1.41421e-06" in out
    assert "warning: LR schedules in verl advance once per rollout step" in out


@pytest.mark.parametrize("args,needle", [
    (["--framework", "verl", "--prompts", "256"],
     "--base-prompts, --samples-per-prompt, --base-lr"),
    (["--framework", "deepspeed", *BASE, "--prompts", "256"], "--framework"),
    (["--framework", "verl", *BASE, "--prompts", "2x6"], "--prompts"),
    (["--framework", "verl", *BASE, "--prompts", "256", "--rule", "cube"], "--rule"),
    (["--framework", "verl", "--base", "/nope.yaml", "--prompts", "256"], "/nope.yaml"),
])
def test_bad_input_one_line_exit_2(capsys, args, needle):
    code, _, err = run_cli(["plan", *args], capsys)
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and needle in err


def test_merge_base_flags_override_file():
    base = read_framework_config("verl", FIX / "verl" / "run_grpo.sh")
    merged = merge_base("verl", base, None, None, 2e-6, 128)
    assert merged.lr == 2e-6 and merged.minibatches_per_step == 1
    assert merged.prompts_per_step == 128
