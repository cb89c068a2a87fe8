"""The GPU check (issue #18) and what it stands on: the random throughput model, dtype
plumbing (bf16 weights and KV cache, fp32 log-probs) and the GPU check's dry run on CPU, so
the script cannot rot between GPU loans. Tests marked `gpu` repeat the engine, decode-bench
and trainer checks on CUDA; `pytest -m gpu` (stage a of `bash bench/gpu_check.sh`) runs them.
"""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers.cli import run_cli, set_flags
from rlbatch.rollout.random_model import SIZES, RandomLayout, random_model_path

REPO = Path(__file__).resolve().parents[1]
CUDA = torch.cuda.is_available()
GPU = [pytest.mark.gpu, pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")]
DEVICES = ["cpu", pytest.param("cuda", marks=GPU)]


@pytest.fixture(scope="session")
def random_tiny_dir() -> Path:
    return random_model_path("tiny", SIZES["tiny"])[0]


@pytest.fixture
def one_thread():
    """One intra-op thread on the CPU (a shared 2-core machine thrashes with two), restored."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


# ---- the random model ----
def test_random_builder_layout_parameters_offline(tmp_path, monkeypatch, capsys):
    def no_network(*args, **kwargs):
        raise AssertionError("the random model builder must not touch the network")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    code, out, err = run_cli(["model", "build", "--random", "--size", "tiny", "--out",
                              tmp_path / "tiny", "--json"], capsys)
    assert code == 0, err
    facts = json.loads(out.strip().splitlines()[-1])
    cfg = json.loads((tmp_path / "tiny" / "config.json").read_text())
    # the built-in tiny model's layout (tiny_model.TinyRecipe), random weights
    assert (cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_attention_heads"],
            cfg["num_key_value_heads"], cfg["intermediate_size"], cfg["vocab_size"],
            cfg["tie_word_embeddings"]) == (128, 3, 4, 4, 512, 20, True)
    from rlbatch.rollout.models import load_model_and_tokenizer

    model, tok = load_model_and_tokenizer(tmp_path / "tiny")
    n = sum(p.numel() for p in model.parameters())
    assert n == facts["parameters"] == SIZES["tiny"].parameters() == 789_888
    assert len(tok) == 20 and tok.decode(tok("w5 w7")["input_ids"], skip_special_tokens=True) \
        == "w5 w7"
    # a GQA, untied layout given by its dimensions, saved in bf16 and loaded in either dtype
    code, out, err = run_cli(["model", "build", "--random", "--layout",
                              "hidden=64,layers=2,heads=8,kv_heads=2,mlp=96,vocab=50",
                              "--dtype", "bfloat16", "--out", tmp_path / "gqa", "--json"], capsys)
    assert code == 0, err
    facts = json.loads(out.strip().splitlines()[-1])
    layout = RandomLayout(hidden=64, layers=2, heads=8, kv_heads=2, mlp=96, vocab=50)
    bf16, _ = load_model_and_tokenizer(tmp_path / "gqa", dtype="bfloat16")
    fp32, _ = load_model_and_tokenizer(tmp_path / "gqa", dtype="float32")
    assert bf16.dtype == torch.bfloat16 and fp32.dtype == torch.float32
    assert facts["parameters"] == layout.parameters() == sum(p.numel() for p in bf16.parameters())
    assert bf16.config.num_key_value_heads == 2 and not bf16.config.tie_word_embeddings
    # fixed seed: the same layout builds the same weights
    again, _ = random_model_path("custom", layout, dtype="bfloat16", out=tmp_path / "again")
    w1 = load_model_and_tokenizer(again, dtype="bfloat16")[0].state_dict()
    assert all(torch.equal(v, w1[k]) for k, v in bf16.state_dict().items())


def test_random_builder_rejects_bad_layouts(capsys):
    for args in (["--size", "7b"], ["--layout", "hidden=64,layers=2"],
                 ["--layout", "hidden=64,layers=2,heads=6,kv_heads=2,mlp=96,vocab=50"],
                 ["--layout", "hidden=64,layers=2,heads=8,kv_heads=3,mlp=96,vocab=50"]):
        code, _, err = run_cli(["model", "build", "--random", *args], capsys)
        assert code == 2 and len(err.strip().splitlines()) == 1, err
    code, _, err = run_cli(["model", "build", "--size", "tiny"], capsys)  # --size needs --random
    assert code == 2 and "--random" in err


# ---- dtype plumbing: engine, decode-bench, trainer (CPU here, CUDA under -m gpu) ----
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_engine_kv_cache_in_model_dtype_fp32_logprobs(random_tiny_dir, monkeypatch, one_thread,
                                                      device, dtype):
    from rlbatch.backends.builtin.batch import build_batch, forward_logprobs, to_device
    from rlbatch.rollout import builtin_engine
    from rlbatch.rollout.engine import SamplingParams
    from rlbatch.rollout.models import load_model_and_tokenizer

    model, _ = load_model_and_tokenizer(random_tiny_dir, device, dtype)
    model.eval()
    assert model.dtype == getattr(torch, dtype)
    seen, zeros = [], torch.zeros

    def spy(*args, **kwargs):
        t = zeros(*args, **kwargs)
        if t.dim() == 4:  # the per-layer K and V caches (C, kv_heads, max_len, head_dim)
            seen.append((t.dtype, t.device.type))
        return t

    monkeypatch.setattr(builtin_engine.torch, "zeros", spy)
    engine = builtin_engine.BuiltinEngine(model, [], 0)
    gen = torch.Generator(device=device).manual_seed(0)
    prompts = [[1, 5, 6, 7]] * 3 + [[1, 8, 9]] * 3
    ro = engine.generate(prompts, SamplingParams(max_new_tokens=10), 4, generator=gen)
    monkeypatch.undo()
    assert seen and set(seen) == {(getattr(torch, dtype), device)}
    assert ro.logprobs.dtype == torch.float32 and ro.lengths.tolist() == [10] * 6
    assert torch.isfinite(ro.logprobs).all() and (ro.logprobs <= 0).all()
    with torch.no_grad():
        teacher = forward_logprobs(model, to_device(build_batch(ro, 0), device), 1.0).cpu()
    gap = (teacher - ro.logprobs)[ro.mask].abs().max().item()
    assert gap < (1e-4 if dtype == "float32" else 5e-2), gap


@pytest.mark.parametrize("device,dtype", [("cpu", "float32"),
                                          pytest.param("cuda", "bfloat16", marks=GPU)])
def test_decode_bench_cli_dtype(random_tiny_dir, capsys, one_thread, device, dtype):
    code, out, err = run_cli(["decode-bench", "--model", random_tiny_dir, "--dtype", dtype,
                              "--device", device, "--concurrency", "1,4", "--new-tokens", "4",
                              "--reps", "1", "--min-sequences", "4", "--json"], capsys)
    assert code == 0, err
    res = json.loads(out.strip().splitlines()[-1])
    assert res["dtype"] == dtype and res["device"] == device
    assert [r["concurrency"] for r in res["rows"]] == [1, 4]
    assert all(r["tokens_per_s"] > 0 for r in res["rows"])


@pytest.mark.parametrize("device", DEVICES)
def test_trainer_bf16_noise_scale_checkpoint(random_tiny_dir, tmp_path, capsys, one_thread,
                                             device):
    """The built-in trainer in bf16 with the noise-scale probe and checkpoints (random reward
    source: the addition task scores the random model's text 0)."""
    from rlbatch.backends.builtin.checkpoint import find_checkpoint
    from rlbatch.core.runlog import read_run

    sets = [f"model={random_tiny_dir}", f"device={device}", "dtype=bfloat16",
            "batch.prompts_per_step=4", "batch.samples_per_prompt=4",
            "batch.micro_batch_sequences=8", "rollout.generation_concurrency=16",
            "rollout.max_new_tokens=6", "budget.max_samples=32", "eval.at_start=false",
            "eval.every_samples=16", "eval.prompts=8", "noise_scale.enabled=true",
            "checkpoint.every_samples=16"]
    code, out, err = run_cli(["train", "--preset", "grpo-tiny", "--out", tmp_path, "--json",
                              *set_flags(sets)], capsys)
    assert code == 0, err
    summary = json.loads(out.strip().splitlines()[-1])
    run = read_run(summary["run_dir"])
    assert run.config["dtype"] == "bfloat16" and run.config["device"] == device
    assert [r["samples"] for r in run.steps] == [16, 32]
    for row in run.steps:
        assert row["time/rollout"] > 0 and row["time/actor_update"] > 0
        assert math.isfinite(row["actor/loss"]) and "actor/noise_scale" in row
    assert find_checkpoint(Path(summary["run_dir"])) is not None


# ---- the GPU check itself, as a dry run on CPU ----
def test_gpu_check_dry_run(tmp_path):
    out = tmp_path / "out"
    env = dict(os.environ, OUT=str(out), PYTHON=sys.executable)
    proc = subprocess.run(["bash", "bench/gpu_check.sh", "--dry-run"], check=False, cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=170)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    res = json.loads((out / "gpu_check.json").read_text())
    md = (out / "gpu_check.md").read_text()
    assert (out / "gpu_tests.log").is_file() and (out / "environment.txt").is_file()
    assert res["schema"] == 1 and res["dry_run"] is True
    assert res["environment"]["device"] == "cpu" and res["total_s"] > 0
    st = res["stages"]
    assert set(st) == {"gpu_tests", "decode_main", "grpo_main", "decode_tiny", "grpo_tiny"}
    assert st["gpu_tests"]["status"] == "passed", st["gpu_tests"]  # GPU tests skip on CPU
    cs = list(res["settings"]["concurrency"])
    for key in ("decode_main", "decode_tiny"):
        d = st[key]
        assert d["status"] == "ok" and d["dtype"] == "float32", d
        assert [r["concurrency"] for r in d["rows"]] == cs
        for r in d["rows"]:
            assert r["tokens_per_s"] > 0 and r["step_ms"] > 0
            assert 0 < r["hbm_fraction_of_copy"] and r["hbm_bytes_per_s"] > 0
            assert f"| {r['concurrency']} |" in md
        assert d["plateau_concurrency"] in cs and d["gain_c8_to_plateau"] > 0
        assert d["best_tokens_per_s"] == max(r["tokens_per_s"] for r in d["rows"])
        assert set(d["hbm_fraction_small_c"]) == {"1", "8"}
        kv = d["kv"]
        assert kv["bytes_per_token"] > 0 and kv["max_concurrency_at_bench_length"] > \
            kv["max_concurrency_at_4096_tokens"] > 0
        assert d["model"]["size"] == "tiny" and d["model"]["parameters"] == 789_888
    batches = list(res["settings"]["batches"])
    new_tokens = res["settings"]["step_new_tokens"]
    for key in ("grpo_main", "grpo_tiny"):
        g = st[key]
        assert g["status"] == "ok" and [r["batch"] for r in g["rows"]] == batches, g
        for r in g["rows"]:
            assert r["status"] == "ok" and r["step_s"] > 0 and r["rollout_s"] > 0
            assert r["actor_update_s"] > 0 and r["other_s"] >= 0
            assert r["rollout_s"] + r["actor_update_s"] + r["other_s"] <= r["step_s"] + 1e-9
            assert r["samples_per_s"] == pytest.approx(r["batch"] / r["step_s"])
            for s in r["steps"]:
                assert s["tokens"] == r["batch"] * new_tokens  # EOS ignored: fixed lengths
                assert s["rollout_s"] + s["actor_update_s"] + s["other_s"] <= s["step_s"] + 1e-9
                assert math.isfinite(s["loss"]) and s["skipped"] == 0
            assert f"| {r['batch']} |" in md
    assert "| C | tokens/s" in md and "| B | step s" in md and "GPU tests" in md
