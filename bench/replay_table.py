"""The decision table of docs/analysis.md ("Replays"): `rlbatch replay` on each bank under
each procedure variant, two at a time (a replay reads recorded times, so it may share the
machine), as one Markdown table and one JSON line.

    python bench/replay_table.py --bank large-saving=/path/to/bank --bank no-saving=/path \
        --replicates 200 --out docs/study/replays

Each `--bank NAME=DIR` is replayed with the config `bench/banks/NAME.yaml`. Variants
(VARIANTS): the full strategy with the defaults, with follow-ups for every configuration,
with alpha spent over the looks, with follow-ups for open configurations and alpha spent,
with the futility stops or without early stops (follow-ups for every configuration), with
each comparison on one spread pooled over every configuration or on the larger of the
pair's and the pooled one, the probe strategy, the first look alone (`rlbatch profile
--follow 0`), and the profile within a budget of 2, 4 and 8 baseline runs (`--budget`,
beside the one-seed grid within the same budget; `calibration` in the JSON holds the printed
probabilities against how often they came true), and the budget's looks as a sequential
decision capped at 16 (the default decision: `rlbatch profile` without flags), 10, 12, 20
or 24 (`profile.sequential`; `max-slower-16` lets the decision rule's
"shown faster" pick too; `-sure-90` goes on until a candidate pick is 0.9 likely within 5%
of the fastest, `profile.budget_sure_within`); the floor column is the bank's information floor (profile/floor.py); each one's `rlbatch replay --json` document is written to
`--out/NAME-VARIANT.json`.
"""

from __future__ import annotations

import argparse
import json
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from rlbatch.core.profile_schema import ProfileConfig
from rlbatch.profile import default_sets

HERE = Path(__file__).parent
VARIANTS = {
    "full": ("full", []),  # the defaults: follow-ups for the challenger, alpha per look
    "full-all": ("full", ["profile.follow_up=all"]),
    "full-spent": ("full", ["profile.alpha_spending=true"]),
    "full-open-spent": ("full", ["profile.follow_up=open", "profile.alpha_spending=true"]),
    "full-futility-all": ("full", ["profile.early_stop_rule=futility",
                                   "profile.follow_up=all"]),
    "full-no-early-stop-all": ("full", ["profile.early_stop=false", "profile.follow_up=all"]),
    "full-futility-open-spent": ("full", ["profile.early_stop_rule=futility",
                                          "profile.follow_up=open",
                                          "profile.alpha_spending=true"]),
    "full-pooled": ("full", ["profile.spread=pooled"]),
    "full-larger": ("full", ["profile.spread=larger"]),
    "full-paired": ("full", ["profile.spread=paired"]),
    "probe": ("probe", []),
    # `rlbatch profile --follow 0`: the first look's decision alone
    "first-look": ("full", [], 0),
    # `rlbatch profile --budget N`: looks while the budget pays for them, a pick with its
    # probabilities (profile/budget.py); beside the one-seed grid within the same budget
    "budget-2": ("full", ["profile.budget=2"]),
    "budget-4": ("full", ["profile.budget=4"]),
    "budget-8": ("full", ["profile.budget=8"]),
    # the budget's looks capped at 16 baseline runs as a decision, `rlbatch profile` without
    # flags (profile.default_sets): a candidate picked only when at most 5% likely slower
    # than the baseline, by the draws alone (profile.sequential), or also when the decision
    # rule shows it faster at any look; and the same decision at other caps
    "sequential-16": ("full", default_sets(ProfileConfig(), None)),
    "sequential-10": ("full", ["profile.budget=10", "profile.sequential=true"]),
    "sequential-12": ("full", ["profile.budget=12", "profile.sequential=true"]),
    "sequential-20": ("full", ["profile.budget=20", "profile.sequential=true"]),
    "sequential-24": ("full", ["profile.budget=24", "profile.sequential=true"]),
    "max-slower-16": ("full", ["profile.budget=16", "profile.budget_max_slower=0.05"]),
    # the same, going on until a candidate pick is 0.9 likely within 5% of the fastest
    "sequential-16-sure-90": ("full", ["profile.budget=16", "profile.sequential=true",
                                       "profile.budget_sure_within=0.9"]),
}


def run_one(job: tuple) -> dict:
    from rlbatch.core.loading import load_config
    from rlbatch.profile.replay import replay

    name, bank_dir, variant, replicates, seed, follow = job
    strategy, sets, *own = VARIANTS[variant]
    follow = own[0] if own else follow
    cfg = load_config(str(HERE / "banks" / f"{name}.yaml"), overrides=sets)
    doc = replay(cfg, bank_dir, [strategy], replicates, seed=seed, follow=follow)
    return {**doc, "bank": name, "bank_dir": doc["bank"], "variant": variant, "sets": sets,
            "follow": follow}


def fmt(x, spec=".2f") -> str:
    return "-" if x is None else format(x, spec)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bank", action="append", default=[], help="NAME=DIR")
    ap.add_argument("--from", dest="source", type=Path, default=None,
                    help="print the table of the JSON documents an earlier --out wrote, "
                    "replaying nothing")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--replicates", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--follow", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    if a.source is not None:
        wanted = a.variants.split(",")
        docs = [d for d in (json.loads(p.read_text()) for p in sorted(a.source.glob("*.json")))
                if d["variant"] in wanted]
        order = list(VARIANTS)
        docs.sort(key=lambda d: (d["bank"], order.index(d["variant"])))
        return table(docs)
    if not a.bank:
        ap.error("give --bank NAME=DIR (or --from DIR)")
    banks = [b.split("=", 1) for b in a.bank]
    jobs = [(name, d, v, a.replicates, a.seed, a.follow) for name, d in banks
            for v in a.variants.split(",")]
    with ProcessPoolExecutor(a.workers) as pool:
        docs = list(pool.map(run_one, jobs))
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
        for d in docs:
            (a.out / f"{d['bank']}-{d['variant']}.json").write_text(json.dumps(d, indent=1))
    return table(docs)


def table(docs: list[dict]) -> int:
    print("| bank | procedure | replicates | recommends | within 5% of best | mean regret | "
          "slower than baseline | departed pick | median cost (x T_base) | floor (x T_base) | "
          "median cost over the floor | coverage of the pick's 90% interval | followed next "
          "(mean) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    rows = []
    for d in docs:
        ref = {r["strategy"]: r for r in d["strategies"]}
        strategy = VARIANTS[d["variant"]][0]
        mine = [(d["variant"], ref[strategy])]
        if d["variant"] == "full":  # the two reference rows once per bank
            mine += [("keep the baseline", ref["keep_baseline"]),
                     ("one seed each, lowest T", ref["one_seed_grid"])]
        within = [r for name, r in ref.items() if name.startswith("one_seed_grid_budget_")]
        mine += [(f"one seed each within the budget ({r['strategy'].rsplit('_', 1)[1]})", r)
                 for r in within]
        for label, r in mine:
            rows.append({"bank": d["bank"], "procedure": label, **r})
            cov = r.get("pick_interval_coverage")
            n_cov = r.get("recommendations_with_interval")
            print(f"| {d['bank']} | {label} | {r['replicates']} | {fmt(r['recommends'])} | "
                  f"{fmt(r['picks_within_5pct'])} | {fmt(r['mean_regret'])} | "
                  f"{fmt(r['slower_than_baseline'])} | {fmt(r.get('picks_departed'))} | "
                  f"{fmt(r['median_cost'])} | {fmt(r.get('floor_cost'))} | "
                  f"{fmt(r.get('cost_over_floor'))} | "
                  f"{fmt(cov)}{f' ({n_cov})' if n_cov else ''} | "
                  f"{fmt(r.get('followed_next'))} |")
    pooled = calibration(docs)
    print(json.dumps({"bench": "replay_table", "rows": rows, "calibration": pooled,
                      "truth": {d["bank"]: d["truth"] for d in docs}}))
    return 0


def calibration(docs: list[dict]) -> dict:
    """The printed probabilities of the documents' budget rows pooled bin by bin (each bin:
    replicates, their mean printed value, how often the event happened), printed as a
    table when there are any."""
    pooled: dict = {}
    for d in docs:
        row = next(r for r in d["strategies"] if r["strategy"] == VARIANTS[d["variant"]][0])
        for name, bins in (row.get("calibration") or {}).items():
            for b in bins:
                acc = pooled.setdefault(name, {}).setdefault(tuple(b["bin"]), [0, 0.0, 0.0])
                acc[0] += b["replicates"]
                acc[1] += b["mean_printed"] * b["replicates"]
                acc[2] += b["frequency"] * b["replicates"]
    out = {name: [{"bin": list(k), "replicates": n, "mean_printed": p / n, "frequency": f / n}
                  for k, (n, p, f) in sorted(bins.items()) if n]
           for name, bins in pooled.items()}
    if out:
        print("\n| probability | bin | replicates | mean printed | happened |\n|---|---|---|---|---|")
        for name, bins in out.items():
            for i, b in enumerate(bins):
                print(f"| {name if i == 0 else ''} | {b['bin'][0]:.1f}-{b['bin'][1]:.1f} | "
                      f"{b['replicates']} | {b['mean_printed']:.2f} | {b['frequency']:.2f} |")
    return out


if __name__ == "__main__":
    sys.exit(main())
