"""What a budget's pick can reach on a bank when it sees one seed of each configuration
(docs/analysis.md, "A budget"): the one-seed grid within the budget (the replay's
reference row, `profile/replay_truth.grid_within`) with a margin, picking the lowest
candidate only when its T is below margin x the baseline's. Margin 1 is the grid itself.
Acceptance of a budget's pick asks, on every bank, for picks within 5% of the best at least
as often as the grid and slower picks at most a third as often; this prints, per bank and
budget, the shares each margin gets, so that a margin meeting both on every bank shows
(none did on the committed banks).

    python bench/budget_frontier.py --bank large-saving=banks/large-saving \\
        --bank modest-saving=banks/modest-saving --bank no-saving=banks/no-saving \\
        --bank ppo=banks/ppo --replicates 2400

Each `--bank NAME=DIR` is read with `bench/banks/NAME.yaml`. Prints a table and one JSON
line; reads recorded times only, so the figures do not depend on the machine.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

from rlbatch.core.loading import load_config
from rlbatch.profile.bank import load_bank
from rlbatch.profile.replay import profile_keys, replay_config
from rlbatch.profile.replay_truth import attach_crossings, bank_truth, grid_within

HERE = Path(__file__).resolve().parent
MARGINS = (1.0, 0.9, 0.8, 0.75, 0.7, 0.65)


def frontier(name: str, bank_dir: str, budgets: list[float], replicates: int) -> list[dict]:
    cfg = replay_config(load_config(str(HERE / "banks" / f"{name}.yaml")))
    bank = load_bank(bank_dir)
    keys = profile_keys(cfg)
    attach_crossings(bank, cfg)
    truth = bank_truth(cfg, bank, keys)
    rows = []
    for budget in budgets:
        for m in MARGINS:
            r = grid_within(truth, bank, keys, replicates, random.Random(0), budget, m)
            rows.append({"bank": name, "budget": budget, "margin": m,
                         "picks_within_5pct": r["picks_within_5pct"],
                         "slower_than_baseline": r["slower_than_baseline"]})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bank", action="append", default=[], required=True, help="NAME=DIR")
    ap.add_argument("--budgets", default="2,4,8")
    ap.add_argument("--replicates", type=int, default=2400)
    args = ap.parse_args()
    budgets = [float(x) for x in args.budgets.split(",")]
    rows = []
    for spec in args.bank:
        name, _, bank_dir = spec.partition("=")
        rows += frontier(name, bank_dir, budgets, args.replicates)
    print("| bank | budget | " + " | ".join(
        "grid" if m == 1.0 else f"margin {m:g}" for m in MARGINS) + " |")
    print("|---|---|" + "---|" * len(MARGINS))
    for i in range(0, len(rows), len(MARGINS)):
        part = rows[i:i + len(MARGINS)]
        print(f"| {part[0]['bank']} | {part[0]['budget']:g} | " + " | ".join(
            f"{r['picks_within_5pct']:.2f} / {r['slower_than_baseline']:.2f}" for r in part)
              + " |")
    print(json.dumps({"bench": "budget_frontier", "replicates": args.replicates,
                      "rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
