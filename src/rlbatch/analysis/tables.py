"""Decision and table data of `rlbatch report` (docs/design.md, house rule 8): the
recommended configuration with its measured and predicted saving, and the configuration and
run tables. Pure: the analysis document, the runs' configs and profile.json in, JSON-ready
dicts out. No torch.

Measured saving = 1 - T_rec / T_ref. Its interval is the analysis's T-ratio interval
(stats.compare), turned around. The predicted saving uses the McCandlish prediction (no
interval).
"""

from __future__ import annotations

import os

from rlbatch.analysis.labels import confidence, config_labels, finite_float, ratio_or_none
from rlbatch.analysis.runs import RunFrames


def saving_interval(time_ratio_ci: list | None) -> list:
    """Interval of 1 - T_cand/T_ref from a T-ratio interval (the recommendation's, which
    allows for the pick: selection.selected_interval); None = unbounded."""
    lo, hi = time_ratio_ci or [None, None]
    return [None if hi is None else finite_float(1.0 - hi),
            None if lo is None else finite_float(1.0 - lo)]


def _concurrency(configs: dict | None, config: str) -> int | None:
    c = ((configs or {}).get(config) or {}).get("rollout") or {}
    return c.get("generation_concurrency") if isinstance(c, dict) else None


def decision_data(doc: dict, profile: dict | None = None, configs: dict | None = None) -> dict:
    """The recommended P, G, LR and C with its measured (and predicted) saving against the
    reference; `recommended: false` with the reason when there is none."""
    probe = (profile or {}).get("decision") if (profile or {}).get("strategy") == "probe" \
        else None
    out = _decision_data(doc, profile, configs)
    return {**out, "probe": probe} if probe else out


def _decision_data(doc: dict, profile: dict | None, configs: dict | None) -> dict:
    rec = doc.get("recommendation")
    if rec is None:
        reason = (profile or {}).get("problem") or doc.get("problem") or \
            "the reference has no time to target"
        return {"recommended": False, "reason": reason}
    entries = {e["config"]: e for e in doc["configs"]}
    e, ref = entries[rec["config"]], entries[doc["reference"]["config"]]
    labels = config_labels(doc["configs"])
    dec = ((profile or {}).get("decision") or {}) if (profile or {}).get("strategy") != "probe" \
        else {}
    ratio = ratio_or_none(rec["time_to_target"], ref["time_to_target"])
    saving = None if rec["is_reference"] or ratio is None else 1.0 - ratio
    pred = ratio_or_none(e.get("predicted_time_to_target"), ref.get("predicted_time_to_target"))
    return {
        "recommended": True, "config": rec["config"], "label": labels[rec["config"]],
        "is_reference": rec["is_reference"],
        "prompts_per_step": dec.get("prompts_per_step", e["prompts_per_step"]),
        "samples_per_prompt": dec.get("samples_per_prompt", e["samples_per_prompt"]),
        "sequences_per_step": e["sequences_per_step"], "lr": e["lr"],
        "generation_concurrency": dec.get("generation_concurrency",
                                          _concurrency(configs, rec["config"])),
        "reference": ref["config"], "reference_label": labels[ref["config"]],
        "time_to_target": rec["time_to_target"], "time_to_target_ci": rec["time_to_target_ci"],
        "reference_time_to_target": ref["time_to_target"],
        "reference_time_to_target_ci": ref["time_to_target_ci"],
        "measured_saving": saving,
        "measured_saving_ci": None if rec["is_reference"]
        else saving_interval(rec.get("time_ratio_ci")),
        "candidates_analysed": rec.get("candidates_analysed"),
        "p_faster": rec["p_faster_than_reference"], "speedup": rec["speedup_vs_reference"],
        "p_faster_family": rec.get("p_faster_family"),
        "predicted_saving": None if rec["is_reference"] or pred is None else 1.0 - pred,
        "b_noise": (doc.get("prediction") or {}).get("b_noise"),
        "b_noise_source": (doc.get("prediction") or {}).get("b_noise_source"),
        "ci": doc["settings"]["ci"], "target": doc["target"],
        "evidence": rec.get("evidence"), "next": rec.get("next"), "seeds": rec.get("seeds"),
        "compared": [labels[c["config"]] + f" ({c['seeds']} seeds)"
                     for c in rec.get("compared") or []],
        "against": against(rec, entries, labels),
    }


def against(rec: dict, entries: dict, labels: dict) -> list[str]:
    """Per compared candidate that is not the choice: why the choice was preferred, in words."""
    rejected = {r["config"]: r["why"] for r in rec.get("rejected") or []}
    shown = set(rec.get("shown_faster") or [])
    out = []
    for c in rec.get("compared") or []:
        name = c["config"]
        if name == rec["config"]:
            continue
        vs = entries[name].get("vs_reference") or {}
        t, ci = vs.get("time_ratio"), vs.get("time_ratio_ci") or [None, None]
        c = confidence(vs)
        ratio = (f"T ratio {_fmt(t)} [{_fmt(ci[0])}, {_fmt(ci[1])}]" + (f", {c}" if c else "")
                 if t is not None else "no T ratio")
        if name in rejected:
            why = rejected[name]
        elif name in shown:
            why = f"shown faster than the reference, but slower than the choice ({ratio})"
        else:
            why = (f"its advantage over the reference is not shown at one-sided "
                   f"{rec.get('alpha', 0.05):.0%} with Holm over the candidates ({ratio})")
        out.append(f"{labels[name]}: {why}")
    return out


def _fmt(x) -> str:
    return "-" if x is None else f"{x:.3g}"


def configs_table(doc: dict) -> list[dict]:
    """One row per configuration: label, B, LR, seeds, N*, T, q (+ intervals), verdict."""
    labels = config_labels(doc.get("configs", []))
    keys = ("config", "sequences_per_step", "lr", "lr_scaling", "seeds", "samples_to_target",
            "samples_to_target_ci", "samples_to_target_lower_bound", "time_to_target",
            "time_to_target_ci", "time_to_target_lower_bound", "throughput", "verdict",
            "predicted_time_to_target")
    return [{k: e.get(k) for k in keys} | {"label": labels[e["config"]],
                                          "is_reference": e["config"] == doc["reference"]["config"]}
            for e in doc.get("configs", [])]


def _rel_link(run: str, out_dir: str) -> str:
    rel = os.path.relpath(os.path.abspath(run), os.path.abspath(out_dir))
    return rel.replace(os.sep, "/").rstrip("/") + "/"


def runs_table(doc: dict, configs: dict | None, profile: dict | None, out_dir: str) -> list[dict]:
    """One row per run: relative link to its folder (from `out_dir`), name, task, seed,
    config label, N*, T, q, censoring and (from profile.json) the trial, kind and status."""
    labels = config_labels(doc.get("configs", []))
    trials = {os.path.basename(os.path.normpath(t["run_dir"])): t
              for t in (profile or {}).get("trials", [])}
    rows = []
    for e in doc.get("configs", []):
        cfg = (configs or {}).get(e["config"]) or {}
        task = cfg.get("task") if isinstance(cfg.get("task"), dict) else {}
        for r in e["runs"]:
            t = trials.get(os.path.basename(os.path.normpath(r["run"]))) or {}
            rows.append({"link": _rel_link(r["run"], out_dir), "run_id": r["run_id"],
                         "name": cfg.get("name"), "task": task.get("name"),
                         "config": e["config"], "label": labels[e["config"]], "seed": r["seed"],
                         "samples_to_target": r["samples_to_target"],
                         "time_to_target": r["time_to_target"], "censored": r["censored"],
                         "last_samples": r["last_samples"], "throughput": r["throughput"],
                         "trial": t.get("trial"), "kind": t.get("kind"),
                         "status": t.get("status"), "stop_reason": t.get("stop_reason")})
    return rows


def logged_metrics(frames: RunFrames | None) -> list[str]:
    """Evaluation metric keys (eval/*) logged by any run."""
    if frames is None:
        return []
    return sorted(str(c) for c in frames.evals.columns if str(c).startswith("eval/"))
