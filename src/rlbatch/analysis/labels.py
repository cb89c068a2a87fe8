"""Labels and small number helpers shared by the figure and table data (no torch).

`config_labels`: the report's labels, `B=256 (32x8) lr=0.000141 sqrt`; `short_labels`: the
CLI's 80-column labels, `B256 lr1.41e-4`; `target_line`: the absolute target a figure draws.
"""

from __future__ import annotations

import math


def finite_float(x) -> float | None:
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


def ratio_or_none(num, den) -> float | None:
    return None if num is None or not den else finite_float(num / den)


def size_words(e: dict) -> str:
    """`B=256`, and `staleness k` for rollouts decoded ahead (k above 0): how a decision's
    lines name a configuration's batch."""
    k = e.get("staleness") or 0
    return f"B={e['sequences_per_step']}" + (f" staleness {k}" if k else "")


def config_labels(entries: list[dict]) -> dict[str, str]:
    """Config id -> a short label `B=256 (32x8) lr=0.000141 sqrt` (`staleness 1` added for
    rollouts decoded ahead), led by the algorithm
    (`PPO B=...`) when the entries mix algorithms; labels that would still collide get the
    config id's hash appended."""
    labels = {}
    mixed = len({e.get("algorithm") for e in entries if e.get("algorithm")}) > 1
    for e in entries:
        b = e.get("sequences_per_step")
        if b is None:
            labels[e["config"]] = str(e["config"])
            continue
        parts = [f"B={b}" if not e.get("schedule") else f"B {e['schedule']}"]
        if mixed and e.get("algorithm"):
            parts.insert(0, str(e["algorithm"]).upper())
        if e.get("prompts_per_step") is not None and e.get("samples_per_prompt") is not None:
            parts.append(f"({e['prompts_per_step']}x{e['samples_per_prompt']})")
        if e.get("lr") is not None:
            parts.append(f"lr={e['lr']:.3g}")
        if e.get("lr_scaling"):
            parts.append(str(e["lr_scaling"]))
        if e.get("staleness"):
            parts.append(f"staleness {e['staleness']}")
        labels[e["config"]] = " ".join(parts)
    counts: dict[str, int] = {}
    for lab in labels.values():
        counts[lab] = counts.get(lab, 0) + 1
    return {c: (f"{lab} #{c.rsplit('-', 1)[-1][:6]}" if counts[lab] > 1 else lab)
            for c, lab in labels.items()}


def target_line(doc: dict) -> float | None:
    """The absolute target to draw: the configured value, or for a relative target the one
    threshold all runs share (None when they differ: each run then has its own)."""
    t = doc["target"]
    if t.get("value") is not None:
        return t["value"]
    thresholds = t.get("thresholds") or []
    return thresholds[0] if len(thresholds) == 1 else None


def short_labels(entries: list[dict]) -> dict[str, str]:
    """Config id -> a label for 80-column tables: `B256 lr1.41e-4`, with the LR rule added
    when it is not sqrt (`B256 lr1e-4 none`), the staleness when above 0 (`k1`), and the
    algorithm when the entries mix them
    (`ppo B256 ...`); labels that still collide get the id's hash appended."""
    labels = {}
    mixed = len({e.get("algorithm") for e in entries if e.get("algorithm")}) > 1
    for e in entries:
        b = e.get("sequences_per_step")
        if b is None:
            labels[e["config"]] = str(e["config"])[:24]
            continue
        size = f"B{b}" if not e.get("schedule") else _short_schedule(e["schedule"])
        lab = (f"{e['algorithm']} " if mixed and e.get("algorithm") else "") + size + \
            ("" if e.get("lr") is None or e.get("schedule") else f" lr{e['lr']:.3g}")
        if e.get("lr_scaling") not in (None, "sqrt"):
            lab += f" {e['lr_scaling']}"
        if e.get("staleness"):
            lab += f" k{e['staleness']}"
        labels[e["config"]] = lab
    counts: dict[str, int] = {}
    for lab in labels.values():
        counts[lab] = counts.get(lab, 0) + 1
    return {c: (f"{lab} #{c.rsplit('-', 1)[-1][:4]}" if counts[lab] > 1 else lab)
            for c, lab in labels.items()}


def _short_schedule(text: str) -> str:
    """`steps 64,128@256,256@768` -> `B64>128>256`; `adaptive x2 to 1024` -> `B adapt x2<=1024`."""
    if text.startswith("steps "):
        return "B" + ">".join(part.split("@")[0] for part in text[6:].split(","))
    return "B adapt " + text.split(" ", 1)[1].replace(" to ", "<=")


def confidence(vs: dict) -> str:
    """`confidence faster 0.97 (0.91 allowing for 3 candidates)`: 1 - the one-sided p-value,
    and 1 - the Holm-adjusted one where the family has more than one candidate (a candidate
    is shown faster exactly when the latter is at least 1 - alpha); "" without one."""
    p, fam, m = vs.get("p_faster"), vs.get("p_faster_family"), vs.get("family_size") or 1
    if p is None:
        return ""
    return f"confidence faster {p:.2f}" + (
        f" ({fam:.2f} allowing for {m} candidates)" if fam is not None and m > 1 else "")
