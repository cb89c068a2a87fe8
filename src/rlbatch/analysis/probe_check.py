"""Predictions of a probe profile checked against configurations measured to the target.

`rlbatch profile --strategy probe` predicts each candidate's time to target from a short
probe (prediction.py) and runs only the predicted winner to the target. Whether those
predictions can be trusted is measured by running the same configurations to the target
(for example the exhaustive grid: `rlbatch profile --seeds 3 --set profile.early_stop=false`)
and setting each prediction beside the measured median (docs/design.md, Method, "probes").

A prediction is matched to an analysed configuration by what defines a configuration for a
user: algorithm, sequences per step B and actor learning rate (relative difference below
1e-6). Config ids cannot be used: a probe's run differs from a grid run in its evaluation
cadence and budget, which are part of the id.

Per matched configuration: predicted T and its interval against the measured median T and
its interval, the relative error (predicted / measured - 1), whether the measured median
falls inside the predicted interval, and the same for the time ratio against the
reference (the quantity decisions use; the probe's baseline N* cancels in it). The summary
gives the median absolute error of each and compares the probe's decision with the
analysis' recommendation. Pure: dicts in, dict out.
"""

from __future__ import annotations

import math
import statistics

from rlbatch.core.errors import DataError

LR_RTOL = 1e-6


def _same_lr(a, b) -> bool:
    if a is None or b is None:
        return a is b
    return abs(a - b) <= LR_RTOL * max(abs(a), abs(b))


def _match(entries: list[dict], algorithm, b, lr) -> dict | None:
    found = [e for e in entries if e["sequences_per_step"] == b and _same_lr(e["lr"], lr)
             and (algorithm is None or e["algorithm"] == algorithm)]
    return max(found, key=lambda e: (e["seeds"], e["config"])) if found else None


def _error(pred, meas) -> float | None:
    if pred is None or meas is None or meas <= 0:
        return None
    return pred / meas - 1.0


def _inside(ci, value) -> bool | None:
    if value is None or not ci or ci[0] is None or ci[1] is None:
        return None
    return bool(ci[0] <= value <= ci[1])


def check_predictions(doc: dict, profile: dict, where: str = "profile.json") -> dict:
    """The `probe_check` section: `doc` is an analysis document (analyze.py) of runs to the
    target, `profile` a probe profile's profile.json (`where` names it in errors)."""
    if profile.get("strategy") != "probe" or not isinstance(profile.get("predictions"), dict):
        raise DataError(f"{where}: not a probe profile (strategy 'probe' with predictions); "
                        f"profile it with `rlbatch profile --strategy probe`")
    entries = doc["configs"]
    ref = next(e for e in entries if e["config"] == doc["reference"]["config"])
    algorithm = ref["algorithm"]  # a probe profile's candidates share its baseline's
    rows, unmatched = [], []
    for trial, p in sorted(profile["predictions"].items()):
        if not isinstance(p, dict):
            raise DataError(f"{where}: predictions.{trial} is not an object")
        e = _match(entries, algorithm, p.get("sequences_per_step"), p.get("lr"))
        if e is None or e is ref:
            unmatched.append(trial)
            continue
        measured_ratio = (e.get("vs_reference") or {}).get("time_ratio")
        rows.append({
            "trial": trial, "config": e["config"], "kind": p.get("kind"),
            "sequences_per_step": e["sequences_per_step"], "lr": e["lr"],
            "probe_samples": p.get("samples"), "seeds": e["seeds"],
            "predicted_time": p.get("time_to_target"),
            "predicted_time_ci": p.get("time_to_target_ci"),
            "measured_time": e["time_to_target"], "measured_time_ci": e["time_to_target_ci"],
            "time_error": _error(p.get("time_to_target"), e["time_to_target"]),
            "measured_time_inside": _inside(p.get("time_to_target_ci"), e["time_to_target"]),
            "predicted_ratio": p.get("time_ratio"), "predicted_ratio_ci": p.get("time_ratio_ci"),
            "measured_ratio": measured_ratio,
            "ratio_error": _error(p.get("time_ratio"), measured_ratio),
            "measured_ratio_inside": _inside(p.get("time_ratio_ci"), measured_ratio),
            "verdict": p.get("verdict"), "measured_verdict": e["verdict"],
        })
    return {"rows": rows, "unmatched": unmatched, "summary": _summary(rows),
            "decision": _decision(doc, profile, entries)}


def _median_abs(values) -> float | None:
    vals = [abs(v) for v in values if v is not None and math.isfinite(v)]
    return statistics.median(vals) if vals else None


def _summary(rows: list[dict]) -> dict:
    t = [r["time_error"] for r in rows if r["time_error"] is not None]
    q = [r["ratio_error"] for r in rows if r["ratio_error"] is not None]
    inside = [r["measured_time_inside"] for r in rows if r["measured_time_inside"] is not None]
    return {"compared": len(t), "median_abs_time_error": _median_abs(t),
            "median_time_error": statistics.median(t) if t else None,
            "median_abs_ratio_error": _median_abs(q),
            "measured_inside_interval": [sum(inside), len(inside)]}


def _decision(doc: dict, profile: dict, entries: list[dict]) -> dict:
    """The probe profile's chosen (B, lr) against the analysis' recommended configuration."""
    dec = profile.get("decision") if isinstance(profile.get("decision"), dict) else None
    rec = doc.get("recommendation") or {}
    out = {"probe": None, "analysis": rec.get("config"), "same": None}
    if dec is None:
        return out
    chosen = _match(entries, None, dec.get("sequences_per_step"), dec.get("lr"))
    out["probe"] = chosen["config"] if chosen else (
        f"B{dec.get('sequences_per_step')}-lr{dec.get('lr')} (not among the analysed runs)")
    out["same"] = chosen is not None and chosen["config"] == rec.get("config")
    return out
