"""`make bench`: run every benchmark in turn (each prints a table and one JSON line).

Run on an otherwise idle machine: the figures are wall-clock ratios measured side by side.
Record results in docs/benchmarks.md with the machine and the command that produced them.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent
BENCHES = [
    [sys.executable, str(HERE / "decode_vs_hf.py")],
    [sys.executable, str(HERE / "step_time_vs_trl.py"), "--steps", "20"],
    [sys.executable, "-m", "rlbatch.cli.main", "decode-bench", "--model", "tiny",
     "--concurrency", "1,2,4,8,16,32,64,128,256,512", "--prompt-tokens", "9",
     "--new-tokens", "32"],
    [sys.executable, str(HERE / "ingest_memory.py")],
    [sys.executable, str(HERE / "tiny_build.py")],
]


def main() -> int:
    failed = 0
    for cmd in BENCHES:
        print(f"\n$ {' '.join(cmd)}", flush=True)
        failed += subprocess.run(cmd, check=False).returncode != 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
