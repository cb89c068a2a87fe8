"""`rlbatch decode-bench`: decode throughput, latency, KV memory and roofline against C.

Thin: parse -> `rollout.decode_bench.run_decode_bench` -> rich table (or, with --json, one
JSON document as the last stdout line). The progress bar goes to stderr.
"""

from __future__ import annotations

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from rlbatch.cli.common import print_json, whole_numbers
from rlbatch.core.errors import ConfigError

GIB = 2 ** 30


def decode_bench(
    model: str = typer.Option("tiny", help="'tiny' (built-in model) or a local HF checkpoint folder"),
    concurrency: str = typer.Option("1,2,4,8,16,32,64,128,256,512",
                                    help="comma-separated generation concurrency values C"),
    prompt_tokens: int = typer.Option(9, help="tokens per random prompt"),
    new_tokens: int = typer.Option(32, help="tokens generated per sequence (EOS disabled)"),
    engine: str = typer.Option("builtin", help="builtin | hf"),
    memory_budget: float | None = typer.Option(
        None, help="GiB for weights + KV cache (default: device memory, or RAM on CPU)"),
    latency_cap_s: float | None = typer.Option(
        None, help="stop after the first C whose per-sequence latency exceeds this"),
    reps: int = typer.Option(3, help="timed repetitions per C (median), after one warm-up"),
    min_sequences: int = typer.Option(
        64, help="sequences per C: the smallest multiple of C that is >= this"),
    device: str = typer.Option("auto", help="auto | cpu | cuda[:i]"),
    dtype: str = typer.Option("auto", help="weights and KV cache: auto (as from_pretrained "
                              "loads the checkpoint) | float32 | bfloat16"),
    threads: int | None = typer.Option(None, help="torch intra-op threads (default: torch's)"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON document"),
) -> None:
    """Sweep decode concurrency C: tokens/s, per-sequence latency, KV bytes, roofline fraction,
    the throughput plateau, and which limit (memory, OOM, latency) ended the sweep."""
    from rlbatch.rollout.decode_bench import BenchSpec, run_decode_bench

    if memory_budget is not None and memory_budget <= 0:
        raise ConfigError("--memory-budget: must be positive (GiB)")
    budget = None if memory_budget is None else max(1, int(memory_budget * GIB))
    values = whole_numbers(concurrency, "--concurrency")
    if values != sorted(set(values)):
        raise ConfigError("--concurrency: values must be increasing and distinct")
    spec = BenchSpec(concurrency=tuple(values),
                     prompt_tokens=prompt_tokens, new_tokens=new_tokens, reps=reps,
                     memory_budget_bytes=budget, latency_cap_s=latency_cap_s,
                     min_sequences=min_sequences)
    err = Console(stderr=True)
    with Progress(TextColumn("decode-bench C={task.fields[c]}"), BarColumn(),
                  MofNCompleteColumn(), TimeElapsedColumn(), console=err,
                  transient=True) as bar:
        task = bar.add_task("sweep", total=len(spec.concurrency), c=spec.concurrency[0])

        def progress(c: int, row: dict) -> None:
            nxt = [x for x in spec.concurrency if x > c]
            bar.update(task, advance=1, c=nxt[0] if nxt else c)

        result = run_decode_bench(model, engine, spec, device=device, threads=threads,
                                  progress=progress, dtype=None if dtype == "auto" else dtype)
    if as_json:
        print_json(result)
        return
    Console().print(render_table(result))
    for line in summary_lines(result):
        print(line)


def render_table(result: dict) -> Table:
    table = Table(title=f"decode-bench: {result['model']} ({result['engine']} engine, "
                        f"{result['device']}, {result['dtype']}), prompt "
                        f"{result['prompt_tokens']} + {result['new_tokens']} new tokens")
    # short headers and cells, so that the table fits 80 columns; the caption spells them out
    for name in ("C", "seqs", "tok/s", "lat s", "KV MiB", "FLOP/B", "bound", "GFLOP/s",
                 "roof %"):
        table.add_column(name, justify="right")
    for r in result["rows"]:
        mark = "" if r["within_latency_cap"] else " (over cap)"
        table.add_row(str(r["concurrency"]), str(r["sequences"]), f"{r['tokens_per_s']:,.0f}",
                      f"{r['latency_s']:.3f}{mark}", f"{r['kv_bytes'] / 2 ** 20:.2f}",
                      f"{r['arithmetic_intensity']:.2f}",
                      {"compute": "comp", "memory": "mem"}.get(r["bound_by"], r["bound_by"]),
                      f"{r['achieved_flops'] / 1e9:.2f}", f"{100 * r['roofline_fraction']:.1f}")
    table.caption = ("tok/s = generated tokens per second; lat s = C x new tokens / tok/s "
                     "(Little's law); FLOP/B = decode-step intensity; bound: mem(ory) or "
                     "comp(ute); roof % = achieved / min(GEMM peak, FLOP/B x bandwidth)")
    return table


def summary_lines(result: dict) -> list[str]:
    p = result["probes"]
    budget = result["memory_budget_bytes"]
    cmax = result["max_concurrency_in_budget"]
    best = result["best_tokens_per_s"]
    if not best:
        plateau = "plateau: none (no C measured)"
    elif result.get("plateau_reached", True):
        plateau = (f"plateau: C = {result['plateau_concurrency']} (smallest C within 5% of the "
                   f"best, {best:,.0f} tokens/s)")
    else:
        plateau = (f"plateau: not reached: still rising at C = {result['plateau_concurrency']}, "
                   f"the largest C tried ({best:,.0f} tokens/s)")
    return [
        plateau,
        f"stopped_by: {result['stopped_by']}",
        f"KV cache: {result['kv_bytes_per_sequence']:,} bytes per sequence; budget "
        + (f"{budget / GIB:.2f} GiB -> at most C = {cmax:,}" if budget else "unknown"),
        (f"probes: GEMM {p['gemm_flops'] / 1e9:.1f} GFLOP/s, copy bandwidth "
         f"{p['bandwidth_bytes_per_s'] / 1e9:.1f} GB/s, ridge {p['ridge_intensity']:.1f} FLOP/byte"),
    ]


def register(app: typer.Typer) -> None:
    app.command("decode-bench")(decode_bench)
