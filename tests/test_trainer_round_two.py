"""The user's trainer, round two (docs/integrations.md, "What a second audit found"): the
words a trial appends and the folder state it resumes from (interop/launch.py), what the
command's own settings and files refuse (interop/usercmd.py), the thread share a command
gets, the executor a Ray-driving framework may run under, and the evidence word when
nothing was compared. No model and no framework is run: each test reads the launch words,
the folders and the one line printed.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import yaml

from helpers.cli import run_cli
from rlbatch.interop.launch import launch
from test_command import _spec

REPO = Path(__file__).resolve().parents[1]


def _save(root: Path, step: int, latest: bool = True) -> None:
    """One DeepSpeed save of OpenRLHF's: the tag folder first, `latest` after it
    (openrlhf/utils/deepspeed/deepspeed.py `save_ckpt` 695-756 at 3c3be62)."""
    (root / f"global_step{step}").mkdir(parents=True, exist_ok=True)
    (root / f"global_step{step}" / "mp_rank_00_model_states.pt").write_bytes(b"x")
    if latest:
        (root / "latest").write_text(f"global_step{step}")


def _config(tmp_path: Path, framework: str, argv: list[str], **over) -> Path:
    cfg = {"name": "round-two", "algorithm": "grpo", "backend": "command",
           "command": {"framework": framework, "argv": [sys.executable, *argv]},
           "batch": {"prompts_per_step": 16, "samples_per_prompt": 8},
           "optimizer": {"reference_sequences": 128, "reference_lr": 1.0e-6},
           "target": {"metric": "eval/reward", "value": 0.5, "gain": None},
           "budget": {"max_samples": 4096}, "eval": {"every_samples": 512},
           "profile": {"prompts_per_step": [32], "seeds": 1, "confirm_seeds": 1,
                       "concurrency": []}}
    for key, value in over.items():
        cfg[key] = value
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _one_line_refusal(tmp_path: Path, config: Path, capsys, *extra) -> str:
    """`config check` and `profile` both refuse in the same one line, exit 2, nothing
    written; returns the line."""
    lines = set()
    for args in (["config", "check", config],
                 ["profile", config, "--out", tmp_path / "p", *extra]):
        code, _, err = run_cli(args, capsys)
        got = err.strip().splitlines()
        assert code == 2 and len(got) == 1, (args, got)
        assert not (tmp_path / "p").exists()
        lines.add(got[0])
    return lines.pop()


# ---------------------------------------------------------------- 2. a cut first save
def test_openrlhf_a_first_save_cut_before_latest_starts_fresh_without_load_enable(tmp_path):
    """A kill between the `_actor` folder and DeepSpeed's `latest` leaves a save OpenRLHF
    cannot load: `load_ckpt` returns (None, {}) and `fit` fails on KeyError 'episode'
    (ppo_trainer.py 429-441, 503) at every retry. The next attempt starts fresh: no
    --ckpt.load_enable, and the cut save moved aside."""
    actor = tmp_path / "openrlhf-checkpoints" / "_actor"
    _save(actor, 4, latest=False)
    ln = launch(_spec("openrlhf"), ["python3", "-m", "openrlhf.cli.train_ppo_ray"],
                tmp_path / "a2", tmp_path)
    assert "--ckpt.load_enable" not in ln.argv and ln.resume_step == -1
    assert not (tmp_path / "openrlhf-checkpoints").exists()
    assert (tmp_path / "openrlhf-checkpoints.cut" / "_actor" / "global_step4").is_dir()
    # a complete save is resumed from, and the flag comes back
    _save(actor, 4)
    again = launch(_spec("openrlhf"), ["o"], tmp_path / "a3", tmp_path)
    assert again.argv[-1] == "--ckpt.load_enable" and again.resume_step == 4


# ---------------------------------------------------------------- 10. actor and critic apart
def test_openrlhf_ppo_resumes_from_the_step_both_actor_and_critic_saved(tmp_path):
    """Actor and critic each load the tag their own `latest` names (ppo_actor.py 573-576,
    ppo_critic.py 241-244); a kill between the two saves of step 8 leaves the actor at 8 and
    the critic at 4. The attempt resumes both from 4, the step they share."""
    root = tmp_path / "openrlhf-checkpoints"
    for step in (4, 8):
        _save(root / "_actor", step)
    _save(root / "_critic", 4)
    (root / "_critic" / "global_step8").mkdir()  # the critic's save of 8, cut
    ppo = _spec("openrlhf", algorithm="ppo", critic_lr=9e-6)
    ln = launch(ppo, ["o"], tmp_path / "a2", tmp_path)
    assert ln.resume_step == 4 and "--ckpt.load_enable" in ln.argv
    assert (root / "_actor" / "latest").read_text() == "global_step4"
    assert (root / "_critic" / "latest").read_text() == "global_step4"
    # no step both saved: a fresh start, not an actor at 8 with a new critic
    (root / "_critic").rename(tmp_path / "gone")
    fresh = launch(ppo, ["o"], tmp_path / "a3", tmp_path)
    assert fresh.resume_step == -1 and "--ckpt.load_enable" not in fresh.argv


# ---------------------------------------------------------------- 3. one pass over the train set
def test_an_openrlhf_train_set_smaller_than_the_budget_is_refused_with_the_budget_that_fits(
        tmp_path, capsys, monkeypatch):
    """OpenRLHF makes one pass over its train set and stops when the loader is exhausted
    (ppo_trainer.py 516-569); more episodes would stretch its LR schedule past the budget
    (`prepare_datasets` 71-78). A set smaller than a trial's steps x P is refused."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.jsonl").write_text('{"input": "x"}\n' * 500)
    config = _config(tmp_path, "openrlhf", ["--data.prompt_dataset", "train.jsonl"])
    line = _one_line_refusal(tmp_path, config, capsys)
    assert line == (
        "error: command.argv: --data.prompt_dataset train.jsonl: 500 prompts, fewer than the "
        "512 the trial with P = 16 needs for budget.max_samples 4,096 (OpenRLHF makes one "
        "pass over its train set, then stops): set budget.max_samples to at most 3,840, or "
        "give a larger train set")
    (tmp_path / "train.jsonl").write_text('{"input": "x"}\n' * 512)  # covers every trial
    code, _, err = run_cli(["config", "check", config], capsys)
    assert code == 0, err


# ---------------------------------------------------------------- 9. the thread share
def test_the_thread_share_reaches_only_commands_that_do_not_set_their_own(monkeypatch):
    """Ray sets each actor's OMP_NUM_THREADS to its CPUs and torchrun to 1 per rank, unless
    it is inherited (Ray 2.60 _private/utils.py 235-272; torch distributed/run.py 872-884):
    verl, OpenRLHF and prime-rl get none (an inherited one is removed), TRL's ranks share
    it, `rlbatch train` has it whole."""
    from rlbatch.interop.launch import trial_threads

    for framework in ("verl", "openrlhf", "prime-rl"):
        assert trial_threads(_spec(framework), "8") == {"OMP_NUM_THREADS": None}
    assert trial_threads(_spec("trl", num_processes=4), "8") == {"OMP_NUM_THREADS": "2"}
    assert trial_threads(_spec("trl", num_processes=16), "8") == {"OMP_NUM_THREADS": "1"}
    assert trial_threads(_spec("trl"), "8") == {"OMP_NUM_THREADS": "8"}
    assert trial_threads(_spec("rlbatch"), "3") == {"OMP_NUM_THREADS": "3"}
    assert trial_threads(_spec("verl"), None) == {}  # not a profile's trial: left as it is


def test_the_share_is_of_the_threads_the_profile_may_use_not_of_the_machine(monkeypatch):
    """A profile's trials split `RLBATCH_THREADS` where its environment sets it, otherwise
    the CPUs its affinity allows (taskset, a cpuset), not `os.cpu_count()`: two profiles
    side by side, each pinned to its cores, no longer spin two threads a core each."""
    from rlbatch.profile.executors import trial_env

    monkeypatch.delenv("RLBATCH_THREADS", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2})
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    assert trial_env(1)["RLBATCH_THREADS"] == "3"
    assert trial_env(2)["RLBATCH_THREADS"] == "1"
    monkeypatch.setenv("RLBATCH_THREADS", "8")
    assert trial_env(2)["RLBATCH_THREADS"] == "4"
    assert trial_env(16)["RLBATCH_THREADS"] == "1"


# ---------------------------------------------------------------- 11. smaller ones
def test_openrlhf_saves_its_final_model_in_the_trials_own_folder(tmp_path):
    """OpenRLHF saves the final model to --ckpt.output_dir, by default ./ckpt
    (cli/train_ppo_ray.py 191, 371): relative, and shared by every trial."""
    ln = launch(_spec("openrlhf"), ["o"], tmp_path / "a1", tmp_path)
    out = ln.argv[ln.argv.index("--ckpt.output_dir") + 1]
    assert out == str(tmp_path / "openrlhf-model") and Path(out).is_absolute()


def test_an_openrlhf_eval_set_that_cannot_be_counted_is_warned_about_in_one_line(
        tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = _config(tmp_path, "openrlhf", ["--eval.dataset", "org/math-eval"])
    code, _, err = run_cli(["config", "check", config], capsys)
    warned = [w for w in err.strip().splitlines() if w.startswith("warning:")]
    assert code == 0 and warned == [(
        "warning: command.argv: --eval.dataset org/math-eval is not a local .jsonl or .json, "
        "so rlbatch cannot count it: OpenRLHF keeps only its first 512 prompts in the trial "
        "with P = 16 (--data.max_samples); use a local .jsonl of at most 512 prompts to have "
        "it checked")], err


PRIME_TOML = """
[orchestrator.eval]
num_examples = 16
{skip}
[[orchestrator.eval.source]]
name = "reverse-text"
{interval}
{inference}
"""


def _prime(tmp_path: Path, skip: str = "", interval: str = "", inference: str = "[inference]"):
    (tmp_path / "rl.toml").write_text(PRIME_TOML.format(skip=skip, interval=interval,
                                                        inference=inference))


def test_prime_rl_skip_first_step_with_a_relative_target_is_refused(tmp_path, capsys,
                                                                     monkeypatch):
    """`skip_first_step` turns off the base-model evaluation (orchestrator/eval_source.py
    50) that target.gain is measured from."""
    monkeypatch.chdir(tmp_path)
    gain = {"metric": "eval/reward", "value": None, "gain": 0.05}
    _prime(tmp_path, skip="skip_first_step = true")
    config = _config(tmp_path, "prime-rl", ["@", "rl.toml"], target=gain,
                     eval={"every_samples": 512, "at_start": True})
    assert _one_line_refusal(tmp_path, config, capsys) == (
        "error: command.argv: orchestrator.eval.skip_first_step is true, so prime-rl never "
        "evaluates the base model that target.gain is measured from; remove it (or set "
        "target.value to an absolute score and target.gain: null)")
    _prime(tmp_path)  # the flag on the command line, the same
    config = _config(tmp_path, "prime-rl", ["@", "rl.toml",
                                            "--orchestrator.eval.skip-first-step"],
                     target=gain, eval={"every_samples": 512, "at_start": True})
    assert "skip_first_step is true" in _one_line_refusal(tmp_path, config, capsys)
    config = _config(tmp_path, "prime-rl", ["@", "rl.toml"], target=gain,
                     eval={"every_samples": 512, "at_start": True})
    code, _, err = run_cli(["config", "check", config], capsys)
    assert code == 0, err


def test_prime_rl_a_sources_own_eval_interval_is_refused(tmp_path, capsys, monkeypatch):
    """A source's `interval` replaces the group's (configs/orchestrator.py 259, 323-338):
    the cadence rlbatch sets would not reach it."""
    monkeypatch.chdir(tmp_path)
    _prime(tmp_path, interval="interval = 5")
    config = _config(tmp_path, "prime-rl", ["@", "rl.toml"])
    assert _one_line_refusal(tmp_path, config, capsys) == (
        "error: command.argv: [[orchestrator.eval.source]] 'reverse-text' sets interval = 5, "
        "which replaces the evaluation cadence rlbatch sets from eval.every_samples "
        "(--orchestrator.eval.interval); remove the source's interval")


def test_prime_rl_vllm_words_only_for_a_run_that_starts_its_own_inference(tmp_path):
    """`RLConfig.inference` None: `rl` starts no inference server (configs/rl.py 234-235);
    an `--inference.vllm...` word would create one for a user who runs it apart."""
    _prime(tmp_path, inference="")
    apart = launch(_spec("prime-rl", workdir=str(tmp_path)), ["rl", "@", "rl.toml"],
                   tmp_path / "a", tmp_path / "s")
    assert not [w for w in apart.argv if w.startswith("--inference")]
    _prime(tmp_path)
    own = launch(_spec("prime-rl", workdir=str(tmp_path)), ["rl", "@", "rl.toml"],
                 tmp_path / "b", tmp_path / "s")
    assert own.argv[own.argv.index("--inference.vllm.seed") + 1] == "7"
    assert own.argv[own.argv.index("--inference.vllm.max-num-seqs") + 1] == "64"


def test_verl_keeps_the_users_loggers_and_adds_its_file_logger(tmp_path):
    def logger(base):
        ln = launch(_spec("verl"), base, tmp_path / "a", tmp_path)
        return [w for w in ln.argv[len(base):] if w.startswith("trainer.logger=")]

    # verl's default (trainer/config/ppo_trainer.yaml 152) has W&B
    assert logger(["python3", "-m", "verl.trainer.main_ppo"]) == \
        ["trainer.logger=[console,wandb,file]"]
    assert logger(["v", "trainer.logger=['console','tensorboard']"]) == \
        ["trainer.logger=[console,tensorboard,file]"]
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "mine.yaml").write_text("trainer:\n  logger: [console]\n")
    assert logger(["v", "--config-path", str(tmp_path / "conf"), "--config-name", "mine"]) \
        == ["trainer.logger=[console,file]"]


def test_executor_ray_is_refused_for_frameworks_that_drive_ray(tmp_path, capsys):
    for framework in ("verl", "openrlhf"):
        config = _config(tmp_path, framework, [])
        code, _, err = run_cli(["profile", config, "--out", tmp_path / "p", "--executor",
                                "ray"], capsys)
        assert code == 2 and err.strip().splitlines() == [(
            f"error: --executor ray: {framework}'s driver starts Ray and its GPU actors "
            "itself, which a trial run as a Ray task cannot hold; use --executor ray-job "
            "--address http://HEAD:8265 (each trial a Ray job)")], err
        assert not (tmp_path / "p").exists()


# ---------------------------------------------------------------- 12. words
def test_nothing_compared_has_an_evidence_word_of_its_own():
    """The only candidate failed: the text said "nothing was compared" while the JSON said
    `none_faster` ("shown not faster")."""
    from rlbatch.analysis import selection
    from test_analysis_stats import REF, _entry

    alone = selection.recommend([REF], "ref")
    assert alone["evidence"] == "nothing_compared" and alone["candidates_analysed"] == 0
    slower = selection.recommend([REF, _entry("w", "slower", 2.0, [0.1, 0.3])], "ref")
    assert slower["evidence"] == "none_faster"  # compared, and not faster
    assert "`nothing_compared`" in (REPO / "docs" / "analysis.md").read_text()


def test_the_docs_cite_prime_rls_bound_and_verls_v1_trainer():
    """prime-rl's `max_async_level` is gone (its bound is `orchestrator.max_off_policy_steps`,
    configs/orchestrator.py 532 at 559b447); verl's timers are V1's
    (verl/trainer/ppo/v1/trainer_base.py 449, 460-461, 470 at 1dda039); prime-rl's file
    monitor is src/prime_rl/monitors/file.py."""
    for doc in ("docs/design.md", "docs/integrations.md"):  # the findings' table aside
        text = (REPO / doc).read_text().split("## What a second audit found", 1)[0]
        assert "max_async_level" not in text and "max_off_policy_steps" in text, doc
    text = (REPO / "docs" / "integrations.md").read_text()
    assert not re.search(r"ray_trainer\.py`? 1508", text)
    assert "v1/trainer_base.py` 449" in text
    verl_src = (REPO / "src" / "rlbatch" / "interop" / "ingest" / "verl.py").read_text()
    assert "ray_trainer.py 1508" not in verl_src and "v1/trainer_base.py 449" in verl_src
    helper = (REPO / "tests" / "helpers" / "prime_rl_log.py").read_text()
    assert "src/prime_rl/monitors/file.py" in helper and "utils/monitors" not in helper
