"""`analyze`: run logs -> one JSON-ready document (what `rlbatch analyze --json` prints).

Pipeline (each step a pure function of the previous one's data): per-run N*, T, q
(crossing.py) -> configurations grouped by config id (runs.py) -> estimates and intervals
from the pooled log-normal model (stats.py, seedstats.py) -> invariance vs the reference
and verdicts (invariance.py) -> critical batch in the departure sense, McCandlish fit and
T(B) prediction (noise.py) -> verdicts and recommendation (selection.py). Only `analyze` touches files (through runs.load_runs).

A target metric that is logged but has no numeric value in any run (every value null or
not a number) is a DataError saying so and naming the first non-numeric value as
`file:line`; only a metric no run logged at all is called absent.

Default reference: the configuration whose `derived.sequences_per_step` equals its
`optimizer.reference_sequences` (preferring lr_scaling sqrt, then the most seeds), else the
one with the smallest B. No torch import.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from rlbatch.analysis import invariance, noise, registration, seedstats, selection, stats
from rlbatch.analysis.crossing import Target, metric_curve, metric_source, per_run_records
from rlbatch.analysis.runs import RunFrames, load_runs
from rlbatch.core.errors import DataError, UserError

STATISTICS = {"crossing": selection.STATISTIC,
              "stretch": "stretch: N* from a stretch of the samples axis fitted to each run's "
                         "rising curve near the target, pooled across runs (registration.py)"}
RUN_KEYS = ("run", "run_id", "seed", "samples_to_target", "time_to_target", "censored",
            "threshold", "too_easy", "first_evaluation_samples", "evaluations_before_target",
            "last_samples", "last_train_s", "throughput", "throughput_to_target", "evaluations",
            "status", "stop_code")
META_KEYS = ("sequences_per_step", "minibatch_sequences", "prompts_per_step",
             "samples_per_prompt", "lr", "lr_scaling", "algorithm", "reference_sequences",
             "schedule", "staleness")


def group_configs(records: list[dict]) -> list[dict]:
    """Configurations in display order (B ascending, then LR, then id), each with its runs."""
    groups: dict[str, dict] = {}
    for r in records:
        g = groups.setdefault(r["config"], {"config": r["config"],
                                            **{k: r[k] for k in META_KEYS}, "runs": []})
        g["runs"].append(r)
    def order(g):
        b, lr = g["sequences_per_step"], g["lr"]
        return (b is None, b or 0, lr is None, lr or 0.0, g.get("staleness") or 0, g["config"])
    return sorted(groups.values(), key=order)


def choose_reference(groups: list[dict], reference_run: str | None = None) -> tuple[str, str]:
    """(config id, why). An explicit run directory wins; else B == optimizer.reference_sequences;
    else the smallest B; else the first configuration."""
    if reference_run is not None:
        want = Path(reference_run).resolve()
        for g in groups:
            if any(Path(r["run"]).resolve() == want for r in g["runs"]):
                return g["config"], f"--reference {reference_run}"
        raise UserError("--reference: the run has no value of the target metric or was not "
                        "loaded", where=str(reference_run))
    at_b0 = [g for g in groups if g["sequences_per_step"] is not None
             and g["sequences_per_step"] == g["reference_sequences"] and not g.get("schedule")]
    if at_b0:  # the least stale first: a profile's baseline runs at the staleness of its config
        best = min(at_b0, key=lambda g: (g.get("staleness") or 0, g["lr_scaling"] != "sqrt",
                                         -len(g["runs"]), g["config"]))
        return best["config"], "sequences_per_step equals optimizer.reference_sequences"
    sized = [g for g in groups if g["sequences_per_step"] is not None]
    if sized:
        return sized[0]["config"], "smallest sequences_per_step"
    return groups[0]["config"], "first configuration (no batch sizes known)"


def _curves(frames: RunFrames, runs: list[dict], target: Target, source: str, smooth: int):
    rows = frames.run_evals if source == "evals" else frames.run_steps
    return [metric_curve(rows(r["run"]), target.metric, smooth) for r in runs]


def _run_entry(r: dict, frames: RunFrames) -> dict:
    st = frames.run_steps(r["run"])
    entry = {k: r[k] for k in RUN_KEYS}
    entry["noise_scale"] = {role: noise.second_half_median(st, col)
                            for role, col in noise.NOISE_COLUMNS.items()}
    series = {}
    for role, col in noise.NOISE_COLUMNS.items():
        s, v = noise.noise_scale_series(st, col)
        if len(s):
            series[role] = [[float(a), float(b)] for a, b in zip(s, v)]
    if series:
        entry["noise_scale_series"] = series
    return entry


SPREADS = ("pooled", "pair", "larger", "paired")
MIN_PAIRS = 3  # same-seed pairs a paired comparison needs (df >= 2); fewer: `pair`


def judge(groups: list[dict], ref_id: str, margin: float, ci: float, spread: str = "pair"
          ) -> tuple[list[dict], dict[str, dict], dict]:
    """Pure, on per-run records grouped by configuration (group_configs): each one's
    estimates and intervals, and for each non-reference configuration its comparison with
    the reference, verdict and `vs_reference`. Returns (entries, comparisons by config id,
    pooled fits by config id). `spread` (SPREADS): the run-to-run spread each comparison
    rests on (`_compare`). bench/coverage.py simulates through this function."""
    fits = stats.fit_by_algorithm(groups)
    by_id = {g["config"]: g for g in groups}
    entries = [{"config": g["config"], **{k: g[k] for k in META_KEYS}, "seeds": len(g["runs"]),
                **stats.config_stats(g["config"], g["runs"], fits[g["config"]], ci),
                "runs": g["runs"]} for g in groups]
    ref = next(e for e in entries if e["config"] == ref_id)
    ref.update(verdict="too_easy" if any(r.get("too_easy") for r in ref["runs"])
               else "reference", indication=None, invariance=None, vs_reference=None)
    comparisons = {}
    for e in entries:
        if e is ref:
            continue
        cmp = _compare(fits, by_id, e["config"], ref_id, ci, spread)
        lo, hi = cmp["log_samples_ratio_raw"]
        e.update(selection.config_verdict(e, ref, lo, hi, margin))
        e["vs_reference"] = selection.versus_baseline(e, ref, cmp)
        comparisons[e["config"]] = cmp
    return entries, comparisons, fits


def _compare(fits: dict, groups: dict, a: str, b: str, ci: float,
             spread: str = "pair") -> dict:
    """stats.compare of a with b. `pair` (the default): in a fit of the two alone, so each
    comparison rests on the spread of the two compared: a configuration noisier than the
    rest is not compared on the others' smaller spread, nor a calm one on a spread a noisy
    one inflated (docs/analysis.md, "Per-configuration spread"). `pooled`: in their shared
    pooled fit (a fit of the two alone when they belong to different pools: other
    algorithms), one spread for every configuration, the most degrees of freedom.
    `larger`: whichever of the two has the larger standard error of the log T ratio (where
    one has none, the other)."""
    if spread == "paired" and (paired := _paired(groups[a], groups[b], ci)) is not None:
        return paired
    pooled = fits[a] if fits[a] is fits[b] else None
    if spread == "pooled" and pooled is not None:
        return stats.compare(pooled, a, b, ci)
    by_pair = stats.compare(stats.fit_sweep([groups[a], groups[b]]), a, b, ci)
    if spread == "pair" or pooled is None:
        return by_pair
    by_pool = stats.compare(pooled, a, b, ci)
    se_pair, se_pool = by_pair.get("time_ratio_se"), by_pool.get("time_ratio_se")
    if se_pool is None or (se_pair is not None and se_pair > se_pool):
        return by_pair
    return by_pool


def _paired(a: dict, b: dict, ci: float) -> dict | None:
    """stats.compare's keys from same-seed pairs: each ratio's log is the mean of the
    per-seed log ratios a/b, its interval a t interval on their spread (n - 1 df). None,
    for the unpaired comparison instead, with fewer than MIN_PAIRS seeds run by both or
    where a run of such a seed did not reach the target (a bound has no paired log)."""
    by_seed = {r.get("seed"): r for r in b["runs"]}
    pairs = [(r, by_seed[r.get("seed")]) for r in a["runs"] if r.get("seed") in by_seed]
    keys = ("samples_to_target", "throughput_to_target", "time_to_target")
    if len(pairs) < MIN_PAIRS or any(x["censored"] or y["censored"] or
                                     not all(x.get(k) and y.get(k) for k in keys)
                                     for x, y in pairs):
        return None
    n, tq = len(pairs), seedstats.t_quantile(len(pairs) - 1, ci)
    out = {}
    for k in keys:
        d = np.log([x[k] / y[k] for x, y in pairs])
        m, se = float(d.mean()), float(d.std(ddof=1)) / math.sqrt(n)
        out[k] = (m, se, (m - tq * se, m + tq * se))
    (mt, set_, _), lo_hi = out["time_to_target"], out["samples_to_target"][2]
    return {
        "log_samples_ratio_raw": lo_hi,
        "log_samples_ratio_ci": [stats.finite_or_none(x) for x in lo_hi],
        "samples_ratio_ci": [math.exp(x) for x in lo_hi],
        "throughput_ratio_ci": [math.exp(x) for x in out["throughput_to_target"][2]],
        "time_ratio_ci": [math.exp(x) for x in out["time_to_target"][2]],
        "p_faster": seedstats.p_below(mt, set_, n - 1),
        "time_ratio_se": set_,
        "run_sd_log_time": set_ * math.sqrt(n / 2),  # the unpaired sd with this se at n
        "df": n - 1,
        "pairs": n,
    }


def _invariance(entry: dict, ref: dict, cmp: dict, curves: dict) -> dict:
    return {
        "log_samples_ratio": invariance.log_ratio_point(entry["samples_to_target"],
                                                        ref["samples_to_target"]),
        "log_samples_ratio_ci": cmp["log_samples_ratio_ci"],
        "normalized_area": curves["normalized_area"],
        "max_abs_diff": curves["max_abs_diff"],
        "curves": curves,
    }


def _critical_batch(entries: list[dict], ref: dict) -> dict:
    # one B per configuration, at the reference's staleness
    fam = selection.static(selection.family(entries, ref), ref.get("staleness") or 0)
    out = invariance.critical_batch_departure(fam)
    pts = [(e["sequences_per_step"], e["samples_to_target"]) for e in fam
           if e["sequences_per_step"] is not None and e["samples_to_target"] is not None]
    fit = noise.mccandlish_fit([p[0] for p in pts], [p[1] for p in pts])
    out.update(b_crit_mccandlish=fit["b_crit_mccandlish"],
               cbs_zhang_20pct_model=fit["cbs_zhang_20pct_model"], mccandlish_fit=fit)
    return out


def _predict(entries: list[dict], ref: dict, fit: dict) -> dict:
    """T(B) from B_noise, in the batch unit B_noise is measured in (`noise.compared_batch`):
    the optimizer minibatch for the logged B_simple, sequences per step for the fit."""
    b_noise, source = noise.choose_b_noise([e["noise_scale"]["actor"] for e in entries], fit)
    key = noise.compared_batch(source)
    for e in selection.static(entries, ref.get("staleness") or 0):  # one B per run
        e.update(noise.predict_time(e[key], e["throughput"], ref["samples_to_target"], ref[key],
                                    b_noise))
    return {"b_noise": b_noise, "b_noise_source": source, "b_noise_batch": key,
            "reference_samples_to_target": ref["samples_to_target"],
            "reference_sequences_per_step": ref["sequences_per_step"],
            "reference_minibatch_sequences": ref["minibatch_sequences"]}


def _warnings(frames: RunFrames, missing: list[str], entries: list[dict]) -> list[str]:
    out = list(frames.warnings)
    out += [f"{d}: no finite value of the target metric; counted as a censored run"
            for d in missing]
    out += [f"{e['config']}: {e['seeds']} seed(s); a verdict needs at least "
            f"{selection.MIN_SEEDS} seeds of it and of the reference" for e in entries
            if e["seeds"] < selection.MIN_SEEDS]
    out += [f"{e['config']}: target too easy: met by the first evaluation at "
            f"{_first_eval(e)} samples; left out of every decision"
            for e in entries if e["verdict"] == "too_easy"]
    return out


def _first_eval(entry: dict) -> str:
    firsts = [r["first_evaluation_samples"] for r in entry["runs"]
              if r.get("too_easy") and r.get("first_evaluation_samples") is not None]
    return f"{min(firsts):,.0f}" if firsts else "?"


def _controls(entries: list[dict], ref: dict, fits: dict, groups: dict,
              ci: float) -> list[dict]:
    """Each configuration of the reference's algorithm with another LR rule (the fixed-LR
    control) against its twin of the reference's family at the same B."""
    k = ref.get("staleness") or 0
    fam = selection.static(selection.family(entries, ref), k)
    out = []
    for e in selection.static(entries, k):
        if e["algorithm"] != ref["algorithm"] or e["lr_scaling"] == ref["lr_scaling"]:
            continue
        twin = next((f for f in fam if f["sequences_per_step"] == e["sequences_per_step"]),
                    None)
        if twin is not None:
            cmp = _compare(fits, groups, e["config"], twin["config"], ci)
            out.append(selection.control_versus_twin(e, twin, cmp))
    return out


def _stale(entries: list[dict], ref: dict, fits: dict, groups: dict, ci: float) -> list[dict]:
    """Each configuration of the reference's family at another staleness than the
    reference's, against its twin at the reference's (same B and LR; at B0 the reference
    itself): what the staleness cost in samples and bought in throughput."""
    fam = selection.family(entries, ref)
    k = ref.get("staleness") or 0
    out = []
    for e in fam:
        if (e.get("staleness") or 0) == k or e.get("schedule"):
            continue
        twin = next((f for f in selection.static(fam, k)
                     if (f["sequences_per_step"], f["lr"]) == (e["sequences_per_step"], e["lr"])),
                    None)
        if twin is not None:
            cmp = _compare(fits, groups, e["config"], twin["config"], ci)
            out.append(selection.stale_versus_twin(e, twin, cmp))
    return out


def _problem(ref: dict) -> str | None:
    if ref["verdict"] == "too_easy":
        return (f"target too easy: the reference met it by the first evaluation at "
                f"{_first_eval(ref)} samples; raise the target or evaluate more often")
    if ref["time_to_target"] is None:
        return "the reference never reached the target (its median N* is censored)"
    return None


def analyze_frames(frames: RunFrames, target: Target, *, reference_run: str | None = None,
                   margin: float = invariance.DEFAULT_MARGIN, ci: float = stats.DEFAULT_CI,
                   n_boot: int = stats.DEFAULT_BOOT, seed: int = 0, smooth: int = 1,
                   statistic: str = "crossing", alpha: float = selection.DEFAULT_ALPHA,
                   spread: str = "pair") -> dict:
    """Pure: frames -> the analysis document (see docs/analysis.md for every key).
    `statistic`: what a run's N* is, its first crossing of the target or the stretch of
    registration.py (STATISTICS). `alpha`: the one-sided level of the decision (a profile's
    follow-up look may spend less, profile.alpha_spending). `spread`: what each comparison's
    run-to-run spread is (judge, SPREADS)."""
    _check_settings(margin, ci, n_boot, alpha)
    if statistic not in STATISTICS:
        raise UserError(f"--statistic must be one of {', '.join(STATISTICS)}, not {statistic!r}")
    if spread not in SPREADS:
        raise UserError(f"--spread must be one of {', '.join(SPREADS)}, not {spread!r}")
    check_metric_values(frames, target.metric)
    source = metric_source(frames, target.metric)
    records = per_run_records(frames, target, smooth)
    missing = [r["run"] for r in records if r["evaluations"] == 0]
    groups = group_configs(records)
    ref_id, why = choose_reference(groups, reference_run)
    if statistic == "stretch":
        rows = frames.run_evals if source == "evals" else frames.run_steps
        groups = registration.stretched_groups(
            groups, {r["run"]: metric_curve(rows(r["run"]), target.metric, smooth)
                     for g in groups for r in g["runs"]}, ref_id)
    entries, comparisons, fits = judge(groups, ref_id, margin, ci, spread)
    by_id = {g["config"]: g for g in groups}
    ref = next(e for e in entries if e["config"] == ref_id)
    ref_curves = _curves(frames, by_id[ref_id]["runs"], target, source, smooth)
    ref_idx = stats.boot_indices(len(by_id[ref_id]["runs"]), n_boot, seed, ref_id)
    for g, e in zip(groups, entries):
        e["noise_scale"] = noise.config_noise_summary([frames.run_steps(r["run"])
                                                       for r in g["runs"]])
        e["runs"] = [_run_entry(r, frames) for r in g["runs"]]
        if e is ref:
            continue
        idx = stats.boot_indices(len(g["runs"]), n_boot, seed, g["config"])
        curves = invariance.invariance_curves(
            ref_curves, _curves(frames, g["runs"], target, source, smooth), ref_idx, idx, ci)
        e["invariance"] = _invariance(e, ref, comparisons[e["config"]], curves)
    critical = _critical_batch(entries, ref)
    return json_safe({
        "target": {**target.as_dict(), "thresholds": _thresholds(records)},
        "metric_source": source,
        "reference": {"config": ref_id, "why": why},
        "settings": {**_settings(margin, ci, n_boot, seed, smooth), "statistic": statistic,
                     "spread": spread},
        "configs": entries, "critical_batch": critical,
        "prediction": _predict(entries, ref, critical["mccandlish_fit"]),
        "recommendation": _recommend(entries, ref_id, statistic, alpha, ci, spread),
        "fixed_lr_controls": _controls(entries, ref, fits, by_id, ci),
        "staleness": _stale(entries, ref, fits, by_id, ci),
        "problem": _problem(ref),
        "warnings": _warnings(frames, missing, entries),
    })


def _recommend(entries: list[dict], ref_id: str, statistic: str, alpha: float,
               ci: float, spread: str = "pair") -> dict | None:
    ref = next(e for e in entries if e["config"] == ref_id)
    adjusted = selection.family_confidence(entries, ref)
    m = len(selection.family(entries, ref)) - 1
    for e in entries:
        if e is not ref and e.get("vs_reference"):
            e["vs_reference"].update(p_faster_family=adjusted.get(e["config"]), family_size=m)
    rec = selection.recommend(entries, ref_id, alpha, ci)
    if rec is not None:
        rec["statistic"] = STATISTICS[statistic]
        rec["spread"] = spread
        if spread == "paired":
            rec["comparison"] = (f"paired: same-seed log ratios where at least {MIN_PAIRS} "
                                 "seeds of both configurations reached the target (a t "
                                 "interval on n - 1 df), the two configurations' unpaired "
                                 "fit otherwise (docs/analysis.md, 'Paired, by seed')")
    return rec


def check_metric_values(frames: RunFrames, metric: str) -> None:
    """A DataError when `metric` is logged (a column of the evals or steps) but no run has a
    numeric value of it; the message counts what was dropped as non-numeric and names the
    first. (A metric no run logged is left to `metric_source`, which calls it absent.)"""
    logged = [n for n, df in (("evals", frames.evals), ("steps", frames.steps))
              if metric in df.columns]
    if not logged or any(frames_have_number(getattr(frames, n)[metric]) for n in logged):
        return
    places = frames.non_numeric.get(metric, [])
    dropped = sum(count for _, _, count in places)
    why = "every value is null or infinite"
    if places:
        place, value, _ = places[0]
        why = (f"{dropped} value(s) are not numbers (dropped), the first at {place} "
               f"({value!r}), and no other value is a finite number")
    raise DataError(f"target metric '{metric}' is logged (in {' and '.join(logged)}) but "
                    f"has no numeric value in any run: {why}")


def frames_have_number(col: pd.Series) -> bool:
    """Whether a cleaned frame column holds at least one finite number."""
    return bool(np.isfinite(pd.to_numeric(col, errors="coerce").to_numpy(dtype=float)).any())


def _thresholds(records: list[dict]) -> list:
    """The distinct absolute thresholds the runs were judged against (one for an absolute
    target; per run step-0 value + gain for a relative one)."""
    return sorted({r["threshold"] for r in records if r["threshold"] is not None})


def json_safe(obj):
    """Plain JSON values: numpy scalars -> Python, non-finite floats -> None (JSON has no
    NaN), tuples -> lists."""
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    if hasattr(obj, "item") and not isinstance(obj, (str, bytes)):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def _check_settings(margin: float, ci: float, n_boot: int, alpha: float = 0.05) -> None:
    if not 0 < alpha < 0.5:
        raise UserError(f"--alpha must be in (0, 0.5), got {alpha}")
    if not (margin > 0 and math.isfinite(margin)):
        raise UserError(f"--margin must be a positive log ratio, got {margin}")
    if not (0 < ci < 1):
        raise UserError(f"--ci must be in (0, 1), got {ci}")
    if n_boot < 1:
        raise UserError(f"--bootstrap must be >= 1 resamples, got {n_boot}")


def _settings(margin: float, ci: float, n_boot: int, seed: int, smooth: int) -> dict:
    return {
        "ci": ci, "bootstrap_resamples": n_boot, "bootstrap_seed": seed,
        "margin": margin, "margin_ratio": math.exp(margin),
        "smoothing": "none" if smooth == 1 else f"trailing mean of {smooth} evaluations",
        "estimates": "geometric means across seeds with intervals from a log-normal model, "
                     "variance pooled per algorithm, censored runs by their bounds (Tobit)",
        "bootstrap": "pointwise bands of the invariance curves only",
        "censored_median": "null when it involves a censored run (more than half censored, "
                           "or exactly half with an even number of seeds)",
    }


def config_target(frames: RunFrames) -> Target:
    """The runs' own target when all their configs agree on one (`--target` omitted): an
    absolute `value`, or a relative `gain` over each run's step-0 evaluation."""
    found = set()
    for c in frames.configs.values():
        t = c.get("target") or {}
        metric, value, gain = t.get("metric"), t.get("value"), t.get("gain")
        if not isinstance(metric, str):
            continue
        if isinstance(gain, (int, float)) and not isinstance(gain, bool):
            found.add((metric, None, float(gain)))
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            found.add((metric, float(value), None))
    if len(found) != 1:
        raise UserError("--target is required (the runs' configs name no single target)")
    metric, value, gain = found.pop()
    return Target(metric, value, gain=gain)


def analyze(paths: list[str | Path], target: Target, *, reference_run: str | None = None,
            **kwargs) -> dict:
    """Load the runs under `paths` (plus `reference_run`) and analyze them."""
    all_paths = list(paths) + ([reference_run] if reference_run is not None else [])
    return analyze_frames(load_runs(all_paths), target, reference_run=reference_run, **kwargs)
