"""Sequential spending for probe-based profiling: what to run next, given the predictions.

The baseline runs to the target; each candidate first runs a short probe (a fraction of the
baseline's N*), and `analysis.prediction.predict` turns the probe into a predicted time to
target T with an interval and an alignment verdict on the samples axis. This module decides,
from those predictions alone, where more compute is worth spending. It is pure (no files, no
processes) so that every rule is tested on constructed cases (tests/test_spending.py).

Decisions use each candidate's predicted time ratio T_cand / T_base (`time_ratio`, with its
interval): the baseline's N* cancels in it, so the baseline stands at exactly 1. Rules,
applied to every candidate of the reference's LR-scaling family in this order:

1. `drop` a candidate whose verdict is `departed`: the decision rule only recommends
   configurations aligned with the baseline (analysis/selection.py), so a departed one is
   out whatever its time.
2. `drop` a candidate that cannot win: the lower end of its ratio interval is above 1
   (slower than the baseline even at its best).
3. `extend` a candidate still undecided (no usable prediction yet, verdict `inconclusive`,
   or a ratio interval that contains 1) whose probe is below the cap: its next probe is
   `growth` times longer, capped at `cap` samples. With `extend="promising"` (the default)
   only an undecided candidate that could still be confirmed is extended: one without a
   usable prediction, or whose point ratio is below 1. An undecided candidate predicted at
   or above 1 is left `open` at once: at the cap it would not be confirmed either (rule 4),
   so a longer probe could change the decision only by moving its point ratio below 1, and
   the compute goes to the candidates that can win. `extend="undecided"` extends every
   undecided candidate (the rule before; kept for comparison, bench/probe_replay.py).
4. When nothing is left to extend: `confirm` the predicted winner by running it to the
   target: the lowest predicted ratio among aligned candidates whose whole interval lies
   below 1; if there is none, the lowest point ratio below 1 among candidates still
   undecided at the cap (reported `open`): the probes could not settle it, so it is
   measured. With neither, the outcome is `keep_baseline`.
5. A confirmation ends the procedure: `indicated` when the winner's measured ratio (its time
   to target over the baseline's, one seed each) is below 1, `not_confirmed` otherwise (the
   baseline is then kept; a second winner is not tried, so the cost stays bounded),
   `over_budget` when the profile's budget ran out before the confirmation reached the
   target or the baseline's time (the baseline is kept; nothing was measured). One
   seed on each side is an indication, never `established` in the sense of `rlbatch
   analyze` (an interval across seeds wholly below 1, analysis/selection.py): the words are
   kept apart, and the profile's decision names its evidence.

A budget (`profile.probe_budget`, in training seconds) bounds rules 3 and 4: `fit_budget`
grants only the extensions whose projected cost (samples to go over the probe's measured
throughput) fits in what is left after reserving the predicted cost of confirming the
candidate with the lowest predicted ratio below 1; with nothing granted the probes are
settled as they stand (rule 4 with no more extensions). The confirmation itself is stopped
by the caller where the budget ends (profile/probing.py).

Nothing here decides on one seed what the full analysis decides on several: `rlbatch
analyze` on the same runs still reports its own verdicts; spending only chooses which runs
exist, and the profile's decision says it rests on probes and one confirmation.
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

    @property
    def finished(self) -> bool:
        return self.outcome is not None


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
    """The next spending decision (see the module text); `cap` is the largest probe, in
    samples; `extend` one of EXTEND_RULES (rule 3)."""
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
