"""GPU check (issue #18): the paper's systems figures on one GPU in under 8 minutes.

Run through `bash bench/gpu_check.sh` (which installs rlbatch and its missing wheels first);
docs/benchmarks.md, "GPU check (H200)", says how and what each figure means. Stages, each with
its own time budget inside one overall deadline (a stage that runs out of budget stops early
and says so; results are rewritten after every stage, so a kill still leaves them):

a. `pytest -m gpu` (the GPU-marked tests), in a subprocess with a timeout.
b. decode throughput against concurrency C on the random ~0.5B Llama (`rlbatch model build
   --random --size 0.5b`) in bf16: tokens/s per C, plateau, gain from C = 8 to the plateau
   (the paper: up to 2.29x), HBM bandwidth fraction, KV-memory limit. The sweep is
   `rollout.decode_bench.sweep_concurrency`, one C at a time so the budget can stop it.
c. GRPO step time and its phases at B = 64..1024 on that model with long responses (EOS
   ignored: every response is exactly --new-tokens long), driving the real building blocks
   (builtin engine `generate`, `build_batch`, `grpo_advantages`, `actor_update`) with a
   random reward; phases timed by `PhaseTimer` with device synchronisation at boundaries.
d. b and c on the tiny model's layout (`--random --size tiny`: same shapes as `model: tiny`
   without its minute of CPU SFT; weights do not change step time when EOS is ignored).

`--dry-run`: the random tiny model on CPU in float32 with one thread, C in (1, 4, 8, 16),
B in (16, 32), 8 new tokens; well under a minute. Writes `gpu_check.json`, `gpu_check.md` and
`gpu_tests.log` under --out (default $OUT, else ./out/gpu-check).
Usage: python bench/gpu_check.py [--dry-run] [--out DIR] [--budget-s 450] [--skip-tests]
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import json
import math
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCHEMA = 1
PAPER_DECODE_GAIN = 2.29  # arXiv 2608.29296: decode throughput from larger decode batches
NOMINAL_HBM = {"H200": 4.8e12, "H100": 3.35e12, "A100": 2.0e12}  # vendor bytes/s
LONG_CONTEXT = 4096  # tokens per sequence for the second KV-memory limit

FULL = {
    "device": "cuda", "dtype": "bfloat16", "main_size": "0.5b",
    "concurrency": (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024), "prompt_tokens": 16,
    "decode_new_tokens": 128, "decode_reps": 2,
    "batches": (64, 128, 256, 512, 1024), "group": 8, "step_new_tokens": 256, "micro": 64,
    "warmup_steps": 1, "timed_steps": 2,
    "gemm_sizes": (4096, 8192), "bandwidth_bytes": 2 * 2 ** 30, "threads": None,
    "budgets": {"gpu_tests": 100, "decode_main": 140, "grpo_main": 150, "decode_tiny": 25,
             "grpo_tiny": 30},
    "total_budget": 450, "test_paths": ("tests",),
}
DRY = {
    "device": "cpu", "dtype": "float32", "main_size": "tiny",
    "concurrency": (1, 4, 8, 16), "prompt_tokens": 8, "decode_new_tokens": 8, "decode_reps": 1,
    "batches": (16, 32), "group": 4, "step_new_tokens": 8, "micro": 16, "warmup_steps": 1,
    "timed_steps": 1,
    "gemm_sizes": (256,), "bandwidth_bytes": 16 * 2 ** 20, "threads": 1,
    "budgets": {"gpu_tests": 40, "decode_main": 20, "grpo_main": 20, "decode_tiny": 20,
             "grpo_tiny": 20},
    "total_budget": 100, "test_paths": ("tests/test_gpu_check.py",),
}


# ---------------------------------------------------------------- helpers
class Clock:
    """The overall deadline and each stage's own budget (seconds from now)."""

    def __init__(self, total_s: float):
        self.start = time.perf_counter()
        self.deadline = self.start + total_s

    def stage(self, budget_s: float) -> float:
        """Absolute end time of a stage with `budget_s`, never past the deadline."""
        return min(time.perf_counter() + budget_s, self.deadline)

    def elapsed(self) -> float:
        return time.perf_counter() - self.start


def _sync(device: str):
    from rlbatch.core.timers import cuda_sync_or_none

    return cuda_sync_or_none(device) or (lambda: None)


def _free_device() -> None:
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def environment(device: str) -> dict:
    import torch
    import transformers

    env = {"python": platform.python_version(), "machine": platform.machine(),
           "torch": torch.__version__, "transformers": transformers.__version__,
           "cuda_available": torch.cuda.is_available(), "torch_cuda": torch.version.cuda,
           "device": device, "cpu_threads": torch.get_num_threads()}
    try:
        import pydantic

        env["pydantic"] = pydantic.VERSION
    except ImportError:
        env["pydantic"] = None
    if device.startswith("cuda"):
        props = torch.cuda.get_device_properties(torch.device(device))
        env.update({"gpu": props.name, "gpu_memory_bytes": int(props.total_memory),
                    "gpu_multiprocessors": props.multi_processor_count})
    return env


def nominal_hbm(env: dict) -> float | None:
    name = env.get("gpu") or ""
    return next((v for k, v in NOMINAL_HBM.items() if k in name), None)


# ---------------------------------------------------------------- stage a: GPU tests
def run_gpu_tests(paths: tuple[str, ...], timeout_s: float, out: Path) -> dict:
    cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "-rfEs", "-p", "no:cacheprovider",
           *paths]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "src"),
                                                      env.get("PYTHONPATH")]))
    t0 = time.perf_counter()
    log = out / "gpu_tests.log"
    try:
        proc = subprocess.run(cmd, check=False, cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=max(5.0, timeout_s))
        text, rc, status = proc.stdout + proc.stderr, proc.returncode, None
    except subprocess.TimeoutExpired as exc:
        text = (exc.stdout or b"").decode(errors="replace") if isinstance(exc.stdout, bytes) \
            else (exc.stdout or "")
        rc, status = None, "timeout"
    log.write_text(f"$ {' '.join(cmd)}\n{text}")
    counts = {k: int(n) for n, k in re.findall(
        r"(\d+) (passed|failed|skipped|deselected|errors?|xfailed|xpassed)", text)}
    if status is None:  # pytest: 0 all passed, 5 none selected (only deselected/skipped)
        status = "passed" if rc in (0, 5) and not counts.get("failed") else "failed"
    summary = next((ln.strip("= ") for ln in reversed(text.splitlines())
                    if re.search(r"\d+ (passed|failed|skipped|deselected)", ln)), "")
    failed = [ln.strip() for ln in text.splitlines() if ln.startswith(("FAILED ", "ERROR "))]
    return {"status": status, "returncode": rc, "command": " ".join(cmd), "counts": counts,
            "summary": summary, "failed": failed[:20], "seconds": time.perf_counter() - t0,
            "log": log.name}


# ---------------------------------------------------------------- models
def build_model(size: str, dtype: str) -> tuple[Path, dict]:
    from rlbatch.rollout.random_model import SIZES, random_model_path
    from rlbatch.rollout.tiny_model import read_build_facts

    path, cached = random_model_path(size, SIZES[size], dtype=dtype)
    facts = read_build_facts(path)
    return path, {"size": size, "path": str(path), "cached": cached, "layout": facts["layout"],
                  "parameters": facts["parameters"], "saved_dtype": facts["dtype"],
                  "build_s": facts["build_s"]}


def load(path: Path, device: str, dtype: str):
    from rlbatch.rollout.models import load_model_and_tokenizer

    model, tok = load_model_and_tokenizer(path, device, dtype)
    return model.eval(), tok


def vocab_ids(model, tok):
    import torch

    special = set(getattr(tok, "all_special_ids", []) or [])
    ids = [i for i in range(model.config.vocab_size) if i not in special]
    return torch.tensor(ids or list(range(model.config.vocab_size)))


# ---------------------------------------------------------------- stage b/d: decode sweep
def decode_stage(path: Path, p: dict, end: float, env: dict) -> dict:
    import torch

    from rlbatch.rollout.decode_bench import (
        BenchSpec,
        ModelShape,
        bandwidth_probe,
        default_memory_budget,
        gemm_flops_probe,
        make_bench_engine,
        max_concurrency_in_budget,
        plateau_concurrency,
        sweep_concurrency,
    )

    device = p["device"]
    t0 = time.perf_counter()
    model, tok = load(path, device, p["dtype"])
    load_s = time.perf_counter() - t0
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    engine = make_bench_engine("builtin", model, int(pad))  # EOS disabled
    shape = ModelShape.from_model(model)
    dtype = next(model.parameters()).dtype
    probes = {"gemm_flops": gemm_flops_probe(device, dtype, sizes=tuple(p["gemm_sizes"])),
              "bandwidth_bytes_per_s": bandwidth_probe(device, nbytes=p["bandwidth_bytes"])}
    probes["ridge_intensity"] = probes["gemm_flops"] / probes["bandwidth_bytes_per_s"]
    budget = default_memory_budget(device)
    ids = vocab_ids(model, tok)
    engine_gen = torch.Generator(device=device).manual_seed(0)
    ctx = p["prompt_tokens"] + p["decode_new_tokens"] / 2
    nominal = nominal_hbm(env)
    rows, stopped_by, last_s = [], "completed", 0.0
    for c in p["concurrency"]:
        if time.perf_counter() + 1.5 * last_s > end:
            stopped_by = "time_budget"
            break
        spec = BenchSpec(concurrency=(c,), prompt_tokens=p["prompt_tokens"],
                         new_tokens=p["decode_new_tokens"], reps=p["decode_reps"],
                         memory_budget_bytes=budget, min_sequences=1)
        tc = time.perf_counter()
        res = sweep_concurrency(engine, shape, ids, spec, probes, engine_generator=engine_gen)
        last_s = time.perf_counter() - tc
        if res["stopped_by"] != "completed":
            stopped_by = res["stopped_by"]
            break
        row = res["rows"][0]
        steps_per_s = row["tokens_per_s"] / c  # one decode step emits one token per sequence
        hbm = steps_per_s * shape.bytes_per_step(c, ctx)  # bytes/s the step's model moves
        row.update({"step_ms": 1e3 / steps_per_s, "seconds": last_s,
                    "hbm_bytes_per_s": hbm,
                    "hbm_fraction_of_copy": hbm / probes["bandwidth_bytes_per_s"],
                    "hbm_fraction_of_nominal": hbm / nominal if nominal else None,
                    "bandwidth_floor_ms": 1e3 * shape.bytes_per_step(c, ctx)
                    / probes["bandwidth_bytes_per_s"]})
        rows.append(row)
        print(f"  decode C={c}: {row['tokens_per_s']:,.0f} tokens/s, step "
              f"{row['step_ms']:.2f} ms, HBM {100 * row['hbm_fraction_of_copy']:.1f}% of copy",
              flush=True)
    kv_seq = shape.kv_bytes_per_sequence(p["prompt_tokens"] + p["decode_new_tokens"])
    by_c = {r["concurrency"]: r for r in rows}
    plateau = plateau_concurrency(rows)
    best = max((r["tokens_per_s"] for r in rows), default=None)
    at8 = by_c.get(8, {}).get("tokens_per_s")
    result = {
        "status": "ok" if stopped_by in ("completed", "memory_budget") else stopped_by,
        "dtype": str(dtype).removeprefix("torch."), "device": device,
        "prompt_tokens": p["prompt_tokens"], "new_tokens": p["decode_new_tokens"],
        "reps": p["decode_reps"], "load_s": load_s, "weight_bytes": shape.weight_bytes,
        "probes": probes, "nominal_hbm_bytes_per_s": nominal, "rows": rows,
        "stopped_by": stopped_by, "plateau_concurrency": plateau, "best_tokens_per_s": best,
        "gain_c8_to_plateau": (by_c[plateau]["tokens_per_s"] / at8
                               if at8 and plateau in by_c else None),
        "gain_c8_to_best": best / at8 if at8 and best else None,
        "paper_gain": PAPER_DECODE_GAIN,
        "hbm_fraction_small_c": {str(c): by_c[c]["hbm_fraction_of_copy"]
                                 for c in (1, 8) if c in by_c},
        "kv": {"bytes_per_token": shape.kv_bytes_per_token(),
               "bytes_per_sequence": kv_seq, "memory_budget_bytes": budget,
               "max_concurrency_at_bench_length": max_concurrency_in_budget(
                   budget, shape.weight_bytes, kv_seq),
               "max_concurrency_at_4096_tokens": max_concurrency_in_budget(
                   budget, shape.weight_bytes, shape.kv_bytes_per_sequence(LONG_CONTEXT))},
    }
    del engine, model
    _free_device()
    return result


# ---------------------------------------------------------------- stage c/d: GRPO steps
def _grpo_step(engine, model, opt, timer, B, p, ids, cpu_gen, dev_gen, pad):
    import torch

    from rlbatch.algos.advantages import grpo_advantages
    from rlbatch.backends.builtin.batch import build_batch, to_device
    from rlbatch.backends.builtin.update import actor_update
    from rlbatch.rollout.decode_bench import random_prompts
    from rlbatch.rollout.engine import SamplingParams

    device, G = p["device"], p["group"]
    params = SamplingParams(max_new_tokens=p["step_new_tokens"], temperature=1.0)
    t0 = time.perf_counter()
    with timer.phase("rollout"):
        prompts = random_prompts(B // G, p["prompt_tokens"], ids, cpu_gen)
        ro = engine.generate([q for q in prompts for _ in range(G)], params, B,
                             generator=dev_gen)
    with timer.phase("other"):
        rewards = torch.rand(B, generator=cpu_gen)  # synthetic reward
        batch = to_device(build_batch(ro, pad), device)
        old_logp = ro.logprobs.to(device)
        adv, _ = grpo_advantages(rewards, G)
        adv = adv.to(device)
    with timer.phase("actor_update"):
        res = actor_update(model, opt, batch, old_logp, adv, None, temperature=1.0,
                           clip_low=0.2, clip_high=0.2, kl_coef=0.0, minibatches=1, epochs=1,
                           micro=min(p["micro"], B), max_grad_norm=1.0, generator=cpu_gen,
                           noise=None)
    times, _ = timer.end_step()
    wall = time.perf_counter() - t0
    return {"step_s": wall, "rollout_s": times.get("rollout", 0.0),
            "actor_update_s": times.get("actor_update", 0.0),
            "other_s": times.get("other", 0.0),
            "untimed_s": max(0.0, wall - sum(times.values())),
            "tokens": ro.tokens, "loss": res.stats.get("actor/loss"),
            "grad_norm": res.stats.get("actor/grad_norm"), "skipped": res.skipped}


def grpo_stage(path: Path, p: dict, end: float) -> dict:
    import torch

    from rlbatch.core.timers import PhaseTimer, cuda_sync_or_none
    from rlbatch.rollout.builtin_engine import BuiltinEngine

    device = p["device"]
    model, tok = load(path, device, p["dtype"])
    pad = int(tok.pad_token_id if tok.pad_token_id is not None else 0)
    engine = BuiltinEngine(model, [], pad)  # EOS ignored: every response has step_new_tokens
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    timer = PhaseTimer(sync=cuda_sync_or_none(device))
    cpu_gen = torch.Generator().manual_seed(0)
    dev_gen = torch.Generator(device=device).manual_seed(0)
    ids = vocab_ids(model, tok)
    cuda = device.startswith("cuda")
    rows, status, last = [], "ok", None
    for B in p["batches"]:
        n_steps = p["warmup_steps"] + p["timed_steps"]
        if last is not None:
            predicted = last["step_s"] * B / last["batch"] * n_steps
            if time.perf_counter() + predicted > end:
                status = "time_budget"
                break
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        steps = []
        try:
            for i in range(n_steps):
                s = _grpo_step(engine, model, opt, timer, B, p, ids, cpu_gen, dev_gen, pad)
                s["warmup"] = i < p["warmup_steps"]
                steps.append(s)
                if not s["warmup"] and time.perf_counter() > end:
                    break
        except RuntimeError as exc:
            from rlbatch.rollout.decode_bench import is_out_of_memory

            if not is_out_of_memory(exc):
                raise
            opt.zero_grad(set_to_none=True)
            _free_device()
            status = "out_of_memory"
            rows.append({"batch": B, "status": "out_of_memory"})
            break
        timed = [s for s in steps if not s["warmup"]] or steps
        med = {k: statistics.median(s[k] for s in timed)
               for k in ("step_s", "rollout_s", "actor_update_s", "other_s", "untimed_s")}
        row = {"batch": B, "prompts": B // p["group"], "group": p["group"], "status": "ok",
               "timed_steps": len(timed), **med,
               "samples_per_s": B / med["step_s"],
               "rollout_tokens_per_s": timed[0]["tokens"] / med["rollout_s"],
               "rollout_fraction": med["rollout_s"] / med["step_s"],
               "peak_memory_bytes": int(torch.cuda.max_memory_allocated()) if cuda else None,
               "loss": timed[-1]["loss"], "skipped": sum(s["skipped"] for s in steps),
               "steps": steps}
        rows.append(row)
        last = row
        print(f"  GRPO B={B}: step {med['step_s']:.2f} s (rollout {med['rollout_s']:.2f}, "
              f"actor update {med['actor_update_s']:.2f}, other {med['other_s']:.3f})",
              flush=True)
        if time.perf_counter() > end:
            status = "time_budget" if B != p["batches"][-1] else status
            break
    del engine, model, opt
    _free_device()
    return {"status": status, "device": device, "dtype": p["dtype"], "group": p["group"],
            "prompt_tokens": p["prompt_tokens"], "new_tokens": p["step_new_tokens"],
            "micro_batch": p["micro"], "warmup_steps": p["warmup_steps"],
            "optimizer": "AdamW lr 1e-6, one update per step, no KL, max_grad_norm 1.0",
            "rows": rows}


# ---------------------------------------------------------------- report
def _fmt(x, spec=",.0f", none="-"):
    return none if x is None or (isinstance(x, float) and not math.isfinite(x)) \
        else format(x, spec)


def markdown(result: dict) -> str:
    env = result["environment"]
    lines = [f"# GPU check{' (dry run)' if result['dry_run'] else ''}", "",
             (f"- {result['started']}; {env.get('gpu') or env['device']}, torch {env['torch']} "
             f"(CUDA {env.get('torch_cuda')}), transformers {env['transformers']}, "
             f"Python {env['python']}; total {result.get('total_s', 0):.0f} s")]
    st = result["stages"]
    t = st.get("gpu_tests")
    if t:
        lines.append(f"- GPU tests (`pytest -m gpu`): {t['status']}, {t.get('summary', '')} "
                     f"({t.get('seconds', 0):.0f} s)")
        lines += [f"  - {ln}" for ln in t.get("failed", [])]
    for key, title in (("decode_main", "Decode vs C"), ("decode_tiny", "Decode vs C")):
        d = st.get(key)
        if not d or "rows" not in d:
            if d:
                lines.append(f"- {key}: {d.get('status')}: {d.get('error', '')}")
            continue
        m = d.get("model", {})
        lines += ["", (f"## {title}: {m.get('size')} model ({_fmt(m.get('parameters'))} "
                  f"parameters, {d['dtype']}, prompt {d['prompt_tokens']} + "
                  f"{d['new_tokens']} new tokens)"), "",
                  "| C | tokens/s | step ms | HBM % of copy | HBM % of nominal | KV MiB |",
                  "|---:|---:|---:|---:|---:|---:|"]
        for r in d["rows"]:
            nom = r.get("hbm_fraction_of_nominal")
            lines.append(f"| {r['concurrency']} | {_fmt(r['tokens_per_s'])} | "
                         f"{r['step_ms']:.2f} | {100 * r['hbm_fraction_of_copy']:.1f} | "
                         f"{_fmt(None if nom is None else 100 * nom, '.1f')} | "
                         f"{r['kv_bytes'] / 2 ** 20:.1f} |")
        kv = d["kv"]
        lines += ["", (f"- plateau C = {d['plateau_concurrency']} "
                  f"(best {_fmt(d['best_tokens_per_s'])} tokens/s; stopped by {d['stopped_by']});"
                  f" gain C = 8 -> plateau: "
                  f"{_fmt(d['gain_c8_to_plateau'], '.2f', 'n/a (C = 8 not measured) ')}x "
                  f"(paper: up to {PAPER_DECODE_GAIN}x)"),
                  (f"- probes: copy bandwidth {d['probes']['bandwidth_bytes_per_s'] / 1e9:,.0f} "
                  f"GB/s, GEMM {d['probes']['gemm_flops'] / 1e12:,.1f} TFLOP/s"),
                  (f"- KV cache {_fmt(kv['bytes_per_token'])} B/token; memory limit: "
                  f"C <= {_fmt(kv['max_concurrency_at_bench_length'])} at "
                  f"{d['prompt_tokens'] + d['new_tokens']} tokens, "
                  f"C <= {_fmt(kv['max_concurrency_at_4096_tokens'])} at {LONG_CONTEXT} tokens")]
    for key in ("grpo_main", "grpo_tiny"):
        g = st.get(key)
        if not g or "rows" not in g:
            if g:
                lines.append(f"- {key}: {g.get('status')}: {g.get('error', '')}")
            continue
        m = g.get("model", {})
        lines += ["", (f"## GRPO step: {m.get('size')} model ({g['dtype']}, G = {g['group']}, "
                  f"{g['new_tokens']} new tokens, micro-batch {g['micro_batch']}; "
                  f"{g['status']})"), "",
                  ("| B | step s | rollout s | actor update s | other s | samples/s | "
                  "rollout tokens/s | peak GiB |"), "|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for r in g["rows"]:
            if r.get("status") != "ok":
                lines.append(f"| {r['batch']} | {r.get('status')} | | | | | | |")
                continue
            peak = r["peak_memory_bytes"]
            lines.append(f"| {r['batch']} | {r['step_s']:.2f} | {r['rollout_s']:.2f} | "
                         f"{r['actor_update_s']:.2f} | {r['other_s']:.3f} | "
                         f"{_fmt(r['samples_per_s'], ',.1f')} | "
                         f"{_fmt(r['rollout_tokens_per_s'])} | "
                         f"{_fmt(None if peak is None else peak / 2 ** 30, '.1f')} |")
    return "\n".join(lines) + "\n"


def write(result: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_check.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    (out / "gpu_check.md").write_text(markdown(result))


# ---------------------------------------------------------------- main
def run_stage(result: dict, name: str, fn, out: Path) -> None:
    t0 = time.perf_counter()
    print(f"[gpu-check] {name} ...", flush=True)
    try:
        res = fn()
    except Exception as exc:  # noqa: BLE001 - a failed stage is recorded, the rest still run
        res = {"status": "error", "error": f"{type(exc).__name__}: {exc}",
               "traceback": traceback.format_exc(limit=8)}
        print(res["traceback"], file=sys.stderr, flush=True)
        _free_device()
    res["seconds"] = time.perf_counter() - t0
    result["stages"][name] = res
    result["total_s"] = time.perf_counter() - result["_t0"]
    print(f"[gpu-check] {name}: {res['status']} in {res['seconds']:.1f} s", flush=True)
    write({k: v for k, v in result.items() if not k.startswith("_")}, out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true", help="tiny model, CPU, float32, seconds")
    ap.add_argument("--out", default=os.environ.get("OUT") or "out/gpu-check")
    ap.add_argument("--budget-s", type=float, default=None, help="overall deadline (s)")
    ap.add_argument("--skip-tests", action="store_true", help="skip stage a (pytest -m gpu)")
    ap.add_argument("--device", default=None, help="override: cpu | cuda[:i]")
    args = ap.parse_args(argv)
    p = dict(DRY if args.dry_run else FULL)
    if args.device:
        p["device"] = args.device
    if args.budget_s:
        p["total_budget"] = args.budget_s
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("RLBATCH_CACHE", str(Path(tempfile.gettempdir())
                                               / "rlbatch-gpu-check-cache"))
    import torch

    if p["threads"]:  # the dry run: one thread, so a busy shared CPU does not thrash
        torch.set_num_threads(p["threads"])
    if p["device"].startswith("cuda") and not torch.cuda.is_available():
        print("error: no CUDA device; use --dry-run (CPU) or --device cpu", file=sys.stderr)
        return 2
    clock = Clock(p["total_budget"])
    result = {"schema": SCHEMA, "dry_run": args.dry_run,
              "started": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
              "environment": environment(p["device"]), "budget_s": p["total_budget"],
              "settings": {k: v for k, v in p.items() if k != "budgets"},
              "stage_budgets_s": p["budgets"], "stages": {}, "_t0": clock.start}
    b = p["budgets"]
    if args.skip_tests:
        result["stages"]["gpu_tests"] = {"status": "skipped", "summary": "--skip-tests"}
    else:
        run_stage(result, "gpu_tests", lambda: run_gpu_tests(
            p["test_paths"], clock.stage(b["gpu_tests"]) - time.perf_counter(), out), out)
    models: dict[str, tuple[Path, dict]] = {}

    def model(size: str) -> tuple[Path, dict]:
        if size not in models:
            models[size] = build_model(size, p["dtype"])
        return models[size]

    def with_model(size, fn):
        def go():
            path, facts = model(size)
            res = fn(path)
            res["model"] = facts
            return res
        return go

    main_size = p["main_size"]
    run_stage(result, "decode_main", with_model(main_size, lambda path: decode_stage(
        path, p, clock.stage(b["decode_main"]), result["environment"])), out)
    run_stage(result, "grpo_main", with_model(main_size, lambda path: grpo_stage(
        path, p, clock.stage(b["grpo_main"]))), out)
    run_stage(result, "decode_tiny", with_model("tiny", lambda path: decode_stage(
        path, p, clock.stage(b["decode_tiny"]), result["environment"])), out)
    run_stage(result, "grpo_tiny", with_model("tiny", lambda path: grpo_stage(
        path, p, clock.stage(b["grpo_tiny"]))), out)
    final = {k: v for k, v in result.items() if not k.startswith("_")}
    final["total_s"] = clock.elapsed()
    write(final, out)
    print(markdown(final), flush=True)
    print(f"[gpu-check] wrote {out / 'gpu_check.json'} and {out / 'gpu_check.md'} "
          f"in {final['total_s']:.0f} s", flush=True)
    failed = [k for k, v in final["stages"].items() if v.get("status") == "error"]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
