"""The batch-schedule study's numbers (issue 31): for each profile folder, every
configuration's time to target against the best static B of its grid, with the calibrated
intervals of `rlbatch analyze`, and what the profile's runs cost in training seconds.

The runs are those the profile decided on (`profile.json`'s analysis: a baseline evaluated
again more densely replaces the first one). The best static B is the configuration without a
schedule whose time to target (geometric mean across seeds) is lowest; it is then the
reference of a second analysis of the same runs, so each schedule's T ratio and interval is
against it. Choosing the reference by the same runs' point estimates favours it (the
winner's curse): a schedule's ratio against it is, if anything, biased upward.

    python bench/schedule_study.py /tmp/s31/grpo-quick /tmp/s31/ppo-quick ...

Prints a table per profile and one JSON line.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def study(folder: Path) -> dict:
    from rlbatch.analysis.analyze import analyze
    from rlbatch.analysis.crossing import Target

    doc = json.loads((folder / "profile.json").read_text())
    first = doc["analysis"]
    runs = [r["run"] for c in first["configs"] for r in c["runs"]]
    static = [c for c in first["configs"] if not c.get("schedule")
              and c.get("time_to_target") is not None]
    best = min(static, key=lambda c: c["time_to_target"])
    t = doc["target"]
    target = Target(t["metric"], t.get("value"), gain=t.get("gain"))
    again = analyze(runs, target, reference_run=best["runs"][0]["run"],
                    margin=first["settings"]["margin"],
                    statistic=first["settings"]["statistic"].split(":")[0])
    rows = []
    for c in again["configs"]:
        vs = c.get("vs_reference") or {}
        rows.append({"config": c["config"], "schedule": c.get("schedule"),
                     "sequences_per_step": c["sequences_per_step"], "seeds": c["seeds"],
                     "samples_to_target": c["samples_to_target"],
                     "time_to_target": c["time_to_target"], "throughput": c["throughput"],
                     "verdict": c["verdict"], "time_ratio": vs.get("time_ratio"),
                     "time_ratio_ci": vs.get("time_ratio_ci"),
                     "samples_ratio": vs.get("samples_ratio"),
                     "samples_ratio_ci": vs.get("samples_ratio_ci"),
                     "p_faster": vs.get("p_faster")})
    return {"profile": str(folder), "best_static": best["config"],
            "best_static_sequences": best["sequences_per_step"], "rows": rows,
            "train_s_spent": doc["cost"]["trial_train_s"],
            "runs": len(runs)}


def main() -> int:
    out = []
    for arg in sys.argv[1:]:
        s = study(Path(arg))
        out.append(s)
        print(f"\n{s['profile']}: best static B = {s['best_static_sequences']}; "
              f"{s['runs']} runs, {s['train_s_spent']:.0f} training seconds")
        print(f"{'configuration':>32} {'seeds':>5} {'N*':>8} {'T s':>7} {'q':>7} "
              f"{'T / T_best [90%]':>22} {'verdict':>12}")
        for r in s["rows"]:
            name = r["schedule"] or f"B={r['sequences_per_step']}"
            ci = r["time_ratio_ci"]
            ratio = "-" if r["time_ratio"] is None else \
                f"{r['time_ratio']:.2f} [{ci[0]:.2f}, {ci[1]:.2f}]"
            t = r["time_to_target"]
            print(f"{name:>32} {r['seeds']:>5} {r['samples_to_target'] or 0:>8,.0f} "
                  f"{t if t is not None else float('nan'):>7.2f} {r['throughput']:>7.0f} "
                  f"{ratio:>22} {r['verdict']:>12}")
    print(json.dumps({"bench": "schedule_study", "studies": out}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
