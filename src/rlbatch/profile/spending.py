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
   baseline is then kept; a second winner is not tried, so the cost stays bounded). One
   seed on each side is an indication, never `established` in the sense of `rlbatch
   analyze` (an interval across seeds wholly below 1, analysis/selection.py): the words are
   kept apart, and the profile's decision names its evidence.

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
    to target over the baseline's once it has reached the target (confirmation)."""

    config: str
    samples: int
    prediction: dict | None = None
    measured_ratio: float | None = None


@dataclass(frozen=True)
class Plan:
    extend: dict[str, int] = field(default_factory=dict)  # config -> samples to run to
    drop: dict[str, str] = field(default_factory=dict)  # config -> reason
    open: list[str] = field(default_factory=list)  # undecided, not extended (at the cap or not promising)
    confirm: str | None = None  # run this one to the target
    outcome: str | None = None  # indicated | not_confirmed | keep_baseline (when finished)
    winner: str | None = None

    @property
    def finished(self) -> bool:
        return self.outcome is not None


def _ratio_ci(pred: dict | None) -> tuple[float | None, float | None]:
    lo, hi = (pred or {}).get("time_ratio_ci") or (None, None)
    return lo, hi


def _usable(pred: dict | None) -> bool:
    return (pred is not None and pred.get("problem") is None
            and None not in _ratio_ci(pred))


EXTEND_RULES = ("promising", "undecided")


def plan_next(cands: list[Candidate], *, cap: int, growth: float = 2.0,
              extend: str = "promising") -> Plan:
    """The next spending decision (see the module text); `cap` is the largest probe, in
    samples; `extend` one of EXTEND_RULES (rule 3)."""
    if extend not in EXTEND_RULES:
        raise ValueError(f"extend must be one of {EXTEND_RULES}, not {extend!r}")
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
        hopeless = (extend == "promising" and _usable(pred)
                    and pred.get("time_ratio", 1.0) >= 1.0)
        if c.samples < cap and not hopeless:
            longer[c.config] = int(min(cap, max(c.samples + 1, c.samples * growth)))
        else:
            open_.append(c.config)
    if longer:
        return Plan(extend=longer, drop=drop, open=open_)
    if not winners:  # nothing settled below 1: measure the most promising open one
        by_name = {c.config: c for c in cands}
        winners = [by_name[n] for n in open_ if _usable(by_name[n].prediction)
                   and by_name[n].prediction.get("time_ratio", 1.0) < 1.0]
    if not winners:
        return Plan(drop=drop, open=open_, outcome="keep_baseline")
    best = min(winners, key=lambda c: (c.prediction["time_ratio"], c.config))
    return Plan(drop=drop, open=[n for n in open_ if n != best.config], confirm=best.config)
