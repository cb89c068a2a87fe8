"""The built-in tasks and the tiny default model: determinism, round trip, warm start."""

from __future__ import annotations

import json
from dataclasses import replace
from itertools import pairwise
from pathlib import Path

import pytest
import torch

from rlbatch.rollout.tasks import AdditionTask, ReverseTask, take
from rlbatch.rollout.tiny_model import (
    TinyRecipe,
    build_tiny,
    build_tokenizer,
    greedy_accuracy,
    recipe_for,
)


def test_tasks_are_deterministic_and_correct():
    for cls in (AdditionTask, ReverseTask):
        a, b = cls(digits=4), cls(digits=4)
        assert take(a.train_stream(7), 50) == take(b.train_stream(7), 50)
        assert take(a.train_stream(7), 50) != take(a.train_stream(8), 50)
        assert a.eval_set(100) == b.eval_set(100)
        held = {e.prompt for e in a.eval_set(1024)}
        assert not held & {e.prompt for e in take(a.train_stream(0), 2000)}
    ex = AdditionTask(digits=3).make(__import__("random").Random(0))
    a, b = ex.meta["a"], ex.meta["b"]
    assert ex.prompt == f"{str(a).zfill(3)[::-1]}+{str(b).zfill(3)[::-1]}="
    assert ex.answer == str(a + b).zfill(4)[::-1]
    assert AdditionTask().reward(ex.prompt, ex.answer, ex) == 1.0
    assert AdditionTask().reward(ex.prompt, "0000", ex) == (1.0 if ex.answer == "0000" else 0.0)


def test_tokenizer_round_trip():
    tok = build_tokenizer()
    ids = tok("321+654=")["input_ids"]
    assert ids[0] == tok.bos_token_id and len(ids) == 9
    assert tok.decode(ids, skip_special_tokens=True) == "321+654="
    assert tok.decode(tok("9750", add_special_tokens=False)["input_ids"] + [tok.eos_token_id],
                      skip_special_tokens=True) == "9750"


@pytest.mark.landing_free
@pytest.mark.trained
def test_same_seed_same_weights_and_save_load_round_trip(tmp_path):
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    # a band every model is in: the first check (step 3) is accepted
    recipe = replace(TinyRecipe(), max_sft_steps=6, check_every=3, check_prompts=32,
                     band_low=0.0, min_position_accuracy=0.0)
    facts_a = build_tiny(recipe, tmp_path / "a")
    facts_b = build_tiny(recipe, tmp_path / "b")
    assert 500_000 <= facts_a["parameters"] <= 5_000_000
    ma = AutoModelForCausalLM.from_pretrained(tmp_path / "a", attn_implementation="eager")
    mb = AutoModelForCausalLM.from_pretrained(tmp_path / "b")
    for (na, pa), (nb, pb) in zip(ma.state_dict().items(), mb.state_dict().items()):
        assert na == nb and torch.equal(pa, pb), na
    assert facts_a["accuracy"] == facts_b["accuracy"]
    tok = PreTrainedTokenizerFast.from_pretrained(tmp_path / "a")
    assert type(ma).__name__ == "LlamaForCausalLM"
    ids = torch.tensor([tok("321+654=9750")["input_ids"]])
    # round trip: the in-memory model that was saved gives the same logits after load
    rebuilt = replace(recipe)
    from rlbatch.rollout.tiny_model import build_model, warm_start
    torch.manual_seed(rebuilt.seed)
    m = build_model(rebuilt, len(build_tokenizer()))
    warm_start(m, build_tokenizer(), rebuilt)
    m.eval()
    with torch.no_grad():
        assert torch.equal(m(input_ids=ids).logits, ma.eval()(input_ids=ids).logits)
    meta = json.loads((tmp_path / "a" / "rlbatch_build.json").read_text())
    assert meta["recipe"]["max_sft_steps"] == 6


@pytest.mark.lands
def test_cached_tiny_model_is_in_band(tiny_model_dir):
    """The default checkpoint's measured starting accuracy (1,024 held-out prompts)."""
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    meta = json.loads((tiny_model_dir / "rlbatch_build.json").read_text())
    r = recipe_for("addition", 3)  # the band, narrowed to one end under RLBATCH_TINY_BAND
    assert r.band_low <= meta["accuracy"] <= r.band_high
    assert min(meta["position_accuracy_1024"]) > 0.2  # every digit partly formed (chance 0.1)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tok = PreTrainedTokenizerFast.from_pretrained(tiny_model_dir)
    acc, _ = greedy_accuracy(model, tok, AdditionTask().eval_set(1024))
    assert acc == pytest.approx(meta["accuracy"])


@pytest.mark.lands
@pytest.mark.slow
@pytest.mark.trained
@pytest.mark.parametrize("task", ["addition", "reverse"])
def test_model_build_cli_in_band(task, tmp_path, monkeypatch, capsys):
    from rlbatch.cli.main import main

    monkeypatch.setenv("RLBATCH_CACHE", str(tmp_path))
    try:
        main(["model", "build", "--task", task, "--json"])
    except SystemExit as exc:
        assert exc.code == 0
    doc = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    from rlbatch.core.config import DEFAULT_DIGITS

    r = recipe_for(task, DEFAULT_DIGITS[task])
    assert doc["in_band"] and r.band_low <= doc["accuracy"] <= r.band_high


def test_chat_template_is_applied_when_the_tokenizer_has_one():
    from rlbatch.rollout.models import encode_prompt
    from rlbatch.rollout.tasks import Example

    tok = build_tokenizer()
    plain = encode_prompt(tok, Example("12+34=", "46"))
    assert plain == tok("12+34=")["input_ids"]
    tok.chat_template = ("{% for m in messages %}{{ m['content'] }}={% endfor %}"
                         "{% if add_generation_prompt %}rev:{% endif %}")
    templated = encode_prompt(tok, Example("12+34", "46"))
    assert tok.decode(templated, skip_special_tokens=True) == "12+34=rev:"
    messages = [{"role": "user", "content": "9"}, {"role": "user", "content": "8"}]
    from_messages = encode_prompt(tok, Example("ignored", "1", meta={"messages": messages}))
    assert tok.decode(from_messages, skip_special_tokens=True) == "9=8=rev:"


class _Replay:
    """A recorded accuracy trajectory standing in for SFT: accuracy is interpolated at the
    progress made so far (each step adds the current learning-rate scale), so halving the
    learning rate slows the jump as it would in training."""

    def __init__(self, points):
        self.xs = [p for p, _ in points]
        self.ys = [a for _, a in points]
        self.progress, self.scale, self.restores, self.checks = 0.0, 1.0, [], []

    def step(self):
        self.progress += self.scale

    def check(self, n):
        import numpy as np

        self.checks.append((self.progress, n))
        return float(np.interp(self.progress, self.xs, self.ys)), [0.5, 0.5, 0.5, 0.5]

    def snapshot(self):
        return self.progress

    def restore(self, state):
        self.restores.append(state)
        self.progress = state

    def set_lr_scale(self, scale):
        self.scale = scale


# Seen on a 2-core AMD EPYC machine: 0.088 at SFT step 300, 0.434 at 320, 0.549 at 325.
JUMP = [(0, 0.0), (300, 0.088), (320, 0.434), (325, 0.549), (400, 0.95)]


def test_band_search_recovers_a_jump_that_skips_the_band():
    from rlbatch.rollout.tiny_model import run_band_search

    sim = _Replay(JUMP)
    facts = run_band_search(TinyRecipe(), sim)
    checks = [(h["step"], round(h["accuracy"], 3)) for h in facts["history"]]
    assert (300, 0.088) in checks and (320, 0.434) in checks  # the jump was seen, then undone
    assert sim.restores == [300]  # back to the last check below the band
    assert facts["backtracks"] == 1 and facts["lr_scale"] == 0.5
    assert 0.25 <= facts["accuracy_check"] <= 0.40 and facts["in_band"]
    # after going back, a check after every step: the accepted one is the first in the band
    after = [h for h in facts["history"] if h["step"] > 320]
    assert all(b["step"] - a["step"] == 1 for a, b in pairwise(after))
    assert all(h["accuracy"] < 0.25 for h in after[:-1])


def test_band_search_accepts_a_slow_rise_without_going_back():
    from rlbatch.rollout.tiny_model import run_band_search

    sim = _Replay([(0, 0.0), (1000, 1.0)])
    facts = run_band_search(TinyRecipe(), sim)
    assert sim.restores == [] and facts["backtracks"] == 0
    assert 0.25 <= facts["accuracy_check"] <= 0.40


def test_band_search_fails_loudly_when_the_jump_cannot_be_split():
    from rlbatch.rollout.tiny_model import WarmStartError, run_band_search

    # a step function: any step, however small, goes from below the band to above it
    sim = _Replay([(0, 0.0), (300, 0.1), (300.0001, 0.6), (1000, 0.6)])
    with pytest.raises(WarmStartError) as err:
        run_band_search(TinyRecipe(), sim)
    msg = str(err.value)
    assert "0.25-0.4" in msg and "0.600" in msg and "\n" not in msg
    assert len(sim.restores) == TinyRecipe().max_backtracks


def test_band_search_screens_far_below_the_band_and_decides_near_it_on_every_prompt():
    """Checks far below the band use `screen_prompts`; the first screen at `near_accuracy` is
    repeated at once on all `check_prompts`, and every later check (the ones that can accept,
    go back or set the restore point near the band) uses them all."""
    from rlbatch.rollout.tiny_model import run_band_search

    r = TinyRecipe()
    sim = _Replay(JUMP)
    facts = run_band_search(r, sim)
    first_full = next(i for i, (_, n) in enumerate(sim.checks) if n == r.check_prompts)
    screened, full = sim.checks[:first_full], sim.checks[first_full:]
    assert screened and all(n == r.screen_prompts for _, n in screened)
    assert all(n == r.check_prompts for _, n in full)
    # the screen that reached near_accuracy and its full check are taken at the same step
    assert full[0][0] == screened[-1][0] and np_interp(JUMP, full[0][0]) >= r.near_accuracy
    assert all(np_interp(JUMP, p) < r.near_accuracy for p, _ in screened[:-1])
    # the history records each decision's check (the full one), with its prompt count
    assert [h["prompts"] for h in facts["history"]] == \
        [n for _, n in screened[:-1]] + [n for _, n in full]
    assert facts["accuracy_check"] == pytest.approx(np_interp(JUMP, sim.checks[-1][0]))
    # without screening every check uses all prompts and the decisions are the same
    plain = _Replay(JUMP)
    facts0 = run_band_search(replace(r, screen_prompts=0), plain)
    assert {n for _, n in plain.checks} == {r.check_prompts}
    assert [h["step"] for h in facts0["history"]] == [h["step"] for h in facts["history"]]
    assert facts0["accuracy_check"] == facts["accuracy_check"]


def np_interp(points, x):
    import numpy as np

    return float(np.interp(x, [p for p, _ in points], [a for _, a in points]))


def test_band_search_waits_for_every_answer_position():
    from rlbatch.rollout.tiny_model import BandSearch

    search = BandSearch(TinyRecipe())
    assert search.decide(0.3, [0.9, 0.9, 0.2, 0.9]) == "continue"  # one digit not formed yet
    assert search.decide(0.35, [0.9, 0.9, 0.4, 0.9]) == "accept"


_BUILD_IN_A_CHILD = """
import json, os, sys
from dataclasses import replace
from rlbatch.rollout import tiny_model

real = tiny_model.build_tiny

def counted(*args, **kwargs):
    with open(sys.argv[1], "a") as fh:
        fh.write(f"{os.getpid()}\\n")
    return real(*args, **kwargs)

tiny_model.build_tiny = counted
recipe = replace(tiny_model.recipe_for("runsum", 1), hidden=32, mlp=64, layers=2,
                 max_sft_steps=4, check_every=2, check_prompts=16, sft_examples_per_step=16,
                 band_low=0.0, min_position_accuracy=0.0, report_prompts=16)
print(tiny_model.tiny_model_path(recipe))
"""


@pytest.mark.trained
@pytest.mark.landing_free
def test_two_processes_on_an_empty_cache_build_the_model_once(tmp_path):
    """Two processes that ask for the same uncached model at once: one builds it, the other
    waits for that build and reads it (a short recipe, so the race is cheap to run)."""
    import os
    import subprocess
    import sys

    log = tmp_path / "builds.log"
    env = dict(os.environ, RLBATCH_CACHE=str(tmp_path / "cache"))
    procs = [subprocess.Popen([sys.executable, "-c", _BUILD_IN_A_CHILD, str(log)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    outs = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err[-2000:] for _, err in outs]
    (path,) = {out.strip() for out, _ in outs}
    assert len(log.read_text().splitlines()) == 1  # built once
    assert json.loads((Path(path) / "rlbatch_build.json").read_text())["recipe"]["task"] == \
        "runsum"
