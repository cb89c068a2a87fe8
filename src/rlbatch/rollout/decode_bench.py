"""Decode throughput against generation concurrency C, with a measured roofline.

Implements the "raise decode concurrency until throughput plateaus, latency is unacceptable
or KV memory runs out" step of the paper's procedure (docs/design.md, Method; arXiv
2608.29296). For each C the engine decodes full waves of random prompts for exactly
`new_tokens` tokens (EOS disabled), after one untimed warm-up wave, and reports the median
tokens/s over `reps`, the latency by Little's law, the KV bytes against the memory budget,
and the fraction of a roofline (Williams et al. 2009) built from this machine's own GEMM and
copy probes. The sweep stops at the memory budget, an out-of-memory error or the latency
cap; `plateau_concurrency` is the smallest C within 5% of the best tokens/s. Definitions,
FLOP and byte counts, deviations: docs/design.md, "Module notes".
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import statistics
import time
from collections.abc import Callable

import torch

from rlbatch.core.errors import ConfigError
from rlbatch.core.timers import cuda_sync_or_none
from rlbatch.rollout.engine import SamplingParams

PLATEAU_TOLERANCE = 0.05
STOP_REASONS = ("completed", "memory_budget", "out_of_memory", "latency_cap")
BENCH_ENGINES = ("builtin", "hf")


@dataclasses.dataclass(frozen=True)
class BenchSpec:
    concurrency: tuple[int, ...]
    prompt_tokens: int = 9
    new_tokens: int = 32
    reps: int = 3
    memory_budget_bytes: int | None = None  # None: the device's total memory
    latency_cap_s: float | None = None
    min_sequences: int = 64
    seed: int = 0

    def __post_init__(self):
        if not self.concurrency or any(c <= 0 for c in self.concurrency):
            raise ConfigError("decode concurrency C: give one or more positive integers")
        if list(self.concurrency) != sorted(set(self.concurrency)):
            raise ConfigError(f"decode concurrency C: values must be increasing and distinct, "
                              f"got {list(self.concurrency)}")
        for name in ("prompt_tokens", "new_tokens", "reps", "min_sequences"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"--{name.replace('_', '-')}: must be a positive integer")
        if self.latency_cap_s is not None and self.latency_cap_s <= 0:
            raise ConfigError("--latency-cap-s: must be positive")
        if self.memory_budget_bytes is not None and self.memory_budget_bytes <= 0:
            raise ConfigError("--memory-budget: must be positive")

    def sequences(self, c: int) -> int:
        """Smallest multiple of c that is >= min_sequences (full waves only)."""
        return c * max(1, math.ceil(self.min_sequences / c))


@dataclasses.dataclass(frozen=True)
class ModelShape:
    """The model facts the memory and roofline figures need (from config and parameters)."""

    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    matmul_params: int  # weights of every nn.Linear (LM head included)
    weight_bytes: int  # all unique parameters (tied weights once): read once per step
    dtype_bytes: int

    @classmethod
    def from_model(cls, model) -> ModelShape:
        cfg = model.config
        heads = cfg.num_attention_heads
        kv = getattr(cfg, "num_key_value_heads", None) or heads
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
        linear = sum(m.weight.numel() for m in model.modules()
                     if isinstance(m, torch.nn.Linear))
        params = {id(p): p for p in model.parameters()}.values()  # tied weights once
        weight_bytes = sum(p.numel() * p.element_size() for p in params)
        dtype_bytes = next(iter(model.parameters())).element_size()
        return cls(cfg.num_hidden_layers, heads, kv, head_dim, linear, weight_bytes, dtype_bytes)

    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes

    def kv_bytes_per_sequence(self, tokens: int) -> int:
        return self.kv_bytes_per_token() * tokens

    def flops_per_token(self, ctx: float) -> float:
        return 2.0 * self.matmul_params + 4.0 * self.layers * self.heads * self.head_dim * ctx

    def bytes_per_step(self, c: int, ctx: float) -> float:
        return self.weight_bytes + c * self.kv_bytes_per_token() * ctx


# ---- pure helpers ----
def max_concurrency_in_budget(budget_bytes: int | None, weight_bytes: int,
                              kv_bytes_per_sequence: int) -> int | None:
    """Largest C with weights + C * KV bytes <= budget (0 if the weights alone do not fit)."""
    if budget_bytes is None:
        return None
    return max(0, (budget_bytes - weight_bytes) // kv_bytes_per_sequence)


def plateau_concurrency(rows: list[dict], tolerance: float = PLATEAU_TOLERANCE) -> int | None:
    """Smallest C whose tokens_per_s is within `tolerance` of the best, among rows within the
    latency cap; None when there is no such row."""
    ok = [r for r in rows if r.get("within_latency_cap", True)]
    if not ok:
        return None
    best = max(r["tokens_per_s"] for r in ok)
    return min(r["concurrency"] for r in ok if r["tokens_per_s"] >= (1 - tolerance) * best)


def plateau_reached(rows: list[dict], tolerance: float = PLATEAU_TOLERANCE) -> bool:
    """Whether throughput levelled off inside the range tried: a larger C than the plateau's
    was measured (within the latency cap) and gained less than `tolerance`."""
    c = plateau_concurrency(rows, tolerance)
    ok = [r["concurrency"] for r in rows if r.get("within_latency_cap", True)]
    return c is not None and c < max(ok)


def roofline_row(shape: ModelShape, c: int, ctx: float, tokens_per_s: float,
                 peak_flops: float, bandwidth: float) -> dict:
    """Arithmetic intensity of one decode step at concurrency c and the achieved fraction of
    min(peak_flops, intensity * bandwidth)."""
    flops_tok = shape.flops_per_token(ctx)
    intensity = flops_tok * c / shape.bytes_per_step(c, ctx)  # FLOP per byte
    bound = min(peak_flops, intensity * bandwidth)
    achieved = tokens_per_s * flops_tok
    return {"arithmetic_intensity": intensity, "roofline_bound_flops": bound,
            "bound_by": "compute" if bound >= peak_flops else "memory",
            "achieved_flops": achieved, "roofline_fraction": achieved / bound}


def is_out_of_memory(exc: BaseException) -> bool:
    """torch.OutOfMemoryError (CUDA), or the CPU allocator's RuntimeError."""
    if isinstance(exc, torch.OutOfMemoryError):
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and ("out of memory" in text
                                              or "can't allocate memory" in text)


# ---- probes ----
def _median_seconds(fn: Callable[[], None], reps: int, sync: Callable[[], None]) -> float:
    fn()  # warm-up
    sync()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


@functools.cache
def gemm_flops_probe(device: str, dtype: torch.dtype, sizes: tuple[int, ...] = (1024, 2048),
                     reps: int = 3, threads: int | None = None) -> float:
    """Peak matmul FLOP/s: best over `sizes` of the median of `reps` n x n GEMMs (2 n^3 each).
    Cached per process; `threads` (torch's intra-op thread count) only keys the cache."""
    sync = cuda_sync_or_none(device) or (lambda: None)
    best = 0.0
    for n in sizes:
        a = torch.randn(n, n, device=device).to(dtype)  # (n, n)
        b = torch.randn(n, n, device=device).to(dtype)  # (n, n)
        seconds = _median_seconds(functools.partial(torch.mm, a, b), reps, sync)
        best = max(best, 2.0 * n ** 3 / seconds)
    return best


@functools.cache
def bandwidth_probe(device: str, nbytes: int = 256 * 2 ** 20, reps: int = 5,
                    threads: int | None = None) -> float:
    """Memory bandwidth: (bytes read + bytes written) / s of a large tensor copy. Cached per
    process; `threads` only keys the cache."""
    sync = cuda_sync_or_none(device) or (lambda: None)
    src = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    seconds = _median_seconds(lambda: dst.copy_(src), reps, sync)
    return 2.0 * src.numel() * 4 / seconds


def default_memory_budget(device: str) -> int | None:
    """Total device memory (CUDA) or physical RAM (CPU); None when unknown."""
    if str(device).startswith("cuda"):
        return int(torch.cuda.get_device_properties(torch.device(device)).total_memory)
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return None


# ---- the sweep ----
def random_prompts(n: int, length: int, vocab_ids: torch.Tensor,
                   generator: torch.Generator) -> list[list[int]]:
    """n prompts of `length` ids drawn uniformly from vocab_ids (1-D, no special tokens)."""
    idx = torch.randint(0, len(vocab_ids), (n, length), generator=generator)  # (n, length)
    return vocab_ids[idx].tolist()


def _time_concurrency(engine, prompts, params, c, reps, generator) -> list[float]:
    """Warm-up wave of c sequences, then `reps` timed runs; tokens/s of each run."""
    engine.generate(prompts[:c], params, c, generator=generator)
    rates = []
    for _ in range(reps):
        t0 = time.perf_counter()
        out = engine.generate(prompts, params, c, generator=generator)
        rates.append(out.tokens / (time.perf_counter() - t0))
    return rates


def sweep_concurrency(engine, shape: ModelShape, vocab_ids: torch.Tensor, spec: BenchSpec,
                      probes: dict, progress: Callable[[int, dict], None] | None = None,
                      engine_generator: torch.Generator | None = None) -> dict:
    """Run the sweep over spec.concurrency with `engine` (EOS disabled by the caller).

    Returns {kv_bytes_per_sequence, max_concurrency_in_budget, rows, plateau_concurrency,
    stopped_by}; `progress(c, row)` is called after each measured C. Prompts are drawn on the
    CPU; sampling uses `engine_generator` (it must live on the model's device: a CPU
    generator cannot drive CUDA sampling), by default the prompts' CPU generator.
    """
    tokens = spec.prompt_tokens + spec.new_tokens
    kv_seq = shape.kv_bytes_per_sequence(tokens)
    c_max = max_concurrency_in_budget(spec.memory_budget_bytes, shape.weight_bytes, kv_seq)
    ctx = spec.prompt_tokens + spec.new_tokens / 2
    params = SamplingParams(max_new_tokens=spec.new_tokens, temperature=1.0)
    gen = torch.Generator().manual_seed(spec.seed)
    sample_gen = engine_generator or gen
    rows, stopped_by = [], "completed"
    for c in spec.concurrency:
        if c_max is not None and c > c_max:
            stopped_by = "memory_budget"
            break
        prompts = random_prompts(spec.sequences(c), spec.prompt_tokens, vocab_ids, gen)
        try:
            rates = _time_concurrency(engine, prompts, params, c, spec.reps, sample_gen)
        except RuntimeError as exc:  # torch.OutOfMemoryError is a RuntimeError
            if not is_out_of_memory(exc):
                raise
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            stopped_by = "out_of_memory"
            break
        tps = statistics.median(rates)
        latency = c * spec.new_tokens / tps
        row = {"concurrency": c, "sequences": len(prompts), "tokens_per_s": tps,
               "tokens_per_s_reps": rates, "latency_s": latency, "kv_bytes": c * kv_seq,
               "within_latency_cap": spec.latency_cap_s is None or latency <= spec.latency_cap_s}
        row.update(roofline_row(shape, c, ctx, tps, probes["gemm_flops"],
                                probes["bandwidth_bytes_per_s"]))
        rows.append(row)
        if progress:
            progress(c, row)
        if not row["within_latency_cap"]:
            stopped_by = "latency_cap"
            break
    return {"kv_bytes_per_sequence": kv_seq, "max_concurrency_in_budget": c_max, "rows": rows,
            "plateau_concurrency": plateau_concurrency(rows),
            "plateau_reached": plateau_reached(rows), "stopped_by": stopped_by}


# ---- model-level entry point ----
def load_bench_model(model: str, device: str, dtype=None):
    """(model, tokenizer, path) for `tiny` (built offline, cached) or a local HF folder;
    `dtype` ('float32', 'bfloat16'; None: the checkpoint's) casts the weights."""
    from rlbatch.rollout.models import load_model_and_tokenizer, resolve_model_path
    from rlbatch.rollout.tiny_model import recipe_for, tiny_model_path

    path = tiny_model_path(recipe_for("addition", 3)) if model == "tiny" else resolve_model_path(
        model, "addition", 3)
    m, tok = load_model_and_tokenizer(path, device=device, dtype=dtype)
    return m.eval(), tok, path


def make_bench_engine(name: str, model, pad_id: int):
    """The engine (one of BENCH_ENGINES) with EOS disabled (eos_ids=[]): every sequence runs
    to new_tokens."""
    if name == "builtin":
        from rlbatch.rollout.builtin_engine import BuiltinEngine

        return BuiltinEngine(model, [], pad_id)
    from rlbatch.rollout.hf_engine import HFEngine

    return HFEngine(model, [], pad_id)


def _vocab_ids(model, tokenizer) -> torch.Tensor:
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    ids = [i for i in range(model.config.vocab_size) if i not in special]
    return torch.tensor(ids or list(range(model.config.vocab_size)))


def run_decode_bench(model_name: str, engine_name: str, spec: BenchSpec, device: str = "auto",
                     threads: int | None = None,
                     progress: Callable[[int, dict], None] | None = None,
                     dtype: str | None = None) -> dict:
    """Load the model, probe the machine, sweep C; returns the JSON-ready result.
    `threads` sets torch's intra-op thread count for the whole process when given; `dtype`
    ('float32', 'bfloat16'; None: the checkpoint's) sets the weights' and KV cache's dtype."""
    if engine_name not in BENCH_ENGINES:
        raise ConfigError(f"--engine: unknown engine '{engine_name}'; use builtin or hf")
    if threads is not None:
        if threads <= 0:
            raise ConfigError("--threads: must be a positive integer")
        torch.set_num_threads(threads)
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    model, tokenizer, path = load_bench_model(model_name, device, dtype)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    engine = make_bench_engine(engine_name, model, int(pad))
    shape = ModelShape.from_model(model)
    dtype = next(model.parameters()).dtype
    threads = torch.get_num_threads()
    probes = {"gemm_flops": gemm_flops_probe(device, dtype, threads=threads),
              "bandwidth_bytes_per_s": bandwidth_probe(device, threads=threads)}
    probes["ridge_intensity"] = probes["gemm_flops"] / probes["bandwidth_bytes_per_s"]
    if spec.memory_budget_bytes is None:
        spec = dataclasses.replace(spec, memory_budget_bytes=default_memory_budget(device))
    engine_gen = (torch.Generator(device=device).manual_seed(spec.seed)
                  if str(device).startswith("cuda") else None)
    result = sweep_concurrency(engine, shape, _vocab_ids(model, tokenizer), spec, probes, progress,
                               engine_generator=engine_gen)
    best = max((r["tokens_per_s"] for r in result["rows"]), default=None)
    return {"model": model_name, "model_path": str(path), "engine": engine_name,
            "device": device, "dtype": str(dtype).removeprefix("torch."),
            "threads": threads, "prompt_tokens": spec.prompt_tokens,
            "new_tokens": spec.new_tokens, "reps": spec.reps,
            "min_sequences": spec.min_sequences,
            "weight_bytes": shape.weight_bytes, "memory_budget_bytes": spec.memory_budget_bytes,
            "latency_cap_s": spec.latency_cap_s, "probes": probes,
            "best_tokens_per_s": best, **result}
