"""Config resolution, LR rules, error messages (issue: foundation)."""

from __future__ import annotations

import json
import math
import re
import string

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from helpers.cli import run_cli
from rlbatch.core.config import Config, scaled_adam, scaled_lr
from rlbatch.core.errors import ConfigError
from rlbatch.core.loading import load_config, preset_names


# ---- LR rules ----
@pytest.mark.parametrize("rule,expected", [
    ("sqrt", [1.4142135623730951e-6, 2e-6, 2.8284271247461903e-6]),
    ("linear", [2e-6, 4e-6, 8e-6]),
    ("none", [1e-6, 1e-6, 1e-6]),
])
def test_lr_scale_cli_json(rule, expected, capsys):
    code, out, _ = run_cli(["lr-scale", "--reference-sequences", "1024", "--reference-lr", "1e-6",
                            "--sequences", "2048,4096,8192", "--rule", rule, "--json"], capsys)
    assert code == 0
    doc = json.loads(out.strip().splitlines()[-1])
    assert doc["rule"] == rule
    assert [r["sequences"] for r in doc["rows"]] == [2048, 4096, 8192]
    for row, want in zip(doc["rows"], expected):
        assert row["lr"] == pytest.approx(want, rel=1e-12)
    if rule == "sqrt":  # the figures quoted in the issue
        assert f"{doc['rows'][0]['lr']:.4g}" == "1.414e-06"
        assert f"{doc['rows'][2]['lr']:.4g}" == "2.828e-06"


def test_lr_scale_table_and_bad_rule(capsys):
    code, out, _ = run_cli(["lr-scale", "--reference-sequences", "128", "--reference-lr", "1e-4",
                            "--sequences", "512"], capsys)
    assert code == 0 and "0.0002" in out
    code, _, err = run_cli(["lr-scale", "--reference-sequences", "128", "--reference-lr", "1e-4",
                            "--sequences", "512", "--rule", "cubic"], capsys)
    assert code == 2 and "--rule" in err and len(err.strip().splitlines()) == 1


def test_scaled_adam_malladi():
    out = scaled_adam(0.9, 0.999, 1e-8, 4.0)
    assert out["betas"] == (pytest.approx(0.6), pytest.approx(0.996))
    assert out["eps"] == pytest.approx(5e-9)
    assert scaled_lr(1e-4, 128, 512, "sqrt") == pytest.approx(2e-4)


# ---- resolution ----
def test_presets_resolve_with_derived_values():
    for name in preset_names():
        cfg = load_config(preset=name)
        assert isinstance(cfg, Config)
    cfg = load_config(preset="grpo-tiny", overrides=["batch.prompts_per_step=64"])
    assert cfg.sequences_per_step == 512
    assert cfg.actor_lr == pytest.approx(1e-4 * 2)  # sqrt(512/128)
    d = cfg.resolved_dict()["derived"]
    assert d["sequences_per_step"] == 512 and d["actor_lr"] == pytest.approx(2e-4)
    with pytest.raises(ValidationError, match="frozen"):
        cfg.batch.prompts_per_step = 3  # frozen


def test_extends_file_and_override_order(tmp_path):
    base = tmp_path / "base.yaml"
    base.write_text("extends: grpo-tiny\nbatch:\n  prompts_per_step: 32\nseed: 3\n")
    child = tmp_path / "child.yaml"
    child.write_text("extends: base.yaml\nseed: 4\n")
    cfg = load_config(child, overrides=["optimizer.lr=0.001"])
    assert cfg.batch.prompts_per_step == 32 and cfg.seed == 4 and cfg.actor_lr == 0.001
    assert cfg.batch.samples_per_prompt == 8  # from the preset


def test_logged_config_round_trips(tmp_path):
    cfg = load_config(preset="ppo-tiny", overrides=["batch.prompts_per_step=32"])
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cfg.resolved_dict()))
    again = load_config(path)
    assert again == cfg


@pytest.mark.parametrize("override,needle", [
    ("batch.samples_per_prompt=1", "batch.samples_per_prompt must be >= 2"),
    ("batch.minibatches_per_step=3", "batch.minibatches_per_step (3) must divide"),
    ("batch.micro_batch_sequences=5", "batch.micro_batch_sequences (5) must divide"),
    ("target.value=1.5", "outside the range"),
    ("batch.prompt_per_step=2", "did you mean 'prompts_per_step'"),
])
def test_validation_messages(override, needle):
    with pytest.raises(ConfigError) as exc:
        load_config(preset="grpo-tiny", overrides=[override])
    msg = str(exc.value)
    assert needle in msg and "\n" not in msg
    assert msg.startswith("--set ")


# ---- hypothesis: bad configs -> exit 2, one line naming the field or file:line ----
INT_FIELDS = [("batch", "prompts_per_step"), ("batch", "samples_per_prompt"),
              ("eval", "every_samples"), ("rollout", "generation_concurrency"),
              ("budget", "max_samples"), ("rollout", "max_new_tokens")]
FLOAT_FIELDS = [("optimizer", "reference_lr"), ("rollout", "temperature"),
                ("loss", "clip_ratio_low")]
KEYS = st.text(alphabet=string.ascii_lowercase + "_", min_size=3, max_size=12)


@st.composite
def bad_config(draw):
    kind = draw(st.sampled_from(["type", "range", "unknown", "unknown_nested"]))
    if kind == "type":
        sec, key = draw(st.sampled_from(INT_FIELDS + FLOAT_FIELDS))
        value = draw(st.one_of(st.text(alphabet=string.ascii_letters, min_size=1, max_size=8),
                               st.lists(st.integers(), min_size=1, max_size=3)))
        return {sec: {key: value}}, f"{sec}.{key}"
    if kind == "range":
        sec, key = draw(st.sampled_from(INT_FIELDS))
        return {sec: {key: draw(st.integers(max_value=0))}}, f"{sec}.{key}"
    valid_top = set(Config.model_fields)
    key = draw(KEYS.filter(lambda k: k not in valid_top and k != "extends"))
    if kind == "unknown":
        return {key: 1}, key
    sec = draw(st.sampled_from(["batch", "optimizer", "rollout", "eval"]))
    sub = Config.model_fields[sec].annotation.model_fields
    key = draw(KEYS.filter(lambda k: k not in sub))
    return {sec: {key: 1}}, f"{sec}.{key}"


def _assert_one_line_error(code, err, needle):
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    assert needle in lines[0], (needle, lines[0])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=bad_config())
def test_bad_configs_exit_2_one_line(case, tmp_path, capsys):
    data, field = case
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({"extends": "grpo-tiny", **data}))
    code, _, err = run_cli(["config", "check", str(path)], capsys)
    _assert_one_line_error(code, err, field)
    assert re.search(r"bad\.yaml:\d+:", err), err  # file and line


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(junk=st.sampled_from(["[", "{", "key: [1, 2", "a: b: c", "- x\n y: :", "\t- tab"]),
       line=st.integers(min_value=0, max_value=4))
def test_yaml_syntax_errors(junk, line, tmp_path, capsys):
    path = tmp_path / "broken.yaml"
    path.write_text("seed: 1\n" * line + junk + "\n")
    code, _, err = run_cli(["config", "check", str(path)], capsys)
    _assert_one_line_error(code, err, "broken.yaml")


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.text(alphabet=string.ascii_lowercase, min_size=1, max_size=10))
def test_missing_files(name, tmp_path, capsys):
    path = tmp_path / "nowhere" / f"{name}.yaml"
    code, _, err = run_cli(["config", "check", str(path)], capsys)
    _assert_one_line_error(code, err, str(path))


def test_config_show_json(capsys):
    code, out, _ = run_cli(["config", "show", "--preset", "grpo-tiny", "--set",
                            "batch.prompts_per_step=32", "--json"], capsys)
    assert code == 0
    doc = json.loads(out.strip().splitlines()[-1])
    assert doc["derived"]["sequences_per_step"] == 256
    assert math.isclose(doc["derived"]["actor_lr"], 1e-4 * math.sqrt(2))


def test_noise_scale_without_two_micro_batches_is_refused_with_the_size_to_set():
    from rlbatch.core.errors import ConfigError
    from rlbatch.core.loading import load_config

    with pytest.raises(ConfigError) as err:
        load_config(preset="grpo-tiny", overrides=["noise_scale.enabled=true"])
    msg = str(err.value)
    assert "noise_scale" in msg and "batch.micro_batch_sequences <= 64" in msg
    ok = load_config(preset="grpo-tiny", overrides=["noise_scale.enabled=true",
                                                     "batch.micro_batch_sequences=64"])
    assert ok.micro_batch_sequences == 64


def test_noise_scale_needs_two_micro_batches_in_the_critic_minibatch_as_well():
    from rlbatch.core.errors import ConfigError
    from rlbatch.core.loading import load_config

    # B = 128: the actor's minibatch holds 2 micro-batches of 64, the critic's (4 minibatches
    # of 32 sequences) holds less than one, so critic/noise_scale could not be measured
    sets = ["noise_scale.enabled=true", "batch.micro_batch_sequences=64",
            "critic.minibatches_per_step=4"]
    with pytest.raises(ConfigError) as err:
        load_config(preset="ppo-tiny", overrides=sets)
    assert "critic minibatch" in str(err.value)
    assert "batch.micro_batch_sequences <= 16" in str(err.value)
    ok = load_config(preset="ppo-tiny", overrides=[*sets[:1], "batch.micro_batch_sequences=16",
                                                   "critic.minibatches_per_step=4"])
    assert ok.micro_batch_sequences == 16


def test_config_check_lists_every_error_and_other_commands_give_one_line(tmp_path, capsys):
    path = tmp_path / "two.yaml"
    path.write_text("extends: grpo-tiny\nbatch:\n  prompts_per_step: -3\n"
                    "  samples_per_prompt: abc\n")
    code, _, err = run_cli(["config", "check", str(path)], capsys)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 2, err
    assert "two.yaml:3: batch.prompts_per_step" in lines[0]
    assert "two.yaml:4: batch.samples_per_prompt" in lines[1]
    code, _, err = run_cli(["config", "show", str(path)], capsys)
    _assert_one_line_error(code, err, "two.yaml:3: batch.prompts_per_step")
    assert "(+1 more; `rlbatch config check` lists them)" in err


def test_config_presets_says_what_each_is_for(capsys):
    from rlbatch.core.loading import preset_names, preset_summary

    for name in preset_names():
        summary = preset_summary(name)
        assert 10 < len(summary) <= 100 and "#" not in summary, (name, summary)
    code, out, _ = run_cli(["config", "presets"], capsys)
    assert code in (0, None)
    rows = out.strip().splitlines()
    assert [r.split()[0] for r in rows] == preset_names()
    assert any("tiny model" in r for r in rows if r.startswith("grpo-tiny"))
