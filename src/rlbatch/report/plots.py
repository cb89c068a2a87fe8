"""Matplotlib renderers of the report's figures: figure data (analysis/figures.py) in, PNG
bytes out. They draw only: every number comes from the data dicts.

matplotlib is imported lazily and only through its object API with the Agg canvas (no
pyplot, no global backend switch), so importing this module costs nothing and reports render
headless. Text from configs and logs is drawn with `$` escaped (no mathtext surprises).
"""

from __future__ import annotations

import io

from rlbatch.analysis import selection

VERDICT_MARKERS = {"reference": "*", "aligned": "o", "departed": "X", "inconclusive": "s",
                   "unconfirmed": "d", "slower": "v", "too_easy": "P", "diverged": "x"}
VERDICT_COLORS = (("aligned", "tab:blue"), ("departed", "tab:red"), ("inconclusive", "tab:gray"),
                  ("unconfirmed", "tab:olive"), ("slower", "tab:orange"),
                  ("too_easy", "tab:purple"), ("diverged", "tab:brown"))
PHASE_COLORS = {"rollout": "#4c78a8", "reward": "#f58518", "actor": "#54a24b",
                "critic": "#e45756", "other": "#b0b0b0", "reference": "#72b7b2",
                "noise_scale": "#b279a2"}
X_LABELS = {"samples": "cumulative samples (retained responses)",
            "train_s": "training seconds (evaluation excluded)"}
DPI = 100
REJECTED = tuple(v for v in selection.REJECTED if v != "reference")


def _t(text) -> str:
    """Text for matplotlib: `$` escaped so it is never parsed as mathtext."""
    return str(text).replace("$", r"\$")


def _figure(width: float = 8.0, height: float = 4.5):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def png_bytes(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI)
    return buf.getvalue()


def _colors(n: int) -> list:
    from matplotlib import colormaps

    cmap = colormaps["viridis"]
    return [cmap(0.9 * i / max(n - 1, 1)) for i in range(n)]


def _yerr(value: float, ci) -> list[list[float]]:
    lo = value if not ci or ci[0] is None else ci[0]
    hi = value if not ci or ci[1] is None else ci[1]
    return [[max(value - lo, 0.0)], [max(hi - value, 0.0)]]


def invariance(d: dict):
    fig = _figure()
    ax = fig.add_subplot()
    for c, color in zip(d["configs"], _colors(len(d["configs"]))):
        ref = c["config"] == d["reference"]
        ax.plot(c["x"], c["mean"], color=color, lw=2.6 if ref else 1.4,
                label=_t(f"{c['label']} [{c['verdict']}, {c['seeds']} seed(s)]"))
        ax.fill_between(c["x"], c["lo"], c["hi"], color=color, alpha=0.18, lw=0)
        for run in c.get("changes") or []:  # where a batch schedule changed B
            for x, _ in run:
                ax.axvline(x, color=color, ls=":", lw=0.8, alpha=0.7)
    if any(c.get("changes") for c in d["configs"]):
        ax.plot([], [], color="gray", ls=":", lw=0.8, label="B changed (batch schedule)")
    if d["target"] is not None:
        ax.axhline(d["target"], color="k", ls="--", lw=1, label=_t(f"target {d['target']:.4g}"))
    ax.set_xlabel(X_LABELS.get(d["x"], _t(d["x"])))
    ax.set_ylabel(_t(d["metric"]))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    return fig


def _scaling_panel(ax, d: dict, key: str, ylabel: str) -> None:
    families = sorted({str(p["lr_scaling"]) for p in d["points"]})
    for fam, color in zip(families, _colors(len(families))):
        pts = sorted([p for p in d["points"] if str(p["lr_scaling"]) == fam],
                     key=lambda p: p["sequences_per_step"])
        known = [p for p in pts if p[key] is not None]
        ax.plot([p["sequences_per_step"] for p in known], [p[key] for p in known], color=color,
                lw=1, label=_t(f"lr_scaling {fam}"))
        for p in known:
            ax.errorbar(p["sequences_per_step"], p[key], yerr=_yerr(p[key], p[f"{key}_ci"]),
                        fmt=VERDICT_MARKERS.get(p["verdict"], "o"), color=color, ms=8, capsize=3)
        for p in pts:
            if p[key] is None and p[f"{key}_lower_bound"] is not None:
                ax.plot(p["sequences_per_step"], p[f"{key}_lower_bound"], marker="^",
                        color=color, ms=9, ls="none")
    if d.get("critical_batch_departure"):
        ax.axvline(d["critical_batch_departure"], color="tab:green", ls=":",
                   label=f"critical batch (departure) {d['critical_batch_departure']}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("B (sequences per step)")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)


def scaling(d: dict):
    fig = _figure(10, 4.2)
    a1, a2 = fig.subplots(1, 2)
    _scaling_panel(a1, d, "samples_to_target", "N* (samples to target)")
    _scaling_panel(a2, d, "time_to_target", "T (training seconds to target)")
    a1.legend(fontsize=7)
    note = ("markers: star reference, circle aligned, cross departed, square inconclusive, "
            "diamond unconfirmed, down-triangle slower, up-triangle censored (> bound)")
    if d.get("b_crit_mccandlish"):
        note += f"; McCandlish B_crit {d['b_crit_mccandlish']:.4g}"
    fig.suptitle(note, fontsize=8)
    return fig


def decision_rule(d: dict):
    fig = _figure(6.5, 5.5)
    ax = fig.add_subplot()
    xs = [p["samples_ratio"] for p in d["points"]]
    ys = [p["throughput_ratio"] for p in d["points"]]
    lo, hi = min(xs + ys + [1.0]) * 0.8, max(xs + ys + [1.0]) * 1.25
    ax.plot([lo, hi], [lo, hi], color="k", lw=1, label="break-even y = x")
    ax.fill_between([lo, hi], [lo, hi], [hi, hi], color="tab:green", alpha=0.08,
                    label="faster than the reference (above y = x)")
    for verdict, color in VERDICT_COLORS:
        pts = [p for p in d["points"] if p["verdict"] == verdict]
        out = verdict in REJECTED  # hollow, and said in the key and beside the point
        for i, p in enumerate(pts):
            ax.errorbar(p["samples_ratio"], p["throughput_ratio"],
                        xerr=_yerr(p["samples_ratio"], p["samples_ratio_ci"]),
                        yerr=_yerr(p["throughput_ratio"], p["throughput_ratio_ci"]),
                        fmt=VERDICT_MARKERS[verdict], color=color, ms=8, capsize=3,
                        mfc="white" if out else color,
                        label=(f"{verdict}: rejected" if out else verdict) if i == 0 else None)
            ax.annotate(_t(p["label"] + (" (rejected)" if out else "")),
                        (p["samples_ratio"], p["throughput_ratio"]),
                        textcoords="offset points", xytext=(6, 6), fontsize=7)
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel("N* ratio (candidate / reference)")
    ax.set_ylabel("q ratio (candidate / reference)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")
    return fig


def decode(d: dict):
    fig = _figure(7.5, 4.5)
    ax = fig.add_subplot()
    pts = d["points"]
    cs = [p["concurrency"] for p in pts]
    ax.plot(cs, [p["tokens_per_s"] for p in pts], "o-", color="tab:blue",
            label="measured tokens/s")
    over = [p for p in pts if not p["within_latency_cap"]]
    if over:
        ax.plot([p["concurrency"] for p in over], [p["tokens_per_s"] for p in over], "o",
                mfc="white", color="tab:red", label="over the latency cap")
    roof = [p for p in pts if p["roofline_tokens_per_s"] is not None]
    if roof:
        ax.plot([p["concurrency"] for p in roof], [p["roofline_tokens_per_s"] for p in roof],
                "x--", color="tab:gray", label="roofline bound (tokens/s)")
    if d["plateau_concurrency"] is not None:
        ax.axvline(d["plateau_concurrency"], color="tab:green", ls=":",
                   label=f"plateau C = {d['plateau_concurrency']}")
    if d["chosen_concurrency"] is not None and d["chosen_concurrency"] in cs:
        ax.plot([d["chosen_concurrency"]], [pts[cs.index(d["chosen_concurrency"])]
                                            ["tokens_per_s"]], "*", ms=16, color="tab:orange",
                label=f"chosen C = {d['chosen_concurrency']}")
    if d["memory_limit_in_view"]:
        ax.axvline(d["memory_limit_concurrency"], color="tab:red", ls="-.",
                   label=f"KV memory limit C = {d['memory_limit_concurrency']}")
    elif d["memory_limit_concurrency"] is not None:
        ax.set_title(f"KV memory limit at C = {d['memory_limit_concurrency']:,} (off the axis)",
                     fontsize=9)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("decode concurrency C (sequences in flight)")
    ax.set_ylabel("generated tokens / s")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return fig


def phases(d: dict):
    rows = d["configs"]
    fig = _figure(8, 1.2 + 0.45 * len(rows))
    ax = fig.add_subplot()
    left = [0.0] * len(rows)
    ys = list(range(len(rows)))
    for ph in d["phases"]:
        vals = [r["seconds_per_1k_samples"][ph] for r in rows]
        ax.barh(ys, vals, left=left, color=PHASE_COLORS.get(ph, None), label=_t(ph))
        left = [a + b for a, b in zip(left, vals)]
    ax.set_yticks(ys, [_t(r["label"]) for r in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("seconds per 1,000 samples")
    fig.legend(fontsize=7, ncols=min(len(d["phases"]), 7), loc="outside upper center")
    ax.grid(axis="x", alpha=0.3)
    return fig


def noise_scale(d: dict):
    roles = [r for r in ("actor", "critic") if d.get(r)]
    fig = _figure(5.0 * len(roles), 4.2)
    axes = fig.subplots(1, len(roles), squeeze=False)[0]
    for ax, role in zip(axes, roles):
        configs = list(dict.fromkeys(s["config"] for s in d[role]))
        color = dict(zip(configs, _colors(len(configs))))
        seen = set()
        for s in d[role]:
            ax.plot(s["samples"], s["values"], color=color[s["config"]], lw=1.2,
                    label=None if s["config"] in seen else _t(s["label"]))
            seen.add(s["config"])
        ax.set_yscale("log")
        ax.set_title(f"{role}: B_simple = tr(Sigma)/|G|^2", fontsize=9)
        ax.set_xlabel(X_LABELS["samples"])
        ax.set_ylabel("B_simple (sequences)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return fig


def lr_control(pairs: list):
    fig = _figure(10, 3.8 * len(pairs))
    axes = fig.subplots(len(pairs), 2, squeeze=False)
    for (a1, a2), p in zip(axes, pairs):
        for side, color in (("sqrt", "tab:blue"), ("fixed", "tab:red")):
            c = p[side]["curve"]
            if c:
                a1.plot(c["x"], c["mean"], color=color, label=_t(p[side]["label"]))
                a1.fill_between(c["x"], c["lo"], c["hi"], color=color, alpha=0.18, lw=0)
        if p["target"] is not None:
            a1.axhline(p["target"], color="k", ls="--", lw=1)
        a1.set_xlabel(X_LABELS["samples"])
        a1.set_ylabel(_t(p["metric"]))
        a1.set_title(f"B = {p['sequences_per_step']}: fixed LR vs sqrt-scaled", fontsize=9)
        a1.grid(alpha=0.3)
        if p["sqrt"]["curve"] or p["fixed"]["curve"]:
            a1.legend(fontsize=7)
        names = ["N* ratio", "T ratio", "q ratio"]
        vals = [p["samples_ratio"], p["time_ratio"], p["throughput_ratio"]]
        shown = [(n, v) for n, v in zip(names, vals) if v is not None]
        a2.bar([n for n, _ in shown], [v for _, v in shown], color="tab:red", alpha=0.7)
        for i, (_, v) in enumerate(shown):
            a2.annotate(f"{v:.2f}x", (i, v), ha="center", va="bottom", fontsize=8)
        a2.axhline(1.0, color="k", lw=1)
        a2.set_ylabel("fixed LR / sqrt-scaled")
        a2.grid(axis="y", alpha=0.3)
    return fig


RENDERERS = {"invariance_samples": invariance, "invariance_time": invariance,
             "scaling": scaling, "decision_rule": decision_rule, "decode": decode,
             "phases": phases, "noise_scale": noise_scale, "lr_control": lr_control}


def render_png(key: str, data) -> bytes:
    """PNG bytes of figure `key` drawn from its data."""
    return png_bytes(RENDERERS[key](data))
