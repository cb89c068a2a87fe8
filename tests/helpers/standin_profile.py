"""The profile config the fault tests run on the verl-style stand-in (tests/helpers/
log_writer.py): the baseline at P = 4, G = 8 (B = 32) and one candidate P = 8 (B = 64), one
seed each, the reward rising with samples to the target 0.5 at 512 samples, so the clean T
ratio is exactly 0.5 whatever the step time."""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

HELPERS = Path(__file__).resolve().parent


def standin_profile(tmp_path: Path, name: str, env: dict) -> Path:
    """Write `tmp_path/c.yaml`: the profile above, its command the stand-in with `env`
    (values made strings)."""
    cfg = {"extends": "grpo-tiny", "name": name, "backend": "command",
           "command": {"framework": "verl", "poll_s": 0.2, "stop_grace_s": 5,
                       "argv": [sys.executable, str(HELPERS / "log_writer.py")],
                       "env": {k: str(v) for k, v in env.items()}},
           "batch": {"prompts_per_step": 4, "samples_per_prompt": 8},
           "optimizer": {"reference_sequences": 32, "reference_lr": 1e-4},
           "target": {"metric": "eval/x/reward/mean@1", "value": 0.5, "gain": None},
           "budget": {"max_samples": 1024}, "eval": {"every_samples": 64},
           "checkpoint": {"every_samples": 128},
           "profile": {"prompts_per_step": [8], "seeds": 1, "confirm_seeds": 0,
                       "fixed_lr_control": False, "concurrency": [], "min_evaluations": 3}}
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(cfg))
    return config
