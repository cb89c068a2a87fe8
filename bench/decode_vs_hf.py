"""Built-in decode engine against `transformers` generate on the tiny model.

Both engines decode the same random prompts for exactly --new-tokens tokens (EOS ignored) at
each concurrency C; repetitions alternate between engines and the median is reported, so
machine noise hits both alike. Prints a table and one JSON line.
Usage: python bench/decode_vs_hf.py [--concurrency 8,16,32,64,128,256] [--reps 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from rlbatch.rollout.builtin_engine import BuiltinEngine
from rlbatch.rollout.engine import SamplingParams
from rlbatch.rollout.hf_engine import HFEngine
from rlbatch.rollout.models import load_model_and_tokenizer
from rlbatch.rollout.tiny_model import recipe_for, tiny_model_path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--concurrency", default="8,16,32,64,128,256")
    ap.add_argument("--prompt-tokens", type=int, default=9)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    model, tok = load_model_and_tokenizer(tiny_model_path(recipe_for("addition", 3)))
    model.eval()
    gen = torch.Generator().manual_seed(0)
    params = SamplingParams(max_new_tokens=args.new_tokens, temperature=1.0)
    engines = {"builtin": BuiltinEngine(model, [], 0), "hf": HFEngine(model, [], 0)}
    rows = []
    print(f"{'C':>5} {'builtin tok/s':>14} {'hf tok/s':>10} {'ratio':>7}")
    for c in [int(x) for x in args.concurrency.split(",")]:
        n = max(c, 64)
        prompts = [[1] + torch.randint(4, len(tok), (args.prompt_tokens - 1,), generator=gen).tolist()
                   for _ in range(n)]
        times: dict[str, list[float]] = {k: [] for k in engines}
        for rep in range(args.reps + 1):
            for name, eng in engines.items():
                t0 = time.perf_counter()
                out = eng.generate(prompts, params, c, generator=gen)
                if rep:  # first repetition is warm-up
                    times[name].append(out.tokens / (time.perf_counter() - t0))
        b, h = statistics.median(times["builtin"]), statistics.median(times["hf"])
        rows.append({"concurrency": c, "builtin_tokens_per_s": b, "hf_tokens_per_s": h,
                     "ratio": b / h})
        print(f"{c:>5} {b:>14.0f} {h:>10.0f} {b / h:>7.2f}", flush=True)
    print(json.dumps({"bench": "decode_vs_hf", "threads": torch.get_num_threads(),
                      "new_tokens": args.new_tokens, "reps": args.reps, "rows": rows}))


if __name__ == "__main__":
    main()
