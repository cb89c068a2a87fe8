"""Peak memory of `rlbatch ingest verl` against the length of the log.

Writes verl file-logger logs of each requested length (one JSON line per training step, the
keys verl 0.9 logs for a GRPO step, about 1.5 kB a line, a validation every 10 steps),
runs `rlbatch ingest verl` on each in a fresh process, and reports that process's peak
resident memory (`ru_maxrss` from wait4), its wall time, and the bytes it read. Memory that
stays flat as the log grows is what streaming buys; the issue's bound is 1 GB at 1M lines.

    python bench/ingest_memory.py                  # 10k, 100k and 1M lines
    python bench/ingest_memory.py --lines 20000    # one size

Prints a table and one JSON line. Needs about 5 GB of free space in --dir at 1M lines
(the log, the converter's spool and the written run); all of it is removed afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

KEYS = ["actor/pg_loss", "actor/pg_clipfrac", "actor/ppo_kl", "actor/entropy", "actor/grad_norm",
        "critic/score/max", "critic/score/min", "critic/rewards/mean", "critic/rewards/max",
        "critic/advantages/mean", "critic/advantages/max", "critic/advantages/min",
        "critic/returns/mean", "response_length/max", "response_length/min",
        "response_length/clip_ratio", "prompt_length/mean", "prompt_length/max",
        "timing_s/reward", "timing_s/old_log_prob", "timing_s/ref", "timing_s/adv",
        "timing_per_token_ms/gen", "timing_per_token_ms/update_actor", "perf/mfu/actor",
        "perf/max_memory_allocated_gb", "perf/cpu_memory_used_gb"]


def write_log(path: Path, lines: int, seed: int = 0) -> int:
    rng = random.Random(seed)
    with open(path, "w") as fh:
        fh.write(json.dumps({"step": 0, "data": {"val-core/gsm8k/reward/mean@1": 0.2}}) + "\n")
        for step in range(1, lines):
            data = {"training/global_step": step, "training/epoch": step // 1000,
                    "actor/lr": 1e-6, "critic/score/mean": rng.random(),
                    "response_length/mean": 100 + 50 * rng.random(),
                    "timing_s/gen": 6 + rng.random(), "timing_s/update_actor": 2 + rng.random(),
                    "timing_s/step": 10 + rng.random(), "perf/total_num_tokens": 1280 + step,
                    "perf/throughput": 128.0 + rng.random()}
            data.update((k, rng.random()) for k in KEYS)
            if step % 10 == 0:
                data["val-core/gsm8k/reward/mean@1"] = rng.random()
                data["timing_s/testing"] = 1.5
            fh.write(json.dumps({"step": step, "data": data}) + "\n")
    return path.stat().st_size


def ingest(log: Path, out: Path) -> dict:
    cmd = [sys.executable, "-m", "rlbatch.cli.main", "ingest", "verl", str(log), "--out",
           str(out), "--prompts-per-step", "64", "--samples-per-prompt", "8", "--lr", "1e-6",
           "--json"]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    out_text, err_text = proc.stdout.read().decode(), proc.stderr.read().decode()
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        raise SystemExit(f"ingest failed ({code}): {err_text.strip()[-500:]}")
    summary = json.loads(out_text.strip().splitlines()[-1])
    return {"peak_rss_mb": usage.ru_maxrss / 1024, "wall_s": wall,
            "step_rows": summary["ingest"]["step_rows"], "eval_rows": summary["ingest"]["eval_rows"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", default="10000,100000,1000000",
                    help="comma-separated log lengths (default: %(default)s)")
    ap.add_argument("--dir", default=None, help="scratch directory (default: a new temp dir)")
    args = ap.parse_args()
    sizes = [int(x) for x in args.lines.split(",")]
    scratch = Path(tempfile.mkdtemp(prefix="rlbatch-ingest-", dir=args.dir))
    results = []
    try:
        print(f"{'lines':>9} {'log MB':>8} {'peak RSS MB':>12} {'wall s':>8} {'us/line':>8}")
        for n in sizes:
            log = scratch / f"verl-{n}.jsonl"
            size = write_log(log, n)
            r = ingest(log, scratch / f"run-{n}")
            r.update(lines=n, log_mb=size / 2 ** 20, us_per_line=1e6 * r["wall_s"] / n)
            results.append(r)
            print(f"{n:>9} {r['log_mb']:>8.0f} {r['peak_rss_mb']:>12.0f} {r['wall_s']:>8.1f} "
                  f"{r['us_per_line']:>8.0f}", flush=True)
            log.unlink()
            shutil.rmtree(scratch / f"run-{n}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(json.dumps({"bench": "ingest_memory", "results": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
