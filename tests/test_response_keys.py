"""The step log's response-length keys (docs/metrics.md): mean, p50, p90 and max, written
by the built-in trainer for every step (real CLI on the tiny default model)."""

from __future__ import annotations

import json

import pytest

from rlbatch.cli.main import main
from rlbatch.core.runlog import read_run

# every trained test here holds wherever a run lands (tests/README.md)
pytestmark = pytest.mark.landing_free


def test_response_length_keys_follow_the_step_responses(tiny_model_dir, tmp_path, capsys):
    # a hot temperature and room for 12 tokens: the addition model's responses vary in length
    sets = ["batch.prompts_per_step=8", "batch.samples_per_prompt=8", "budget.max_samples=256",
            "eval.at_start=false", "eval.every_samples=100000", "eval.prompts=8",
            "target.value=0.99", "rollout.temperature=3.0", "rollout.max_new_tokens=12"]
    try:
        main(["train", "--preset", "grpo-tiny", "--out", str(tmp_path), "--json",
              *[x for s in sets for x in ("--set", s)]])
    except SystemExit as exc:
        assert exc.code == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    run = read_run(summary["run_dir"])
    tokens_before = 0
    varied = False
    for row in run.steps:
        mean, p50, p90, top = (row[f"response/{k}_length"] for k in ("mean", "p50", "p90", "max"))
        assert 1 <= p50 <= p90 <= top <= 12 and mean <= top
        # the mean is the step's generated tokens over its 64 responses
        assert mean * 64 == pytest.approx(row["tokens"] - tokens_before)
        tokens_before = row["tokens"]
        varied |= top > p50
    assert varied  # lengths did vary, so the quantiles were tested on a spread
