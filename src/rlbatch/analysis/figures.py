"""Figure data for `rlbatch report` (docs/design.md, house rule 8: data apart from pictures).

One pure function per figure: the analysis document (analyze.py), the run frames
(runs.py) and profile.json (profile/procedure.py) in, plain dicts and lists out (JSON-ready,
tested by equality). The report layer only draws what these return. A function returns
`None` when its data is absent (the figure is then omitted with FIGURES' one-line note).

- Seed bands: each run is linearly interpolated onto the union of its configuration's
  evaluated x values, inside its own range only; at each x the band is the min and max, the
  line the mean, over the seeds that cover that x (runs that stop at the target end early).
- Phase times: seconds per 1,000 samples of each `time/*` phase, summed over a
  configuration's runs and divided by their samples (so configurations with different B
  compare on the samples axis).
- The decision and the tables come from tables.py; labels from labels.py.
numpy/pandas only: no torch, no matplotlib.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from rlbatch.analysis.labels import config_labels, ratio_or_none, short_labels, target_line
from rlbatch.analysis.runs import RunFrames
from rlbatch.analysis.tables import configs_table, decision_data, logged_metrics, runs_table

__all__ = ["FIGURES", "config_labels", "report_data", "short_labels", "target_line"]

PHASES = (("rollout", "time/rollout"), ("reward", "time/reward"),
          ("actor", "time/actor_update"), ("critic", "time/critic_update"),
          ("other", "time/other"))
EXTRA_PHASES = (("critic_values", "time/critic_values"), ("reference", "time/reference"),
                ("noise_scale", "time/noise_scale"))
MEMORY_LIMIT_VIEW = 16  # mark the memory limit when it is within 16x the largest tested C

FIGURES = {  # key -> (title, note when the data is absent)
    "invariance_samples": ("Target metric against cumulative samples (invariance plot)",
                           "no run logged the target metric"),
    "invariance_time": ("Target metric against training seconds",
                        "no run logged the target metric with train_s"),
    "scaling": ("Samples to target N* and time to target T against B",
                "no configuration with a known batch size"),
    "decision_rule": ("Decision rule: throughput ratio against samples ratio",
                      ("no candidate with both ratios known (needs a reference and a "
                       "candidate that reached the target)")),
    "decode": ("Decode throughput against concurrency C",
               "no decode sweep in profile.json and no rollout/concurrency in the step logs"),
    "phases": ("Phase time per configuration", "no step logs with time/* keys"),
    "noise_scale": ("Gradient noise scale B_simple over samples",
                    "no run logged actor/noise_scale or critic/noise_scale"),
    "lr_control": ("Fixed-LR control against its sqrt-scaled twin",
                   "no pair of configurations with the same B and lr_scaling none and sqrt"),
}


# ---- curves with seed bands ----
def run_curve(rows: pd.DataFrame, x: str, metric: str) -> tuple[np.ndarray, np.ndarray]:
    """(x, metric) of one run's rows, non-finite pairs dropped, sorted by x."""
    if rows.empty or metric not in rows.columns or x not in rows.columns:
        return np.zeros(0), np.zeros(0)
    xs = pd.to_numeric(rows[x], errors="coerce").to_numpy(dtype=np.float64)
    v = pd.to_numeric(rows[metric], errors="coerce").to_numpy(dtype=np.float64)
    keep = np.isfinite(xs) & np.isfinite(v)
    order = np.argsort(xs[keep], kind="stable")
    return xs[keep][order], v[keep][order]


def seed_band(curves: list[tuple[np.ndarray, np.ndarray]]) -> dict | None:
    """Mean, min and max across runs on the union of their x values (each run only inside
    its own range); None when no run has a point."""
    curves = [c for c in curves if len(c[0])]
    if not curves:
        return None
    grid = np.unique(np.concatenate([s for s, _ in curves]))
    vals = np.full((len(curves), len(grid)), np.nan)  # (n_runs, G)
    for i, (s, v) in enumerate(curves):
        inside = (grid >= s[0]) & (grid <= s[-1])
        vals[i, inside] = np.interp(grid[inside], s, v)
    return {"x": grid.tolist(), "mean": np.nanmean(vals, axis=0).tolist(),
            "lo": np.nanmin(vals, axis=0).tolist(), "hi": np.nanmax(vals, axis=0).tolist(),
            "seeds": len(curves)}


def _rows(frames: RunFrames, run: str, source: str) -> pd.DataFrame:
    return frames.run_evals(run) if source == "evals" else frames.run_steps(run)


def invariance_data(doc: dict, frames: RunFrames | None, x: str = "samples") -> dict | None:
    """The target metric against `x` ("samples" or "train_s") per configuration, with seed
    bands; the reference and verdicts marked."""
    if frames is None or not doc.get("configs"):
        return None
    metric, source = doc["target"]["metric"], doc.get("metric_source", "evals")
    labels = config_labels(doc["configs"])
    out = []
    for e in doc["configs"]:
        band = seed_band([run_curve(_rows(frames, r["run"], source), x, metric)
                          for r in e["runs"]])
        if band is not None:
            out.append({"config": e["config"], "label": labels[e["config"]],
                        "sequences_per_step": e["sequences_per_step"],
                        "verdict": e["verdict"], **band,
                        "changes": [batch_changes(frames.run_steps(r["run"]), x)
                                    for r in e["runs"]] if e.get("schedule") else []})
    if not out:
        return None
    return {"x": x, "metric": metric, "target": target_line(doc),
            "reference": doc["reference"]["config"], "configs": out}


def batch_changes(steps: pd.DataFrame, x: str) -> list[list[float]]:
    """Where a run's B changed (a batch schedule): [x where the new B began, the new B] for
    each step whose `batch/sequences_per_step` differs from the step before; x is the
    previous row's `samples` or `train_s` (the new B's first samples start there)."""
    key = "batch/sequences_per_step"
    if steps.empty or key not in steps.columns or x not in steps.columns:
        return []
    rows = steps.sort_values("samples")
    b, at = rows[key].to_numpy(dtype=float), rows[x].to_numpy(dtype=float)
    return [[float(at[i - 1]), float(b[i])] for i in range(1, len(b))
            if np.isfinite(b[i]) and np.isfinite(b[i - 1]) and b[i] != b[i - 1]]


# ---- batch-size figures from the analysis document ----
def scaling_data(doc: dict) -> dict | None:
    """N* and T (medians, intervals, censoring lower bounds) against B per configuration,
    with the critical batch (departure sense) and McCandlish's B_crit."""
    labels = config_labels(doc.get("configs", []))
    pts = []
    for e in doc.get("configs", []):
        if e["sequences_per_step"] is None:
            continue
        pts.append({k: e[k] for k in (
            "config", "sequences_per_step", "lr_scaling", "verdict", "samples_to_target",
            "samples_to_target_ci", "samples_to_target_lower_bound", "time_to_target",
            "time_to_target_ci", "time_to_target_lower_bound")} | {"label": labels[e["config"]]})
    if not pts:
        return None
    cb = doc.get("critical_batch") or {}
    return {"points": pts, "reference": doc["reference"]["config"],
            "critical_batch_departure": cb.get("critical_batch_departure"),
            "b_crit_mccandlish": cb.get("b_crit_mccandlish")}


def decision_rule_data(doc: dict) -> dict | None:
    """Per candidate: x = N*_cand/N*_ref, y = q_cand/q_ref (intervals). Above y = x the
    candidate is faster (T = N*/q). Candidates without both ratios are listed apart."""
    labels = config_labels(doc.get("configs", []))
    pts, missing = [], []
    for e in doc.get("configs", []):
        vs = e.get("vs_reference")
        if not vs:
            continue
        if vs["samples_ratio"] is None or vs["throughput_ratio"] is None:
            missing.append(labels[e["config"]])
            continue
        pts.append({"config": e["config"], "label": labels[e["config"]],
                    "sequences_per_step": e["sequences_per_step"], "verdict": e["verdict"],
                    "samples_ratio": vs["samples_ratio"],
                    "samples_ratio_ci": vs["samples_ratio_ci"],
                    "throughput_ratio": vs["throughput_ratio"],
                    "throughput_ratio_ci": vs["throughput_ratio_ci"],
                    "faster_by_rule": vs["faster_by_rule"]})
    if not pts:
        return None
    return {"points": pts, "not_plotted": missing}


def noise_scale_data(doc: dict) -> dict | None:
    """Logged B_simple series (actor, critic) of every run, labelled by configuration."""
    labels = config_labels(doc.get("configs", []))
    out: dict[str, list] = {"actor": [], "critic": []}
    for e in doc.get("configs", []):
        for r in e["runs"]:
            for role, pts in (r.get("noise_scale_series") or {}).items():
                out.setdefault(role, []).append({
                    "config": e["config"], "label": labels[e["config"]], "seed": r["seed"],
                    "samples": [p[0] for p in pts], "values": [p[1] for p in pts]})
    return out if any(out.values()) else None


# ---- systems figures ----
def decode_data(profile: dict | None, frames: RunFrames | None = None) -> dict | None:
    """Tokens/s against decode concurrency from profile.json's sweep (plateau, chosen C,
    memory limit, roofline bound in tokens/s = tokens_per_s x bound / achieved FLOP/s);
    else the step logs' rollout/tokens_per_s medians per rollout/concurrency."""
    decode = (profile or {}).get("decode") or {}
    sweep = decode.get("sweep") or {}
    if sweep.get("rows"):
        pts = [{"concurrency": r["concurrency"], "tokens_per_s": r["tokens_per_s"],
                "roofline_tokens_per_s": (r["tokens_per_s"] * r["roofline_bound_flops"]
                                          / r["achieved_flops"]) if r.get("achieved_flops")
                else None,
                "bound_by": r.get("bound_by"), "latency_s": r.get("latency_s"),
                "within_latency_cap": r.get("within_latency_cap", True)}
               for r in sweep["rows"]]
        c_max = sweep.get("max_concurrency_in_budget")
        top = max(p["concurrency"] for p in pts)
        return {"source": "decode_sweep", "points": pts,
                "plateau_concurrency": sweep.get("plateau_concurrency"),
                "chosen_concurrency": decode.get("chosen"),
                "memory_limit_concurrency": c_max,
                "memory_limit_in_view": c_max is not None and c_max <= MEMORY_LIMIT_VIEW * top,
                "stopped_by": sweep.get("stopped_by"), "latency_cap_s": sweep.get("latency_cap_s"),
                "engine": sweep.get("engine"), "device": sweep.get("device")}
    return _decode_from_steps(frames)


def _decode_from_steps(frames: RunFrames | None) -> dict | None:
    cols = ("rollout/concurrency", "rollout/tokens_per_s")
    if frames is None or any(c not in frames.steps.columns for c in cols):
        return None
    df = frames.steps[list(cols)].apply(pd.to_numeric, errors="coerce").dropna()
    if df.empty:
        return None
    med = df.groupby(cols[0])[cols[1]].median().sort_index()
    pts = [{"concurrency": int(c), "tokens_per_s": float(t), "roofline_tokens_per_s": None,
            "bound_by": None, "latency_s": None, "within_latency_cap": True}
           for c, t in med.items()]
    return {"source": "training_steps", "points": pts, "plateau_concurrency": None,
            "chosen_concurrency": None, "memory_limit_concurrency": None,
            "memory_limit_in_view": False, "stopped_by": None, "latency_cap_s": None,
            "engine": None, "device": None}


def phase_data(doc: dict, frames: RunFrames | None) -> dict | None:
    """Seconds per 1,000 samples of each phase per configuration (and its fraction of the
    total). The five main phases always; reference / noise_scale only when they took time."""
    if frames is None or frames.steps.empty:
        return None
    known = [(n, c) for n, c in PHASES + EXTRA_PHASES if c in frames.steps.columns]
    if not known:
        return None
    labels = config_labels(doc["configs"])
    rows = []
    for e in doc["configs"]:
        st = frames.steps[frames.steps["run"].isin([r["run"] for r in e["runs"]])]
        samples = float(st.groupby("run")["samples"].max().sum()) if len(st) else 0.0
        if samples <= 0:
            continue
        per = {n: float(pd.to_numeric(st[c], errors="coerce").sum()) * 1000.0 / samples
               for n, c in known}
        total = sum(per.values())
        rows.append({"config": e["config"], "label": labels[e["config"]],
                     "sequences_per_step": e["sequences_per_step"], "steps": len(st),
                     "seconds_per_1k_samples": per,
                     "fraction": {n: (v / total if total > 0 else None) for n, v in per.items()}})
    main = [n for n, _ in PHASES]
    phases = [n for n, _ in known
              if n in main or any(r["seconds_per_1k_samples"][n] > 0 for r in rows)]
    if not rows:
        return None
    for r in rows:
        r["seconds_per_1k_samples"] = {n: r["seconds_per_1k_samples"][n] for n in phases}
        r["fraction"] = {n: r["fraction"][n] for n in phases}
    return {"phases": phases, "configs": rows}


def lr_control_data(doc: dict, frames: RunFrames | None) -> list | None:
    """Each fixed-LR configuration (lr_scaling none) with its sqrt-scaled twin (same B and
    algorithm): N*, T, q side by side, their ratios (fixed / sqrt) and both curves."""
    entries = doc.get("configs", [])
    labels = config_labels(entries)
    curves = {c["config"]: c for c in (invariance_data(doc, frames) or {}).get("configs", [])}
    pairs = []
    for fixed in entries:
        if fixed["lr_scaling"] != "none" or fixed["sequences_per_step"] is None:
            continue
        twin = next((e for e in entries if e["lr_scaling"] == "sqrt"
                     and e["sequences_per_step"] == fixed["sequences_per_step"]
                     and e["algorithm"] == fixed["algorithm"]), None)
        if twin is None:
            continue
        sides = {name: {k: e[k] for k in ("config", "lr", "samples_to_target",
                                          "samples_to_target_lower_bound", "time_to_target",
                                          "throughput", "verdict")}
                 | {"label": labels[e["config"]], "curve": curves.get(e["config"])}
                 for name, e in (("fixed", fixed), ("sqrt", twin))}
        pairs.append({"sequences_per_step": fixed["sequences_per_step"], **sides,
                      "metric": doc["target"]["metric"], "target": target_line(doc),
                      "samples_ratio": ratio_or_none(fixed["samples_to_target"],
                                              twin["samples_to_target"]),
                      "time_ratio": ratio_or_none(fixed["time_to_target"], twin["time_to_target"]),
                      "throughput_ratio": ratio_or_none(fixed["throughput"], twin["throughput"])})
    return pairs or None


def report_data(doc: dict, frames: RunFrames | None, profile: dict | None, out_dir: str) -> dict:
    """Everything the report draws: overview, decision, tables and each figure's data (None
    where absent, with FIGURES' note)."""
    figs = {
        "invariance_samples": invariance_data(doc, frames, "samples"),
        "invariance_time": invariance_data(doc, frames, "train_s"),
        "scaling": scaling_data(doc), "decision_rule": decision_rule_data(doc),
        "decode": decode_data(profile, frames), "phases": phase_data(doc, frames),
        "noise_scale": noise_scale_data(doc), "lr_control": lr_control_data(doc, frames),
    }
    configs = frames.configs if frames is not None else None
    return {
        "title": (profile or {}).get("config"), "target": doc["target"],
        "metric_source": doc.get("metric_source"), "reference": doc["reference"],
        "settings": doc["settings"], "critical_batch": doc.get("critical_batch"),
        "cost": (profile or {}).get("cost"), "problem": (profile or {}).get("problem"),
        "warnings": list(doc.get("warnings", [])), "metrics": logged_metrics(frames),
        "decision": decision_data(doc, profile, configs), "configs": configs_table(doc),
        "runs": runs_table(doc, configs, profile, out_dir),
        "figures": figs, "notes": {k: v[1] for k, v in FIGURES.items() if figs[k] is None},
        "titles": {k: v[0] for k, v in FIGURES.items()},
    }
