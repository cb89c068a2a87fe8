"""Command trials of each framework driven through `rlbatch profile` on stand-ins that live the
framework's lifecycle from process start (tests/helpers/prime_rl_trainer.py,
openrlhf_trainer.py, log_writer.py; TRL's own `trl grpo`): the log file exists, empty, for
several polls before the first step's line, and the trial still follows it to its target.
And a prime-rl profile of B and 4B whose orchestrator runs 2 steps ahead of its trainer, with
the same learning per sample and the same cost per sample: its time ratio is 1.

The stand-ins train nothing: their learning is a known curve in samples and their time a
known cost per sample, so every assertion is a contract (a status, a ratio fixed by
construction), not a learning outcome.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
import yaml

from helpers.profile_run import profile_json, started_trials
from rlbatch.core.runlog import read_json

HELPERS = Path(__file__).resolve().parent / "helpers"
RLBATCH = [sys.executable, "-m", "rlbatch.cli.main"]
POLL_S = 0.2
STARTUP_S = 1.2  # six polls and more with an empty log


def _config(tmp_path: Path, framework: str, argv: list[str], env: dict, metric: str,
            value: float, prompts: int = 8, **over) -> Path:
    """A profile of the baseline (P = 4, G = 8, B = 32) and one candidate P, run by the
    stand-in command in `tmp_path`, stopping each trial at its target."""
    cfg = {"extends": "grpo-tiny", "name": f"life-{framework}", "backend": "command",
           "command": {"framework": framework, "poll_s": POLL_S, "stop_grace_s": 5,
                       "argv": argv, "env": env, "workdir": str(tmp_path)},
           "batch": {"prompts_per_step": 4, "samples_per_prompt": 8},
           "optimizer": {"reference_sequences": 32, "reference_lr": 1e-4},
           "target": {"metric": metric, "value": value, "gain": None},
           "budget": {"max_samples": 2048}, "eval": {"every_samples": 128},
           "checkpoint": {"every_samples": 256},
           "profile": {"prompts_per_step": [prompts], "seeds": 1, "confirm_seeds": 0,
                       "fixed_lr_control": False, "concurrency": [], "min_evaluations": 3}}
    for key, v in over.items():
        cfg[key] = {**cfg[key], **v}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _profile(config: Path, out: Path) -> dict:
    return profile_json(config, out, timeout=300)


_trials = started_trials


def printed_gap(what: str):
    """Seconds between the stand-in opening its log and writing its first step there, from
    the lines it prints (`opened <log> at <time>`, `<what> at <time>`)."""
    def gap(attempt: Path) -> float:
        output = (attempt / "output.log").read_text()
        opened = float(re.search(r"opened .* at ([0-9.]+)", output).group(1))
        return float(re.search(rf"{what} at ([0-9.]+)", output).group(1)) - opened
    return gap


def tensorboard_gap(attempt: Path) -> float:
    """Seconds between a TensorBoard writer opening its event file (the file_version event
    it writes then) and its first scalar, from the attempt's event file itself."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    (file,) = (attempt / "tensorboard").rglob("events.out.tfevents.*")
    events = list(EventFileLoader(str(file)).Load())
    scalar = next(e for e in events if any(
        v.metadata.plugin_data.plugin_name == "scalars" for v in e.summary.value))
    return scalar.wall_time - events[0].wall_time


def _reached_after_an_empty_log(out: Path, gap, poll_s: float = POLL_S) -> None:
    """Every trial reached its target, in one attempt whose log stayed without a step for
    several polls after it was opened (`gap`: those seconds, read for an attempt)."""
    trials = _trials(out)
    assert len(trials) == 2
    for name, run in trials.items():
        summary = read_json(run / "summary.json")
        assert summary["status"] == "target_reached", (name, summary.get("failure"))
        (attempt,) = (run / "command" / "attempts").iterdir()
        assert gap(attempt) >= 5 * poll_s, (name, gap(attempt))


# ---------------------------------------------------------------- prime-rl
PRIME = [sys.executable, str(HELPERS / "prime_rl_trainer.py")]
PRIME_ACC = "eval/gsm8k/all/agent/avg@1"


def test_a_prime_rl_trial_follows_its_log_from_set_up_to_its_target(tmp_path):
    """prime-rl's FileMonitor opens metrics.jsonl at set-up; the base model's evaluation
    line comes first, before any step: the trial waits through the empty file and the
    evaluation-only file, then follows the steps (orchestrator 2 ahead) to its target."""
    env = {"PRIME_STANDIN_STARTUP_S": str(STARTUP_S), "PRIME_STANDIN_BASE_EVAL_FIRST": "1.2",
           "PRIME_STANDIN_SAMPLE_S": "0.0005"}
    config = _config(tmp_path, "prime-rl", PRIME, env, PRIME_ACC, 0.45)
    doc = _profile(config, tmp_path / "p")
    assert not doc["failed_trials"]
    _reached_after_an_empty_log(tmp_path / "p", printed_gap("first step line"))


@pytest.mark.parametrize("order", ["in step order", "evaluations out of step order"])
def test_prime_rl_b_and_4b_with_the_same_cost_per_sample_read_a_time_ratio_of_one(tmp_path,
                                                                                order):
    """B = 32 and 4B = 128, the same accuracy per sample trained (linear, so N* is exact
    between any two evaluations) and the same seconds per sample (a trainer step 4x as long
    at 4B): the time to the same samples is the same, but for the first batch's
    generation, a tenth of a step (under 1% here). Read from the orchestrator's lines,
    logged about 1.5 trainer steps before the policy they ship for exists, the 4B
    candidate reads about 20% faster. With evaluations finishing out of step order (each
    second one logged before the one triggered before it: the ordering rule's evaluation-only
    record for an earlier step), the ratio is the same."""
    env = {"PRIME_STANDIN_STARTUP_S": "0.5", "PRIME_STANDIN_SAMPLE_S": "0.0036",
           **({"PRIME_STANDIN_EVAL_SWAP": "1"} if order != "in step order" else {})}
    config = _config(tmp_path, "prime-rl", PRIME, env, PRIME_ACC, 0.45, prompts=16,
                     checkpoint={"every_samples": 512},
                     # a candidate as fast as the baseline is not stopped as one that cannot win
                     profile={"early_stop": False})
    out = tmp_path / "p"
    doc = _profile(config, out)
    assert not doc["failed_trials"]
    analysis = read_json(out / "profile.json")["analysis"]
    (cand,) = [c for c in analysis["configs"] if c["sequences_per_step"] == 128]
    ratio = cand["vs_reference"]["time_ratio"]
    assert ratio == pytest.approx(1.0, abs=0.02), ratio


# ---------------------------------------------------------------- OpenRLHF
def _eval_set(tmp_path: Path) -> Path:
    path = tmp_path / "eval.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"{i} + 1", "label": str(i + 1)}) + "\n"
                            for i in range(8)))
    return path


def test_an_openrlhf_trial_follows_its_tensorboard_log_from_set_up_to_its_target(tmp_path):
    """OpenRLHF opens its TensorBoard writer when the trainer actor is made, before the
    models load: the event file holds no scalar for several polls; the trial follows it
    (`timing/step_total`, a save `_actor` first and `latest` last, an evaluation after
    the save) to its target."""
    argv = [sys.executable, str(HELPERS / "openrlhf_trainer.py"),
            "--eval.dataset", str(_eval_set(tmp_path))]
    env = {"OPENRLHF_STANDIN_STARTUP_S": str(STARTUP_S), "OPENRLHF_STANDIN_SAMPLE_S": "0.0005"}
    config = _config(tmp_path, "openrlhf", argv, env, "eval/eval_math_pass1", 0.35)
    doc = _profile(config, tmp_path / "p")
    assert not doc["failed_trials"]
    _reached_after_an_empty_log(tmp_path / "p", tensorboard_gap)


# ---------------------------------------------------------------- verl
def test_a_verl_trial_follows_its_file_logger_from_set_up_to_its_target(tmp_path):
    """verl opens its file logger when `fit` creates `Tracking`, before the first step;
    the V1 order at a validation step: save, validate, then log the step. The lines are
    written by verl's own `FileLogger` (LOG_WRITER_VERL_LOGGER)."""
    argv = [sys.executable, str(HELPERS / "log_writer.py")]
    env = {"LOG_WRITER_STARTUP_S": str(STARTUP_S), "LOG_WRITER_STEP_S": "0.02",
           "LOG_WRITER_VALIDATE_S": "0.05", "LOG_WRITER_VERL_LOGGER": "1"}
    config = _config(tmp_path, "verl", argv, env, "eval/x/reward/mean@1", 0.5)
    doc = _profile(config, tmp_path / "p")
    assert not doc["failed_trials"]
    _reached_after_an_empty_log(tmp_path / "p", printed_gap("first step line"))


# ---------------------------------------------------------------- TRL
# Slow (`make test-slow`): `trl grpo` itself on the tiny model, two trials of TRL training
# with about 10 s of imports each, past a minute. The fast tests of the same contract: the
# three above (a log that exists with no step for several polls, followed to the target:
# `tensorboard_gap` reads OpenRLHF's event file as it reads TRL's), test_command::
# test_trl_flags_count_optimizer_steps_and_resume_from_the_newest_checkpoint (TRL's flags),
# test_ingest (TRL's logs).
@pytest.mark.slow
@pytest.mark.lands  # the target is a gain that GRPO on the tiny model reaches (as
def test_a_trl_trial_follows_its_tensorboard_log_from_train_begin_to_its_target(  # in
        tiny_model_dir, tmp_path):  # test_command_trl: 0.03 within 300-700 samples)
    """transformers opens TRL's TensorBoard writer in `on_train_begin` (TensorBoardCallback,
    transformers 5.x integrations/integration_utils.py) and writes text there; the first
    scalar comes with the evaluation at start (`eval_on_start`): the event file holds no
    scalar for several polls, and the trial follows it to its target."""
    pytest.importorskip("trl")
    from rlbatch.rollout.export import export_task

    data = tmp_path / "data"
    export_task("addition", None, data, train=4096, test=128)
    argv = [str(Path(sys.executable).parent / "trl"), "grpo", "--model_name_or_path",
            str(tiny_model_dir), "--dataset_name", str(data), "--reward_funcs",
            "trl_addition.exact_or_crash", "--max_completion_length", "5", "--temperature",
            "0.7", "--per_device_eval_batch_size", "128", "--use_cpu", "true",
            "--disable_tqdm", "true"]
    # TRL's own start: about 0.8 s from the writer to the first scalar here, so polls of
    # 0.05 s see the scalar-less file at least five times
    config = _config(tmp_path, "trl", argv, {"PYTHONPATH": str(HELPERS)}, "eval/reward", None,
                     target={"gain": 0.03}, budget={"max_samples": 4096},
                     command={"poll_s": 0.05},
                     # every trial runs to its target: what is checked is the follow, not
                     # whether the candidate could still win (where runs land differs by CPU)
                     profile={"early_stop": False})
    doc = _profile(config, tmp_path / "p")
    assert not doc["failed_trials"]
    _reached_after_an_empty_log(tmp_path / "p", tensorboard_gap, poll_s=0.05)
