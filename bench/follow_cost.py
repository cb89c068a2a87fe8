"""What following a command's log costs (`backend: command`): CPU per logged row, and the
latency from a row written to the profile's early-stop check.

Each case runs the real path of a profile trial: `rlbatch profile`'s `Driver` on a
`LocalExecutor`, which starts the trial's `rlbatch train`, which starts the command and follows
its log. The command is this script in `write` mode, a stand-in that trains nothing and
writes rows in a framework's format: verl's file logger (JSON lines of about 1.5 kB, the keys
verl logs for a GRPO step) or TRL's TensorBoard events (about 40 scalars a step, written
with torch's SummaryWriter as transformers does). It first writes `--prewrite` rows at once
(a log that long already), then `--rows` more at `--rate` rows per second, noting when it
wrote each. The early-stop check is the driver's stopper, called for each running trial every
`poll_s` (0.5 s, the profile's default); it notes when it first sees each row.

    python bench/follow_cost.py                   # verl and TRL formats, 100 / 1,000 / 4,000
    python bench/follow_cost.py --formats verl --lengths 1000

Reports, per case: reads of the log (conversions), the follower's CPU seconds (its own
`process_time`, from summary.json), CPU per logged row, the CPU of one read at the log's
final length, and the latency of the timed rows (median and 90th percentile). Prints a table
and one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

from ingest_memory import KEYS  # the keys verl logs for a GRPO step (bench/ingest_memory.py)

P, G = 4, 8


# ---------------------------------------------------------------- the stand-in command
def write(args) -> int:
    rng = random.Random(0)
    times = open(args.times, "a")  # noqa: SIM115
    if args.format == "verl":
        log = open(os.environ["VERL_FILE_LOGGER_PATH"], "wb", buffering=0)  # noqa: SIM115

        def row(step: int) -> None:
            data = {"timing_s/step": 1.0, "timing_s/gen": 0.5, "critic/score/mean": step / 1e6,
                    "response_length/mean": 100 + rng.random(), "actor/lr": 1e-6,
                    **{k: rng.random() for k in KEYS}}
            if step % 10 == 0:
                data["val-core/x/reward/mean@1"] = step / 1e6
            log.write((json.dumps({"step": step, "data": data}) + "\n").encode())
    else:
        from torch.utils.tensorboard import SummaryWriter

        tb = SummaryWriter(os.environ["TENSORBOARD_LOGGING_DIR"])

        def row(step: int) -> None:
            for k in ("reward", "loss", "learning_rate", "grad_norm", "entropy",
                      "completions/mean_length", *KEYS[:34]):
                tb.add_scalar(f"train/{k}", rng.random(), step)
            if step % 10 == 0:
                tb.add_scalar("eval/reward", step / 1e6, step)
                tb.add_scalar("eval/runtime", 0.0, step)
            tb.flush()
    for step in range(1, args.prewrite + 1):
        row(step)
    for step in range(args.prewrite + 1, args.prewrite + args.rows + 1):
        time.sleep(1 / args.rate)
        row(step)
        times.write(json.dumps({"step": step, "written": time.time()}) + "\n")
        times.flush()
    return 0


# ---------------------------------------------------------------- one case
def case(fmt: str, length: int, rows: int, rate: float, scratch: Path) -> dict:
    from rlbatch.core.loading import validate_config
    from rlbatch.core.runlog import read_json
    from rlbatch.profile.driver import Driver, Journal
    from rlbatch.profile.executors import LocalExecutor
    from rlbatch.profile.trials import Trial

    work = scratch / f"{fmt}-{length}"
    (work / "trials").mkdir(parents=True)
    (work / "logs").mkdir()
    times = work / "written.jsonl"
    total = length + rows
    argv = [sys.executable, str(Path(__file__).resolve()), "write", "--format", fmt,
            "--prewrite", str(length), "--rows", str(rows), "--rate", str(rate),
            "--times", str(times)]
    cfg = validate_config({
        "name": f"follow-{fmt}", "backend": "command",
        "command": {"framework": fmt, "argv": argv},
        "batch": {"prompts_per_step": P, "samples_per_prompt": G},
        "optimizer": {"reference_sequences": P * G, "reference_lr": 1e-6},
        "target": {"metric": "eval/reward", "value": 0.99, "gain": None},
        "budget": {"max_samples": total * P * G, "stop_at_target": False},
        "eval": {"every_samples": 10 * P * G}, "output_dir": str(work / "runs")})
    trial = Trial("t", "baseline", P, 0, cfg)
    seen: dict[int, float] = {}

    def stopper(st: dict) -> None:  # the early-stop check, as a profile's driver calls it
        seen.setdefault(st["samples"] // (P * G), time.time())

    driver = Driver(cfg, work, LocalExecutor(1), Journal(work / "journal.jsonl"), None)
    t0 = time.perf_counter()
    driver.run([trial], stopper)
    wall = time.perf_counter() - t0
    summary = read_json(trial.run_dir() / "summary.json")
    assert summary["steps"] == total, summary
    written = {r["step"]: r["written"] for r in map(json.loads, times.read_text().splitlines())}
    # a row is seen when the status shows it or a later one
    lat = []
    for step, t in written.items():
        after = [when for s, when in seen.items() if s >= step]
        if after:
            lat.append(min(after) - t)
    cmd = summary["command"]
    return {"format": fmt, "rows": total, "reads": cmd["log_reads"],
            "read_cpu_s": cmd["log_read_cpu_s"], "cpu_ms_per_row": 1e3 * cmd["log_read_cpu_s"]
            / total, "wall_s": wall, "latency_median_s": statistics.median(lat),
            "latency_p90_s": sorted(lat)[int(0.9 * (len(lat) - 1))], "timed_rows": len(lat),
            "one_read_cpu_s": last_read_cost(trial.run_dir(), fmt)}


def last_read_cost(run_dir: Path, fmt: str) -> float:
    """The CPU seconds of one read of the whole final log (the converter, as the follower
    calls it)."""
    from rlbatch.backends.command.follow import Attempt, Follower
    from rlbatch.interop.ingest import IngestOptions

    attempt = run_dir / "command" / "attempts" / "001"
    log = attempt / ("verl.jsonl" if fmt == "verl" else "tensorboard")
    follower = Follower(fmt, IngestOptions(prompts_per_step=P, samples_per_prompt=G))
    follower.read([Attempt(1, log, False, -1)])
    return follower.last_cost_s


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "write":
        ap = argparse.ArgumentParser()
        ap.add_argument("write")
        for flag, kind in (("--format", str), ("--prewrite", int), ("--rows", int),
                           ("--rate", float), ("--times", str)):
            ap.add_argument(flag, type=kind)
        return write(ap.parse_known_args()[0])  # the framework words appended are ignored
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--formats", default="verl,trl")
    ap.add_argument("--lengths", default="100,1000,4000", help="rows already in the log")
    ap.add_argument("--rows", type=int, default=40, help="rows written at --rate, timed")
    ap.add_argument("--rate", type=float, default=4.0, help="rows per second")
    args = ap.parse_args()
    results = []
    with tempfile.TemporaryDirectory(prefix="rlbatch-follow-") as tmp:
        print(f"{'format':>6} {'rows':>6} {'reads':>6} {'CPU s':>7} {'ms/row':>7} "
              f"{'1 read s':>9} {'lat p50':>8} {'lat p90':>8}", flush=True)
        for fmt in args.formats.split(","):
            for length in (int(x) for x in args.lengths.split(",")):
                r = case(fmt, length, args.rows, args.rate, Path(tmp))
                results.append(r)
                print(f"{fmt:>6} {r['rows']:>6} {r['reads']:>6} {r['read_cpu_s']:>7.2f} "
                      f"{r['cpu_ms_per_row']:>7.2f} {r['one_read_cpu_s']:>9.3f} "
                      f"{r['latency_median_s']:>8.2f} {r['latency_p90_s']:>8.2f}", flush=True)
    print(json.dumps({"bench": "follow_cost", "rate_rows_per_s": args.rate,
                      "timed_rows": args.rows, "results": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
