"""Decode engines: the built-in continuous-batching engine against `transformers` generate
(tokens) and a teacher-forced forward (log-probabilities); sampling determinism and top-p;
the vLLM engine (GPU only); and `rlbatch decode-bench` end to end on a small random model.

Models are small random Llama/Qwen2 networks built here (no tiny-model build needed).
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from helpers.cli import run_cli
from rlbatch.core.errors import ConfigError
from rlbatch.rollout import builtin_engine
from rlbatch.rollout.builtin_engine import REFILL_DIVISOR, BuiltinEngine
from rlbatch.rollout.decode_bench import (
    BenchSpec,
    ModelShape,
    max_concurrency_in_budget,
    plateau_concurrency,
    plateau_reached,
    sweep_concurrency,
)
from rlbatch.rollout.engine import SamplingParams, keyed_uniforms, response_keys, sample_next
from rlbatch.rollout.hf_engine import HFEngine

transformers = pytest.importorskip("transformers")

VOCAB, PAD, BOS = 12, 0, 1


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """These models are tiny: one thread is as fast and immune to a busy shared CPU."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def small_llama(seed: int = 0, vocab: int = VOCAB, **overrides):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = {"vocab_size": vocab, "hidden_size": 32, "intermediate_size": 64,
           "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
           "max_position_embeddings": 64, "bos_token_id": BOS, "eos_token_id": None,
           "pad_token_id": PAD, "tie_word_embeddings": False}
    cfg.update(overrides)
    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(**cfg)).eval()


def random_prompts(n: int, seed: int, lo: int = 2, hi: int = 9) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(lo, hi + 1, (n,), generator=g).tolist()
    return [[BOS] + torch.randint(3, VOCAB, (k - 1,), generator=g).tolist() for k in lens]


def pick_eos(model, prompts, max_new: int) -> int:
    """A token that the greedy oracle emits in some responses but not in others, so that
    EOS-terminated and length-terminated sequences both occur (chosen from the oracle)."""
    free = HFEngine(model, [], PAD).generate(prompts, SamplingParams(max_new, greedy=True), 8)
    rows = [set(free.response_ids[i, 1:].tolist()) for i in range(len(prompts))]
    share = {t: sum(t in r for r in rows) / len(rows) for t in range(2, VOCAB)}
    return min(share, key=lambda t: abs(share[t] - 0.5))


def teacher_forced(model, prompt, response, temperature: float) -> torch.Tensor:
    """log_softmax(logits / T) of each response token from one unpadded forward."""
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float() / temperature  # (L, V)
    logp = torch.log_softmax(logits, -1)[len(prompt) - 1: len(prompt) - 1 + len(response)]
    return logp.gather(1, torch.tensor(response)[:, None]).squeeze(1)  # (len(response),)


def rows_of(out):
    return [out.response_ids[i, : out.lengths[i]].tolist() for i in range(len(out.lengths))]


def test_decode_seconds_at_low_concurrency_are_counted_apart():
    # no EOS: every response runs 6 tokens, so which decode steps hold < 8 sequences is known
    model, params = small_llama(seed=2), SamplingParams(max_new_tokens=6, greedy=True)
    eng = BuiltinEngine(model, [], PAD)
    full = eng.generate(random_prompts(16, seed=5), params, 16).timing  # 16 active throughout
    assert full["decode_s"] > 0 and full["decode_low_s"] == 0.0
    narrow = eng.generate(random_prompts(16, seed=5), params, 4).timing  # never more than 4
    assert narrow["decode_low_s"] == narrow["decode_s"] > 0
    tail = eng.generate(random_prompts(20, seed=5), params, 16).timing  # 16, then the last 4
    assert 0 < tail["decode_low_s"] < tail["decode_s"]


def test_freed_slots_are_refilled_in_groups():
    """Past the first wave, each prefill takes at least C // REFILL_DIVISOR prompts (or the
    rest): at most 1 + ceil((n - C) / group) prefills, and every sequence is decoded."""
    model, max_new = small_llama(), 12
    prompts = random_prompts(96, seed=4)
    eos = pick_eos(model, prompts, max_new)
    params = SamplingParams(max_new_tokens=max_new, temperature=1.0)
    C = 32  # groups of 4; refilling each slot as it frees took 20 prefills here
    group = C // REFILL_DIVISOR
    out = BuiltinEngine(model, [eos], PAD).generate(prompts, params, C,
                                                     generator=torch.Generator().manual_seed(0))
    assert len(set(out.lengths.tolist())) >= 3  # sequences free their slots at different steps
    assert 1 < out.timing["prefills"] <= 1 + math.ceil((96 - C) / group)
    assert all(r in ("eos", "length") for r in out.finish_reasons)
    assert (out.lengths >= 1).all()


def test_idle_slots_ride_along_without_changing_any_sample(monkeypatch):
    """A decode step with most slots busy computes all C rows (PAD_MIN_SHARE) instead of
    gathering the busy rows' caches; the idle rows' outputs are dropped and no random draw
    is spent on them, so sampled tokens are the gather path's and log-probs agree."""
    model, max_new = small_llama(), 12
    prompts = random_prompts(96, seed=4)
    eos = pick_eos(model, prompts, max_new)
    params = SamplingParams(max_new_tokens=max_new, temperature=1.0)
    padded_steps = []
    real_forward = BuiltinEngine._forward

    def counting_forward(self, ids, *args, step=None, **kw):
        # an idle row decodes at position 0; a busy one never does (prompts have >= 2 tokens)
        if step is not None and bool((step.pos == 0).any()):
            padded_steps.append((ids.shape[0], int((step.pos > 0).sum())))
        return real_forward(self, ids, *args, step=step, **kw)

    def run(share):
        monkeypatch.setattr(builtin_engine, "PAD_MIN_SHARE", share)
        return BuiltinEngine(model, [eos], PAD).generate(
            prompts, params, 32, generator=torch.Generator().manual_seed(0))

    monkeypatch.setattr(BuiltinEngine, "_forward", counting_forward)
    gathered = run(2.0)  # never pad: the gather path
    assert padded_steps == []
    padded = run(0.5)
    assert len(padded_steps) > 10
    assert all(rows == 32 and 16 <= busy < 32 for rows, busy in padded_steps)
    assert rows_of(padded) == rows_of(gathered)
    assert padded.finish_reasons == gathered.finish_reasons
    assert torch.allclose(padded.logprobs, gathered.logprobs, atol=1e-5, rtol=0)


# ---- acceptance 1: greedy tokens equal transformers generate ----
@pytest.mark.parametrize("concurrency", [5, 7, 16])  # 16: slots refilled in groups of 2
def test_greedy_tokens_match_hf_generate(concurrency):
    model, max_new = small_llama(), 12
    prompts = random_prompts(23, seed=1)
    eos = pick_eos(model, prompts, max_new)
    params = SamplingParams(max_new_tokens=max_new, greedy=True)
    ours = BuiltinEngine(model, [eos], PAD).generate(prompts, params, concurrency)
    ref = HFEngine(model, [eos], PAD).generate(prompts, params, concurrency)
    assert len({len(p) for p in prompts}) >= 4  # uneven prompts
    assert len(set(ours.lengths.tolist())) >= 3  # uneven responses
    assert {"eos", "length"} <= set(ours.finish_reasons)
    assert rows_of(ours) == rows_of(ref)
    assert ours.finish_reasons == ref.finish_reasons
    assert torch.equal(ours.lengths, ref.lengths)
    assert torch.equal(ours.mask, ref.mask)
    assert torch.allclose(ours.logprobs, ref.logprobs, atol=1e-5, rtol=0)


def test_concurrency_one_matches_hf():
    model = small_llama(seed=3)
    prompts = random_prompts(6, seed=4)
    params = SamplingParams(max_new_tokens=7, greedy=True)
    ours = BuiltinEngine(model, [], PAD).generate(prompts, params, 1)
    ref = HFEngine(model, [], PAD).generate(prompts, params, 4)
    assert ours.timing["concurrency"] == 1
    assert rows_of(ours) == rows_of(ref)
    assert ours.finish_reasons == ["length"] * 6


def test_qwen2_with_attention_bias_matches_hf():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=64, bos_token_id=BOS, eos_token_id=None,
                      pad_token_id=PAD, tie_word_embeddings=False)
    torch.manual_seed(5)
    model = Qwen2ForCausalLM(cfg).eval()
    bias = model.model.layers[0].self_attn.q_proj.bias
    assert bias is not None
    with torch.no_grad():  # make the biases matter (they are zero-initialised)
        for layer in model.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.bias.normal_(0, 0.5)
    prompts = random_prompts(11, seed=6)
    params = SamplingParams(max_new_tokens=9, greedy=True)
    ours = BuiltinEngine(model, [], PAD).generate(prompts, params, 4)
    ref = HFEngine(model, [], PAD).generate(prompts, params, 4)
    assert rows_of(ours) == rows_of(ref)
    assert torch.allclose(ours.logprobs, ref.logprobs, atol=1e-5, rtol=0)


# ---- acceptance 2: log-probabilities equal a teacher-forced forward ----
@pytest.mark.parametrize("engine_cls", [BuiltinEngine, HFEngine])
@pytest.mark.parametrize("greedy,temperature", [(True, 1.0), (False, 0.7)])
def test_logprobs_equal_teacher_forced_forward(engine_cls, greedy, temperature):
    model = small_llama(seed=7)
    prompts = random_prompts(13, seed=8)
    eos = pick_eos(model, prompts, 10)
    params = SamplingParams(max_new_tokens=10, temperature=temperature, greedy=greedy)
    torch.manual_seed(9)  # HFEngine samples from the global RNG
    out = engine_cls(model, [eos], PAD).generate(prompts, params, 5,
                                                 generator=torch.Generator().manual_seed(9))
    assert len(set(out.lengths.tolist())) >= 2
    for i, (prompt, resp) in enumerate(zip(prompts, rows_of(out))):
        ref = teacher_forced(model, prompt, resp, temperature)
        got = out.logprobs[i, : len(resp)]
        assert torch.allclose(got, ref, atol=1e-5, rtol=0), (i, got, ref)
        assert torch.all(out.logprobs[i, len(resp):] == 0)


# ---- sampling ----
def test_same_generator_seed_gives_identical_rollouts():
    model = small_llama(seed=10)
    prompts = random_prompts(17, seed=11)
    params = SamplingParams(max_new_tokens=8, temperature=1.0)
    engine = BuiltinEngine(model, [2], PAD)
    a = engine.generate(prompts, params, 6, generator=torch.Generator().manual_seed(123))
    b = engine.generate(prompts, params, 6, generator=torch.Generator().manual_seed(123))
    c = engine.generate(prompts, params, 6, generator=torch.Generator().manual_seed(124))
    assert torch.equal(a.response_ids, b.response_ids) and torch.equal(a.logprobs, b.logprobs)
    assert a.finish_reasons == b.finish_reasons
    assert not torch.equal(a.response_ids, c.response_ids)


# Next-token distribution fixed by construction: 0.4, 0.3, 0.2 on tokens 5, 7, 9, the rest
# 0.1 / 9 each. Nucleus at top_p = 0.75 (smallest prefix of the sorted probabilities whose
# mass reaches 0.75): {5, 7, 9}, renormalised to 4/9, 3/9, 2/9.
PROBS = {5: 0.4, 7: 0.3, 9: 0.2}


def controlled_model():
    """Every position's logits are log(PROBS): all embeddings equal, attention and MLP
    outputs zeroed so the residual stream is the embedding, the head reads a constant."""
    model = small_llama(seed=12)
    logits = torch.full((VOCAB,), math.log(0.1 / 9))
    for t, p in PROBS.items():
        logits[t] = math.log(p)
    with torch.no_grad():
        model.model.embed_tokens.weight.fill_(1.0)
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.model.norm.weight.fill_(1.0)
        model.lm_head.weight.copy_(logits[:, None].expand(VOCAB, 32) / 32)
    return model, logits


def test_sample_next_top_p_keeps_only_the_nucleus():
    _, logits = controlled_model()
    params = SamplingParams(max_new_tokens=1, temperature=1.0, top_p=0.75)
    tok, lp = sample_next(logits.expand(4000, VOCAB), params, torch.Generator().manual_seed(0))
    counts = torch.bincount(tok, minlength=VOCAB).float() / len(tok)
    assert set(tok.unique().tolist()) == set(PROBS)
    for t, p in PROBS.items():  # renormalised nucleus frequencies, 5 standard errors
        q = p / 0.9
        assert abs(counts[t] - q) < 5 * math.sqrt(q * (1 - q) / len(tok))
    assert torch.allclose(lp, torch.log_softmax(logits, -1)[tok], atol=1e-6)


@pytest.mark.parametrize("engine_cls", [BuiltinEngine, HFEngine])
def test_engines_sample_only_inside_the_nucleus(engine_cls):
    model, logits = controlled_model()
    prompts = random_prompts(24, seed=13)
    params = SamplingParams(max_new_tokens=16, temperature=1.0, top_p=0.75)
    torch.manual_seed(14)
    out = engine_cls(model, [], PAD).generate(prompts, params, 12,
                                              generator=torch.Generator().manual_seed(14))
    toks = out.response_ids[out.mask]
    assert len(toks) == 24 * 16
    assert set(toks.unique().tolist()) == set(PROBS)  # 384 draws: all three, nothing else
    expected = torch.log_softmax(logits, -1)[toks]  # top-p is not folded into the log-prob
    assert torch.allclose(out.logprobs[out.mask], expected, atol=1e-5)


# ---- vLLM ----
def test_vllm_engine_unavailable_is_one_line_config_error():
    from rlbatch.rollout.models import make_engine
    from rlbatch.rollout.tiny_model import build_tokenizer

    try:
        import vllm  # noqa: F401
        has_vllm = True
    except ImportError:
        has_vllm = False
    if has_vllm and torch.cuda.is_available():
        pytest.skip("vllm and CUDA are available")
    with pytest.raises(ConfigError) as exc:
        make_engine("vllm", small_llama(), build_tokenizer())
    assert str(exc.value) == "rollout.engine: vllm needs the `vllm` extra and a CUDA GPU"


def test_vllm_rescoring_equals_engine_logprobs():
    """The vLLM engine's fallback re-scoring (right-padded batched teacher forcing) gives the
    built-in engine's log-probabilities: runs on CPU, no vLLM needed."""
    from rlbatch.rollout.vllm_engine import teacher_forced_logprobs

    model = small_llama(seed=17)
    prompts = random_prompts(9, seed=18)
    for params in (SamplingParams(6, greedy=True), SamplingParams(6, temperature=0.7)):
        out = BuiltinEngine(model, [2], PAD).generate(prompts, params, 4,
                                                      generator=torch.Generator().manual_seed(0))
        got = teacher_forced_logprobs(model, prompts, rows_of(out), params, PAD, chunk=4)
        for i, lp in enumerate(got):
            assert torch.allclose(torch.tensor(lp), out.logprobs[i, : len(lp)], atol=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="vLLM needs a CUDA GPU")
def test_vllm_engine_matches_hf_and_syncs_weights(tmp_path):
    pytest.importorskip("vllm")
    from rlbatch.rollout.tiny_model import build_tokenizer
    from rlbatch.rollout.vllm_engine import VLLMEngine

    tok = build_tokenizer()  # head_dim 64: a size every vLLM attention backend takes
    model = small_llama(seed=15, vocab=len(tok), hidden_size=256, intermediate_size=512,
                        num_attention_heads=4, num_key_value_heads=2).cuda()
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    model = type(model).from_pretrained(tmp_path).cuda().eval()
    prompts = [[BOS] + p[1:] for p in random_prompts(9, seed=16)]
    greedy = SamplingParams(max_new_tokens=8, greedy=True)
    engine = VLLMEngine(model, tok, [], PAD, gpu_memory_utilization=0.3)
    assert rows_of(engine.generate(prompts, greedy, 4)) == rows_of(
        HFEngine(model, [], PAD).generate(prompts, greedy, 4))
    sampled = SamplingParams(max_new_tokens=8, temperature=0.7)
    a = engine.generate(prompts, sampled, 4, generator=torch.Generator().manual_seed(1))
    b = engine.generate(prompts, sampled, 4, generator=torch.Generator().manual_seed(1))
    assert torch.equal(a.response_ids, b.response_ids)
    for i, (p, r) in enumerate(zip(prompts, rows_of(a))):
        ref = teacher_forced(model, p, r, 0.7)
        assert torch.allclose(a.logprobs[i, : len(r)], ref.cpu(), atol=1e-3)
    with torch.no_grad():  # an "update": the synced engine must follow the new weights
        model.lm_head.weight.mul_(-1.0)
    engine.sync_weights()
    assert rows_of(engine.generate(prompts, greedy, 4)) == rows_of(
        HFEngine(model, [], PAD).generate(prompts, greedy, 4))
    engine.close()


# ---- decode-bench: pure rules ----
def test_budget_and_plateau_rules():
    assert max_concurrency_in_budget(1000, 200, 100) == 8
    assert max_concurrency_in_budget(100, 200, 100) == 0
    assert max_concurrency_in_budget(None, 200, 100) is None
    rows = [{"concurrency": 1, "tokens_per_s": 10.0}, {"concurrency": 2, "tokens_per_s": 96.0},
            {"concurrency": 4, "tokens_per_s": 100.0}, {"concurrency": 8, "tokens_per_s": 97.0}]
    assert plateau_concurrency(rows) == 2  # 96 >= 0.95 * 100
    rows[1]["tokens_per_s"] = 94.9
    assert plateau_concurrency(rows) == 4
    rows[2]["within_latency_cap"] = False  # over the cap: not eligible; best is now 97
    assert plateau_concurrency(rows) == 2  # 94.9 >= 0.95 * 97
    rows[1]["tokens_per_s"] = 90.0
    assert plateau_concurrency(rows) == 8
    # the largest C tried is the best: throughput was still rising, no plateau was reached
    assert not plateau_reached(rows)
    rows[3]["tokens_per_s"] = 89.0  # C = 2 (90) is now within 5% of the best, C = 8 gains less
    assert plateau_concurrency(rows) == 2 and plateau_reached(rows)
    assert plateau_concurrency([]) is None


def test_kv_bytes_follow_the_config():
    shape = ModelShape.from_model(small_llama())  # 2 layers, 2 kv heads, head_dim 8, fp32
    assert shape.kv_bytes_per_sequence(10) == 2 * 2 * 2 * 8 * 10 * 4
    assert shape.weight_bytes == 4 * sum(p.numel() for p in small_llama().parameters())


class _OOMEngine:
    """Decodes nothing; raises the CUDA allocator's error from concurrency 4 on."""

    def generate(self, prompts, params, concurrency, generator=None):
        if concurrency >= 4:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return BuiltinEngine(small_llama(), [], PAD).generate(prompts, params, concurrency,
                                                              generator=generator)


def test_sweep_stops_cleanly_at_out_of_memory():
    spec = BenchSpec(concurrency=(1, 2, 4, 8), prompt_tokens=3, new_tokens=2, reps=1,
                     min_sequences=4)
    probes = {"gemm_flops": 1e9, "bandwidth_bytes_per_s": 1e9}
    out = sweep_concurrency(_OOMEngine(), ModelShape.from_model(small_llama()),
                            torch.arange(3, VOCAB), spec, probes)
    assert out["stopped_by"] == "out_of_memory"
    assert [r["concurrency"] for r in out["rows"]] == [1, 2]


# ---- decode-bench: the CLI ----
@pytest.fixture(scope="module")
def bench_model(tmp_path_factory):
    from rlbatch.rollout.tiny_model import build_tokenizer

    tok = build_tokenizer()
    path = tmp_path_factory.mktemp("bench-model")
    small_llama(seed=20, vocab=len(tok), eos_token_id=tok.eos_token_id).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def bench(model, *extra):
    return ["decode-bench", "--model", str(model), "--prompt-tokens", "3", "--new-tokens", "4",
            "--reps", "1", "--min-sequences", "8", "--json", *extra]


def test_decode_bench_cli_json(bench_model, capsys):
    code, out, _ = run_cli(bench(bench_model, "--concurrency", "1,2,4"), capsys)
    assert code in (0, None)
    doc = json.loads(out.strip().splitlines()[-1])
    for key in ("model", "engine", "prompt_tokens", "new_tokens", "kv_bytes_per_sequence",
                "max_concurrency_in_budget", "probes", "rows", "plateau_concurrency",
                "stopped_by"):
        assert key in doc, key
    assert doc["stopped_by"] == "completed" and doc["engine"] == "builtin"
    assert doc["kv_bytes_per_sequence"] == 2 * 2 * 2 * 8 * (3 + 4) * 4
    assert doc["probes"]["gemm_flops"] > 0 and doc["probes"]["bandwidth_bytes_per_s"] > 0
    rows = doc["rows"]
    assert [r["concurrency"] for r in rows] == [1, 2, 4]
    for r in rows:
        assert r["sequences"] == 8 and r["tokens_per_s"] > 0
        assert r["latency_s"] == pytest.approx(r["concurrency"] * 4 / r["tokens_per_s"])
        assert 0 < r["roofline_fraction"]
        assert r["roofline_bound_flops"] <= doc["probes"]["gemm_flops"] * (1 + 1e-12)
    best = max(r["tokens_per_s"] for r in rows)
    expect = min(r["concurrency"] for r in rows if r["tokens_per_s"] >= 0.95 * best)
    assert doc["plateau_concurrency"] == expect


def test_decode_bench_memory_budget_stops_the_sweep(bench_model, capsys):
    # 2e-4 GiB = 214,748 bytes: weights (79,488) + 1,792 KV bytes per sequence -> C <= 75.
    _, out, _ = run_cli(bench(bench_model, "--concurrency", "1,64,128",
                                 "--memory-budget", "0.0002"), capsys)
    doc = json.loads(out.strip().splitlines()[-1])
    assert (doc["weight_bytes"], doc["kv_bytes_per_sequence"]) == (79488, 1792)
    assert doc["max_concurrency_in_budget"] == (214748 - 79488) // 1792 == 75
    assert [r["concurrency"] for r in doc["rows"]] == [1, 64]
    assert doc["stopped_by"] == "memory_budget"


def test_decode_bench_latency_cap_stops_the_sweep(bench_model, capsys):
    _, out, _ = run_cli(bench(bench_model, "--concurrency", "1,2",
                                 "--latency-cap-s", "1e-9"), capsys)
    doc = json.loads(out.strip().splitlines()[-1])
    assert doc["stopped_by"] == "latency_cap"
    assert [r["concurrency"] for r in doc["rows"]] == [1]
    assert doc["rows"][0]["within_latency_cap"] is False
    assert doc["plateau_concurrency"] is None


def test_decode_bench_cli_hf_engine(bench_model, capsys):
    _, out, _ = run_cli(bench(bench_model, "--concurrency", "2", "--engine", "hf"), capsys)
    doc = json.loads(out.strip().splitlines()[-1])
    assert doc["engine"] == "hf" and doc["stopped_by"] == "completed"
    assert doc["rows"][0]["tokens_per_s"] > 0


@pytest.mark.parametrize("args,needle", [
    (["--concurrency", "1,two,4"], "--concurrency: expected comma-separated integers"),
    (["--concurrency", "4,2"], "--concurrency: values must be increasing"),
    (["--model", "/no/such/folder"], "no such local checkpoint folder"),
    (["--engine", "nope"], "--engine: unknown engine"),
])
def test_decode_bench_bad_input_exits_2_with_one_line(bench_model, capsys, args, needle):
    base = ["decode-bench", "--model", str(bench_model), "--reps", "1", "--new-tokens", "2",
            "--concurrency", "1"]
    code, _, err = run_cli(base + args, capsys)
    assert code == 2
    assert needle in err and len(err.strip().splitlines()) == 1


# ---------------------------------------------------------------- keyed sampling

@pytest.mark.parametrize("top_p", [1.0, 0.8])
def test_keyed_rollouts_are_the_same_at_every_concurrency(top_p):
    """Each response draws from its own keyed stream, so the decode concurrency (which
    decides slots, refill waves and the full/gather path) changes no token."""
    model, max_new = small_llama(), 12
    prompts = random_prompts(64, seed=4)
    eos = pick_eos(model, prompts, max_new)
    params = SamplingParams(max_new_tokens=max_new, temperature=1.0, top_p=top_p)
    keys = response_keys(seed=7, stream=0, first_prompt=100, prompts=16, group=4)
    eng = BuiltinEngine(model, [eos], PAD)
    outs = {c: eng.generate(prompts, params, c, keys=keys) for c in (16, 64, 256)}
    ref = outs[16]
    assert len(set(ref.lengths.tolist())) >= 3  # EOS and length endings both occur
    for c, out in outs.items():
        assert rows_of(out) == rows_of(ref), c
        assert torch.allclose(out.logprobs, ref.logprobs, atol=1e-5), c
    # the generator is not drawn from: the same rollouts whatever its state
    again = eng.generate(prompts, params, 64, generator=torch.Generator().manual_seed(99),
                         keys=keys)
    assert rows_of(again) == rows_of(ref)


def test_keyed_response_follows_its_key_not_its_position():
    model, max_new = small_llama(), 10
    prompts = random_prompts(32, seed=6)
    params = SamplingParams(max_new_tokens=max_new, temperature=1.0)
    keys = response_keys(seed=1, stream=0, first_prompt=0, prompts=8, group=4)
    eng = BuiltinEngine(model, [], PAD)
    base = rows_of(eng.generate(prompts, params, 8, keys=keys))
    order = torch.randperm(32, generator=torch.Generator().manual_seed(3)).tolist()
    moved = rows_of(eng.generate([prompts[i] for i in order], params, 8,
                                 keys=[keys[i] for i in order]))
    assert [moved[order.index(i)] for i in range(32)] == base
    other = rows_of(eng.generate(prompts, params, 8,
                                 keys=response_keys(2, 0, 0, 8, 4)))  # another seed
    assert sum(a != b for a, b in zip(other, base)) > 16


def test_response_keys_are_distinct_and_stable():
    keys = response_keys(0, 0, 0, 64, 8)
    assert len(set(keys)) == 512 and all(0 <= k < 2 ** 63 for k in keys)
    assert keys == response_keys(0, 0, 0, 64, 8)
    assert response_keys(0, 0, 8, 1, 8) == keys[64:72]  # prompt 8 of the stream, any step
    assert not set(keys) & set(response_keys(0, 1, 0, 64, 8))  # evaluation has its own


def test_inverse_cdf_draws_follow_the_distribution():
    """Keyed sampling draws exactly from softmax(logits / T): 20,000 draws of one row."""
    logits = torch.tensor([[0.0, 1.0, 2.0, -1.0]]).repeat(20000, 1)
    u = keyed_uniforms([5], 20000)[0]
    tok, _ = sample_next(logits, SamplingParams(4, temperature=1.0), None, u)
    freq = torch.bincount(tok, minlength=4).double() / 20000
    want = torch.softmax(torch.tensor([0.0, 1.0, 2.0, -1.0]), -1).double()
    assert torch.allclose(freq, want, atol=0.01)  # 3.5 binomial sd at most
