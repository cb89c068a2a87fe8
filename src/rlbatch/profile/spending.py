"""Sequential spending for probe-based profiling: what to run next, given the predictions.

Each candidate first runs a short probe, and `analysis.prediction.predict` turns it into a
predicted time ratio T_cand / T_base with an interval and an alignment verdict (the
baseline's N* cancels in the ratio, so the baseline stands at exactly 1). From those
predictions alone, `plan_next` drops what departed or cannot win, extends undecided probes
up to a cap, then confirms the predicted winner by running it to the target, or keeps the
baseline; `fit_budget` grants only the extensions that fit in `profile.probe_budget` after
reserving the confirmation's cost. Pure (no files, no processes), so every rule is tested on
constructed cases (tests/test_spending.py). Spending only chooses which runs exist:
`rlbatch analyze` on the same runs still gives its own verdicts. The rules in order and the
outcome words: docs/design.md, "Module notes".
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Candidate:
    """A candidate's probe so far. `prediction` is `predict(...)`'s dict (None before the
    first probe has been read); `samples` what its run has done; `measured_ratio` its time
    to target over the baseline's once it has reached the target (confirmation);
    `over_budget` when its confirmation was stopped by the profile's budget; `train_s` its
    training seconds so far (for the budget)."""

    config: str
    samples: int
    prediction: dict | None = None
    measured_ratio: float | None = None
    over_budget: bool = False
    train_s: float = 0.0


@dataclass(frozen=True)
class Plan:
    extend: dict[str, int] = field(default_factory=dict)  # config -> samples to run to
    drop: dict[str, str] = field(default_factory=dict)  # config -> reason
    open: list[str] = field(default_factory=list)  # undecided, not extended (at the cap or not promising)
    confirm: str | None = None  # run this one to the target
    outcome: str | None = None  # indicated | not_confirmed | over_budget | keep_baseline
    winner: str | None = None


def _ratio_ci(pred: dict | None) -> tuple[float | None, float | None]:
    lo, hi = (pred or {}).get("time_ratio_ci") or (None, None)
    return lo, hi


def _point(pred: dict | None) -> bool:
    """A point prediction of the time ratio exists."""
    return (pred is not None and pred.get("problem") is None
            and pred.get("time_ratio") is not None)


def _usable(pred: dict | None) -> bool:
    """A point prediction and its interval exist."""
    return _point(pred) and None not in _ratio_ci(pred)


EXTEND_RULES = ("promising", "undecided")


def plan_next(cands: list[Candidate], *, cap: int, growth: float = 2.0,
              extend: str = "promising") -> Plan:
    """The next spending decision (the rules in order: docs/design.md, "Module notes");
    `cap` is the largest probe, in samples; `extend` one of EXTEND_RULES (rule 3)."""
    if extend not in EXTEND_RULES:
        raise ValueError(f"extend must be one of {EXTEND_RULES}, not {extend!r}")
    if any(c.over_budget for c in cands):
        return Plan(outcome="over_budget")
    confirmed = [c for c in cands if c.measured_ratio is not None]
    if confirmed:
        c = confirmed[0]
        won = c.measured_ratio < 1.0
        return Plan(outcome="indicated" if won else "not_confirmed",
                    winner=c.config if won else None)
    longer: dict[str, int] = {}
    drop: dict[str, str] = {}
    open_: list[str] = []
    winners: list[Candidate] = []
    for c in cands:
        pred = c.prediction
        lo, hi = _ratio_ci(pred)
        verdict = (pred or {}).get("verdict")
        if verdict == "departed":
            drop[c.config] = "departed: not aligned with the baseline on the samples axis"
            continue
        if _usable(pred) and lo > 1.0:
            drop[c.config] = (f"cannot win: predicted T / T_base >= {lo:.2f} (interval "
                              f"{lo:.2f}-{hi:.2f})")
            continue
        if _usable(pred) and verdict == "aligned" and hi < 1.0:
            winners.append(c)
            continue
        hopeless = (extend == "promising" and _point(pred)
                    and pred.get("time_ratio", 1.0) >= 1.0)
        if c.samples < cap and not hopeless:
            longer[c.config] = int(min(cap, max(c.samples + 1, c.samples * growth)))
        else:
            open_.append(c.config)
    if longer:
        return Plan(extend=longer, drop=drop, open=open_)
    if not winners:  # nothing settled below 1: measure the most promising open one
        by_name = {c.config: c for c in cands}
        winners = [by_name[n] for n in open_ if _point(by_name[n].prediction)
                   and by_name[n].prediction.get("time_ratio", 1.0) < 1.0]
    if not winners:
        return Plan(drop=drop, open=open_, outcome="keep_baseline")
    best = min(winners, key=lambda c: (c.prediction["time_ratio"], c.config))
    return Plan(drop=drop, open=[n for n in open_ if n != best.config], confirm=best.config)


def _seconds_to(c: Candidate, samples: int) -> float | None:
    """Projected training seconds for `c` to go from where it is to `samples`, at its probe's
    steady-state throughput (None when the probe has none yet)."""
    q = (c.prediction or {}).get("throughput")
    return max(0.0, samples - c.samples) / q if q else None


def fit_budget(plan: Plan, cands: list[Candidate], *, left_s: float, base_time: float
               ) -> tuple[dict[str, int], dict[str, float | None]]:
    """The extensions of `plan` that fit in `left_s` training seconds, and those refused
    (config -> projected seconds). Before any extension, the budget reserves the predicted
    cost of confirming the most promising candidate (lowest point ratio below 1, not
    dropped): its predicted time to target, ratio x `base_time`, less the seconds it has
    already run (a confirmation continues its probe, so extending that candidate spends its
    reserve first). Extensions are granted in order of promise (no usable prediction first, then
    lowest predicted ratio) while they fit; one whose cost cannot be projected (no
    throughput yet: nothing about it can be decided without a longer probe) is granted
    while any room is left."""
    by = {c.config: c for c in cands}
    ratio = {n: (by[n].prediction or {}).get("time_ratio") for n in by}
    promising = [by[n] for n in by
                 if ratio[n] is not None and ratio[n] < 1.0 and n not in plan.drop]
    best = min(promising, key=lambda c: (ratio[c.config], c.config)) if promising else None
    reserve = 0.0 if best is None else max(0.0, ratio[best.config] * base_time - best.train_s)
    room = left_s - reserve
    granted: dict[str, int] = {}
    refused: dict[str, float | None] = {}
    order = sorted(plan.extend, key=lambda n: (ratio.get(n) is not None, ratio.get(n) or 0.0, n))
    for name in order:
        cost = _seconds_to(by[name], plan.extend[name]) if name in by else None
        if cost is None:
            if room > 0:
                granted[name] = plan.extend[name]
            else:
                refused[name] = None
            continue
        extra = cost
        if best is not None and name == best.config:
            extra = max(0.0, cost - reserve)  # the reserve already pays for this much of it
        if extra <= room:
            granted[name] = plan.extend[name]
            room -= extra
        else:
            refused[name] = cost
    return granted, refused
