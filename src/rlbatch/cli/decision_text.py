"""The decision in words, shared by `rlbatch analyze` and `rlbatch profile` (renders only:
every number comes from the analysis document; see docs/analysis.md for the rules)."""

from __future__ import annotations

from rlbatch.analysis.figures import short_labels
from rlbatch.analysis.labels import confidence, size_words


def num(x, spec: str = ".3g") -> str:
    return "-" if x is None else format(x, spec)


def interval(ci) -> str:
    if not ci or ci[0] is None and ci[1] is None:
        return ""
    lo, hi = ci
    return f" [{num(lo)}, {'inf' if hi is None else num(hi)}]"


def ratios(vs: dict) -> str:
    """`T 0.81 [0.7, 0.93] = N* 1.02 [..] / q 1.26 [..], confidence faster 0.97 (0.91
    allowing for 3 candidates)` (intervals only when both sides have >= 2 seeds)."""
    c = confidence(vs)
    return (f"T ratio {num(vs.get('time_ratio'))}{interval(vs.get('time_ratio_ci'))} = "
            f"N* ratio {num(vs.get('samples_ratio'))}{interval(vs.get('samples_ratio_ci'))} / "
            f"q ratio {num(vs.get('throughput_ratio'))}{interval(vs.get('throughput_ratio_ci'))}"
            + (f", {c}" if c else ""))


def decision_lines(doc: dict, concurrency: int | None = None) -> list[str]:
    """The decision, what it rests on, what was screened out, and what to run next."""
    entries = {e["config"]: e for e in doc["configs"]}
    labels = short_labels(doc["configs"])
    rec = doc.get("recommendation")
    ci = f"{doc['settings']['ci']:.0%}"
    if rec is None:
        return [f"decision: none ({doc.get('problem') or 'the reference has no time to target'})"]
    return (_headline(rec, entries[rec["config"]], ci, concurrency)
            + _compared_lines(rec, entries, labels)
            + _screened_lines(doc, rec, entries, labels)
            + _closing_lines(doc, rec, labels))


def _headline(rec: dict, e: dict, ci: str, concurrency: int | None) -> list[str]:
    """The `decision:` line and the `evidence:` line."""
    where = (f"P={e['prompts_per_step']} G={e['samples_per_prompt']} (B={e['sequences_per_step']})"
             f", lr={num(e['lr'])}" if not e.get("schedule") else
             f"the batch schedule {e['schedule']} (from P={e['prompts_per_step']} "
             f"G={e['samples_per_prompt']}, the LR by the sqrt rule at each B)") + \
        (f", rollout.max_staleness={e['staleness']}" if e.get("staleness") else "") + \
        (f", C={concurrency}" if concurrency else "")
    lines = []
    if rec["is_reference"]:
        lines.append(f"decision: keep the baseline {where}")
    else:
        lines.append(f"decision: {where}: {num(rec['speedup_vs_reference'])}x faster than the "
                     f"baseline, across {rec['seeds']} seeds" + _pick_interval(rec, ci))
    alpha = rec.get("alpha", 0.05)
    why = {"established": f"its time-to-target advantage is shown at one-sided {alpha:.0%}",
           "none_faster": "no candidate was shown faster, and none is left open (each was "
                          "stopped early, departed, or slower at its point estimate)",
           "not_enough": "no candidate's advantage is shown yet",
           "nothing_compared": "no candidate of the baseline's family has runs to compare "
                               "(each failed or none was run): nothing was compared"
           }[rec["evidence"]]
    nstar = ("N* from a stretch fitted to each run's rising curve"
             if str(rec.get("statistic", "")).startswith("stretch")
             else "N* at each run's first crossing of the target")
    paired = str(rec.get("comparison", "unpaired")).split(":", 1)[0]
    spread = {"pair": ", each on the spread of the two compared",
              "pooled": ", on one spread pooled over every configuration",
              "larger": ", each on the larger of the pair's and the pooled spread",
              "paired": " where 3 or more seeds of both crossed, unpaired otherwise"
              }.get(rec.get("spread"), "")
    lines.append(f"evidence: {rec['evidence']} ({why}); geometric means across seeds, {ci} "
                 f"intervals, each on its own (docs/analysis.md, 'Two intervals read "
                 f"together'), {paired} comparisons{spread}, T = N*/q, {nstar}")
    return lines


def _pick_interval(rec: dict, ci: str) -> str:
    """`; T ratio 0.66 [0.5, 0.87], 90% allowing for its pick among 3 candidates` (the
    recommendation's selection-adjusted interval, selection.selected_interval)."""
    t = rec.get("time_ratio_ci")
    if not t or None in t:
        return ""
    m = rec.get("candidates_analysed") or 1
    allowing = f", {ci} allowing for its pick among {m} candidates" if m > 1 else f", {ci}"
    return (f"; T ratio {num(1 / rec['speedup_vs_reference'])}{interval(t)}{allowing}"
            if rec.get("speedup_vs_reference") else "")


# how a verdict reads on a decision line: `slower` is a stop, not a measurement (half or
# more of the configuration's runs trained past the reference's time to target without
# reaching the target: selection.config_verdict), so it says what was shown
SHOWN = {"slower": "not shown faster"}
# the verdicts on a learning curve (alignment on the samples axis), which say nothing of
# speed: a candidate can be shown faster while its alignment is inconclusive, so they read
# as the curve's
CURVE = ("aligned", "inconclusive", "departed", "fewer_samples")


def verdict_words(verdict: str) -> str:
    """How a configuration's verdict reads on its decision line."""
    if verdict in CURVE:
        return f"curve {verdict.replace('_', ' ')}"
    return SHOWN.get(verdict, verdict)


def _short(entry: dict) -> str:
    """`, 2 not reaching the target`: runs that ended without crossing (stopped early, or at
    the budget), which enter N* and T as bounds, not as crossings (docs/analysis.md)."""
    n = entry.get("censored_runs") or 0
    return f", {n} not reaching the target" if n else ""


def _compared_lines(rec: dict, entries: dict, labels: dict) -> list[str]:
    """One line per configuration the decision compared."""
    lines = []
    rejected = {r["config"]: r["why"] for r in rec.get("rejected") or []}
    for c in rec["compared"]:
        ce = entries[c["config"]]
        head = (f"  {labels[c['config']]} ({c['seeds']} seeds{_short(ce)}, "
                f"{verdict_words(c['verdict'])})")
        sep = ":"
        if c["config"] in rejected:
            head, sep = f"{head} {rejected[c['config']]};", ""
        if ce.get("vs_reference"):
            lines.append(f"{head}{sep} {ratios(ce['vs_reference'])}")
        else:
            lines.append(f"{head}: T {num(ce['time_to_target'])} s"
                         f"{interval(ce['time_to_target_ci'])}")
    return lines


def _screened_lines(doc: dict, rec: dict, entries: dict, labels: dict) -> list[str]:
    """The reference family's configurations left out of the comparison, with their verdicts."""
    compared = {c["config"] for c in rec["compared"]}
    ref = entries[doc["reference"]["config"]]
    screened = [x for x in doc["configs"] if x["config"] not in compared
                and x["verdict"] != "reference" and x["algorithm"] == ref["algorithm"]
                and x["lr_scaling"] == ref["lr_scaling"]]  # other LR rules: control line
    lines = []
    for x in screened:
        note = {"slower": "not shown faster (stopped early)"}.get(x["verdict"], x["verdict"]) \
            + (f" (one seed suggests {x['indication']})"
                               if x["verdict"] == "unconfirmed" and x.get("indication") else "")
        vs = x.get("vs_reference") or {}
        lines.append(f"  screened: {labels[x['config']]} ({x['seeds']} seed(s){_short(x)}): "
                     f"{note}; T ratio {num(vs.get('time_ratio'))}")
    return lines


def stale_line(c: dict, labels: dict) -> str:
    """A configuration with stale rollouts against its synchronous twin: what it cost in
    samples, what it bought in throughput, the net."""
    head = f"staleness {c['staleness']} at B={c['sequences_per_step']} vs its twin at " + \
        (f"staleness {c['twin_staleness']}" if c.get("twin_staleness") else "0 (synchronous)")
    if c["time_ratio"] is None:
        return (f"{head} {labels[c['twin']]}: not compared (one of them has no time to "
                "target: stopped before the target)")
    return (f"{head}: N* ratio {num(c['samples_ratio'])}{interval(c['samples_ratio_ci'])} "
            f"(the samples it cost), throughput ratio {num(c['throughput_ratio'])} (what it "
            f"bought), T ratio {num(c['time_ratio'])}{interval(c['time_ratio_ci'])}")


def _closing_lines(doc: dict, rec: dict, labels: dict) -> list[str]:
    """Fixed-LR controls, the reference-LR note, the seed plan and `next:`."""
    lines = []
    for c in doc.get("fixed_lr_controls") or []:
        name = labels[c["control"]].removesuffix(" none")  # the line says its LR is fixed
        if c["time_ratio"] is None:
            lines.append(f"fixed-LR control {name} vs its sqrt twin "
                         f"{labels[c['twin']]}: not compared (the control or its twin has no "
                         "time to target: stopped before the target)")
            continue
        lines.append(f"fixed-LR control {name} vs its sqrt twin: N* ratio "
                     f"{num(c['samples_ratio'])}{interval(c['samples_ratio_ci'])}, T ratio "
                     f"{num(c['time_ratio'])}{interval(c['time_ratio_ci'])}"
                     + ("; faster than its twin across seeds, at the lower LR: the sqrt "
                        "rule's LR overshoots here (eta0 above its best at B0, or the best LR "
                        "grows more slowly than sqrt(B/B0))"
                        if c.get("scaled_lr_too_high", c["eta0_may_be_under_tuned"]) else ""))
    for c in doc.get("staleness") or []:
        lines.append(stale_line(c, labels))
    check = rec.get("reference_lr_check")
    if check:
        lines.append(f"note: {check['note']}")
    for p in rec.get("plan") or []:
        if p.get("detectable_time_ratio") is not None:
            lines.append(f"  with {p['seeds'][0]} + {p['seeds'][1]} seeds, {size_words(p)}"
                         f" vs the baseline resolves a T ratio of "
                         f"{num(p['detectable_time_ratio'])} or less (80% power)")
    if rec.get("next"):
        lines.append(f"next: {rec['next']}")
    return lines
