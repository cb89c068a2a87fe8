"""The report's words: numbers formatted, sentences and table cells as plain (unescaped)
strings, shared by the HTML and Markdown renderers, which escape them. Formatting only:
every number comes from analysis/figures.py's report data."""

from __future__ import annotations

CAPTIONS = {
    "invariance_samples": "Mean across seeds (line) and the seeds' min-max band, against "
    "cumulative samples. With eta(B) = eta0 sqrt(B/B0), aligned configurations lie on the "
    "reference's curve (the thick line); the dashed line is the target.",
    "invariance_time": "The same curves against training seconds (evaluation excluded; "
    "checkpoint saves excluded by the built-in trainer and for verl, included for TRL, "
    "OpenRLHF and prime-rl, whose logs do not time them apart: docs/integrations.md, 'What "
    "rlbatch measures, per framework'): the configuration that crosses the target first wins.",
    "scaling": "Geometric means across seeds with their intervals; a triangle marks a "
    "censored estimate (the configuration's runs did not reach the target: '> bound').",
    "decision_rule": "T = N*/q: a candidate beats the reference only above the diagonal "
    "(q ratio > N* ratio). Bars are the ratios' intervals across seeds.",
    "decode": "Generated tokens per second against decode concurrency C, with the plateau "
    "(smallest C within 5% of the best), the KV-memory limit and the roofline bound.",
    "phases": "Where the training time goes: seconds per 1,000 samples in each phase, summed "
    "over a configuration's steps and runs (from steps.jsonl time/* keys).",
    "noise_scale": "Logged gradient noise scale B_simple (McCandlish et al. 2018) of each run.",
    "lr_control": "The paper's control: the same B with the reference LR unscaled "
    "(lr_scaling none) against the sqrt-scaled LR. Ratios are fixed / sqrt.",
}


def num(x, spec: str | None = None) -> str:
    """Compact number: thousands separators from 1000 up, 4 significant digits below."""
    if x is None:
        return "-"
    if spec:
        return format(x, spec)
    if isinstance(x, bool):
        return str(x)
    return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.4g}"


def pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def interval(ci, fmt=num) -> str:
    if not ci:
        return "[-]"
    lo, hi = ci
    return f"[{fmt(lo) if lo is not None else '-inf'}, {fmt(hi) if hi is not None else 'inf'}]"


def median_cell(row: dict, key: str) -> str:
    """`median [lo, hi]`, or `> lower bound` when the median involves a censored run."""
    if row[key] is None:
        lb = row.get(f"{key}_lower_bound")
        return f"> {num(lb)}" if lb is not None else "-"
    return f"{num(row[key])} {interval(row.get(f'{key}_ci'))}"


def probe_lines(p: dict) -> list[str]:
    """The probe strategy's decision (profile.json `decision` when `strategy: probe`)."""
    what = "keep the baseline" if p["is_reference"] else "use"
    lines = [(f"Profile (probe strategy): {what} P = {num(p['prompts_per_step'])} x G = "
              f"{num(p['samples_per_prompt'])} (B = {num(p['sequences_per_step'])}), LR = "
              f"{num(p['lr'], '.3g')}, C = {num(p['generation_concurrency'])}; outcome "
              f"{p['outcome']}, evidence: {p['evidence']}.")]
    if p.get("predicted_time_ratio") is not None:
        lines.append(f"Predicted T / T_base from its probe: "
                     f"{num(p['predicted_time_ratio'], '.2f')} "
                     f"{interval(p.get('predicted_time_ratio_ci'))}. The analysis of the same "
                     "runs below (probes count as censored runs) asks for 2 seeds per "
                     "configuration before it calls a difference established.")
    return lines


def decision_lines(d: dict) -> list[str]:
    if d.get("probe"):
        return probe_lines(d["probe"]) + decision_lines({**d, "probe": None})
    if not d["recommended"]:
        return [f"No recommendation: {d['reason']}."]
    t = d["target"]
    level = f"{d['ci']:.0%}"
    head = "Kept: the baseline," if d["is_reference"] else "Recommended:"
    lines = [(f"{head} P = {num(d['prompts_per_step'])} prompts x G = "
              f"{num(d['samples_per_prompt'])} samples per prompt (B = "
              f"{num(d['sequences_per_step'])}), LR = {num(d['lr'], '.3g')}, decode "
              f"concurrency C = {num(d['generation_concurrency'])} ({d['label']})."),
             (f"Target: {t['metric']} {'>=' if t['direction'] == 'higher' else '<='} "
              + (f"{t['value']:g}." if t.get("value") is not None else
                 f"the step-0 evaluation + {t['gain']:g}."))]
    why = {"established": "its time-to-target advantage is shown across seeds",
           "none_faster": "no candidate was shown faster, and none is left open (each was "
                          "stopped early, departed, or slower at its point estimate)",
           "not_enough": "no candidate's advantage is shown yet",
           "nothing_compared": "no candidate of the baseline's family has runs to compare "
                               "(each failed or none was run): nothing was compared"}
    lines.append(f"Evidence: {d.get('evidence')} ({why.get(d.get('evidence'), '-')}); "
                 f"compared: {', '.join(d.get('compared') or []) or 'none with 2 seeds'}.")
    lines += [f"Against {x}." for x in d.get("against") or []]
    if d.get("next"):
        lines.append(f"Next: {d['next']}.")
    if d["is_reference"]:
        lines.append(f"Keep the baseline: T = {num(d['time_to_target'])} s "
                     f"{interval(d['time_to_target_ci'])}.")
        return lines
    lines.append(f"Measured time to target: {num(d['time_to_target'])} s "
                 f"{interval(d['time_to_target_ci'])} against the reference's "
                 f"{num(d['reference_time_to_target'])} s "
                 f"{interval(d['reference_time_to_target_ci'])} ({d['reference_label']}).")
    m = d.get("candidates_analysed") or 1
    among = f" allowing for its pick among {m} candidates" if m > 1 else ""
    lines.append(f"Measured saving: {pct(d['measured_saving'])} "
                 f"({level} interval{among} {interval(d['measured_saving_ci'], pct)}); "
                 f"speed-up {num(d['speedup'])}x; one-sided confidence that it is faster "
                 f"{num(d['p_faster'])}"
                 + (f", {num(d['p_faster_family'])} allowing for {m} candidates"
                    if m > 1 and d.get("p_faster_family") is not None else "") + ".")
    if d["predicted_saving"] is not None:
        lines.append(f"Predicted saving (McCandlish model, B_noise = {num(d['b_noise'])} from "
                     f"{d['b_noise_source']}): {pct(d['predicted_saving'])} (no interval).")
    return lines


def summary_lines(data: dict) -> list[str]:
    ref, cb, s = data["reference"], data.get("critical_batch") or {}, data["settings"]
    lines = [f"Reference: {ref['config']} ({ref['why']}).",
             (f"Target metric from {data['metric_source']}.jsonl; geometric means across seeds "
              f"with {s['ci']:.0%} intervals (log-normal, variance pooled per algorithm); "
              f"equivalence margin x{s['margin_ratio']:.4g} on N*; smoothing: "
              f"{s['smoothing']}.")]
    if cb:
        crit = cb.get("critical_batch_departure")
        note = " (every tested B aligned: a lower bound)" if cb.get("lower_bound_only") else ""
        lines.append(f"Critical batch (departure sense): {num(crit)}{note}; first B not "
                     f"aligned: {num(cb.get('first_not_aligned_batch'))}. McCandlish B_crit "
                     f"(50%-efficiency fit): {num(cb.get('b_crit_mccandlish'))}; Zhang 20% CBS "
                     f"(model-implied): {num(cb.get('cbs_zhang_20pct_model'))}.")
    cost = data.get("cost")
    if cost:
        lines.append(f"Profiling cost: {num(cost.get('total_s'))} s (trials "
                     f"{num(cost.get('trial_train_s'))} s + decode sweep "
                     f"{num(cost.get('decode_sweep_s'))} s) = "
                     f"{num(cost.get('multiple_of_baseline_time_to_target'))}x one baseline "
                     "time to target.")
    if data.get("problem"):
        lines.append(f"Profile problem: {data['problem']}.")
    if data.get("metrics"):
        lines.append("Evaluation metrics logged: " + ", ".join(data["metrics"]) + ".")
    return lines


CONFIG_HEADER = ("configuration", "config id", "seeds", "N* samples", "T seconds",
                 "q samples/s", "predicted T", "verdict")


def config_rows(data: dict) -> list[list[str]]:
    return [[r["label"] + (" (reference)" if r["is_reference"] else ""), r["config"],
             num(r["seeds"]), median_cell(r, "samples_to_target"),
             median_cell(r, "time_to_target"), num(r["throughput"]),
             num(r["predicted_time_to_target"]), str(r["verdict"])] for r in data["configs"]]


RUN_HEADER = ("run folder", "name", "task", "configuration", "seed", "N*", "T s", "q",
              "trial", "status")


def run_cells(r: dict) -> list[str]:
    """Cells after the link column."""
    nstar = f"> {num(r['last_samples'])}" if r["censored"] else num(r["samples_to_target"])
    status = r["status"] or ""
    if r.get("stop_reason"):
        status += f" ({r['stop_reason']})"
    trial = f"{r['trial']} ({r['kind']})" if r.get("trial") else ""
    return [str(r["name"] or ""), str(r["task"] or ""), r["label"], num(r["seed"]), nstar,
            num(r["time_to_target"]), num(r["throughput"]), trial, status]


def figure_extra(key: str, fig: dict | list) -> str:
    """A data-dependent line under a caption (empty when there is nothing to add)."""
    if key == "decision_rule" and fig.get("not_plotted"):
        return "Not plotted (a ratio is unknown, e.g. a censored N*): " + \
            ", ".join(fig["not_plotted"]) + "."
    if key == "decode":
        if fig["source"] == "training_steps":
            return ("From the training steps' rollout/tokens_per_s (no decode sweep: no "
                    "roofline, plateau or memory limit).")
        ended = ("it ran every C given" if fig["stopped_by"] == "completed" else
                 f"it was stopped by {fig['stopped_by'].replace('_', ' ')}")
        return f"Engine {fig['engine']} on {fig['device']}; {ended}."
    return ""


PROBE_CHECK_TITLE = "Probe predictions against runs to the target"
PROBE_CHECK_HEADER = ["config", "probe samples", "predicted T", "measured T (seeds)",
                      "T error", "predicted T/T_ref", "measured T/T_ref", "ratio error"]


def probe_check_rows(check: dict, labels: dict | None = None) -> list[list[str]]:
    """One row per configuration with both a probe prediction and runs to the target."""
    labels = labels or {}

    def signed(x):
        return "-" if x is None else f"{100 * x:+.0f}%"

    return [[labels.get(r["config"], r["config"]), num(r["probe_samples"]),
             f"{num(r['predicted_time'])} {interval(r['predicted_time_ci'])}",
             f"{num(r['measured_time'])} {interval(r['measured_time_ci'])} ({r['seeds']})",
             signed(r["time_error"]),
             f"{num(r['predicted_ratio'])} {interval(r['predicted_ratio_ci'])}",
             num(r["measured_ratio"]), signed(r["ratio_error"])] for r in check["rows"]]


def probe_check_summary(check: dict) -> list[str]:
    s, d = check["summary"], check["decision"]
    inside, n = s["measured_inside_interval"]
    lines = [(f"probe predictions compared: {s['compared']}; median |T error| "
              f"{pct(s['median_abs_time_error'])}, median |T-ratio error| "
              f"{pct(s['median_abs_ratio_error'])}; measured T inside the predicted interval "
              f"for {inside} of {n}")]
    if check["unmatched"]:
        lines.append("predictions without runs to the target here: "
                     + ", ".join(check["unmatched"]))
    if d["probe"] is not None:
        lines.append(f"decision: probe profile {d['probe']}, these runs {d['analysis']} "
                     f"({'the same' if d['same'] else 'different'})")
    return lines
