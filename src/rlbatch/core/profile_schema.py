"""The `profile:` section of the config schema (`rlbatch profile`: the candidates and the
procedure's settings; docs/design.md). The other sections are `core/schema.py`."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field, model_validator

from rlbatch.core.schema import MAX_COUNT, MAX_LIST, MAX_PROMPTS, BatchSchedule, StrictModel


class ProfileConfig(StrictModel):
    """`rlbatch profile`: the candidates and the procedure's settings (docs/design.md)."""

    prompts_per_step: list[int] = Field(
        [8, 32, 64], max_length=MAX_LIST, description="candidate P values (B = P x G); the "
        "baseline P0 = B0 / G is always run")
    seeds: int = Field(1, gt=0, le=1000, description="seeds per configuration")
    confirm_seeds: int = Field(1, ge=0, le=1000, description="extra seeds for the baseline and the "
                               "challenger (the most promising candidate), so that the "
                               "decision compares configurations with >= 2 seeds")
    fixed_lr_control: bool = Field(True, description="also run 2 x B0 with the unscaled LR")
    max_staleness: list[int] = Field(
        [0], min_length=1, max_length=4, description="rollout.max_staleness values crossed "
        "with the candidates: every candidate B, and B0, runs at each (the baseline, the "
        "fixed-LR control and the schedules at rollout.max_staleness), so that a larger "
        "batch and rollouts decoded ahead compete in one decision; [0] = synchronous only "
        "(docs/analysis.md, 'Staleness against its synchronous twin')")
    concurrency: list[int] = Field([16, 64, 256], max_length=MAX_LIST,
                                   description="decode sweep; [] = keep C")
    early_stop: bool = Field(True, description="stop candidates that missed the crossing or cannot win")
    early_stop_rule: Literal["median", "futility"] = Field(
        "median", description="median: stop a candidate past the baseline's median T "
        "(cannot_win) or past exp(margin) x its largest N* (no_crossing); futility: only once "
        "a configuration faster than the baseline by profile.smallest_effect (cannot_win), or "
        "needing exp(margin) x its N* (no_crossing), would have crossed by then in all but "
        "profile.futility_alpha of its runs (docs/analysis.md, 'The profile's early stopping')")
    follow_up: Literal["all", "open", "challenger"] = Field(
        "challenger", description="a re-run with more seeds (the decision's `next`): all gives "
        "every configuration the new seeds; open only the baseline and the configurations "
        "the previous decision left open (neither ruled out nor shown faster); challenger "
        "only the baseline and the open one with the lowest point T, with the seeds its own "
        "plan asks for")
    alpha_spending: bool = Field(
        False, description="each re-run that follows the decision's `next` is another look: "
        "look k decides at alpha / 2^(k+1), so that all looks together keep alpha; off: "
        "every look at alpha")
    budget: float | None = Field(
        None, ge=1, le=10000, description="the most the profile may spend, in baseline runs' "
        "time to target (the median of the baseline's runs): its first look is one seed of "
        "each configuration, each later look one more seed of the baseline and of the "
        "likeliest fastest (once that one is at most 5% likely slower than the baseline, of "
        "it and its likeliest rival), while the budget pays for them; the decision adds a pick with "
        "P(slower than the baseline) (rlbatch profile --budget; docs/analysis.md, "
        "'A budget'); null: no budget")
    budget_seconds: float | None = Field(
        None, gt=0, description="the same budget in training seconds (--budget 3600s, 90m, "
        "2h); null: none")
    budget_max_slower: float = Field(
        0.25, gt=0, lt=1, description="a budget's pick: a candidate more likely than this to "
        "be slower than the baseline gives way to the baseline")
    budget_sure_within: float = Field(
        0.5, gt=0, lt=1, description="a budget's looks stop once a candidate pick is at most "
        "5% likely slower than the baseline and at least this likely within 5% of the "
        "fastest (keeping the baseline needs 0.9); higher goes on to tell the candidates "
        "apart, at a cost measured in docs/analysis.md, 'The default decision'")
    sequential: bool = Field(
        False, description="the budget's looks as a sequential decision, the budget its "
        "cap: a candidate is picked only when the draws put it at most 5% likely slower "
        "than the baseline, else the baseline is kept; needs profile.budget or "
        "profile.budget_seconds. `rlbatch profile` and `rlbatch replay` without --follow, a "
        "budget or the probe strategy set it with profile.budget 16 (docs/analysis.md, 'The "
        "default decision')")
    smallest_effect: float = Field(0.1, gt=0, le=10, description="futility: the smallest "
                                   "speed-up worth finding (0.1: T ratio 1/1.1)")
    futility_alpha: float = Field(0.05, gt=0, lt=0.5, description="futility: the chance of "
                                  "stopping a run of a configuration at that effect")
    futility_sd: float = Field(0.35, gt=0, le=5, description="futility: the run-to-run sd "
                               "of log T and log N* assumed when the baseline's seeds show "
                               "less (two seeds cannot estimate it)")
    min_evaluations: int = Field(10, ge=1, description="evaluations the baseline's N* must "
                                 "be resolved by (else the profile refuses and names the "
                                 "interval to set)")
    margin: float = Field(math.log(1.15), gt=0,
                          description="equivalence margin on log N* ratio (log 1.15)")
    statistic: Literal["crossing", "stretch"] = Field(
        "crossing", description="a run's N* in the decision: its first crossing of the "
        "target, or a stretch fitted to its rising curve near it (rlbatch analyze "
        "--statistic; docs/analysis.md, 'Which statistic')")
    spread: Literal["pooled", "pair", "larger", "paired"] = Field(
        "pair", description="the run-to-run spread a comparison with the baseline rests on: "
        "the pair's own, pooled over every configuration, the larger of the two, or paired "
        "by seed where 3 or more seeds of both crossed (rlbatch analyze --spread; "
        "docs/analysis.md, 'Per-configuration spread')")
    workers: int = Field(1, gt=0, le=1024, description="trials run at once; each gets its "
                         "share of the CPUs (RLBATCH_THREADS)")
    strategy: Literal["full", "probe"] = Field(
        "full", description="full: every candidate towards the target (early stops); probe: "
        "short probes, predicted time to target, only the predicted winner run to the target")
    probe_fraction: float = Field(0.15, gt=0, le=1, description="probe: first probe length, "
                                  "as a fraction of the baseline's N*")
    probe_max_fraction: float = Field(0.6, gt=0, le=1, description="probe: longest probe "
                                      "(probes double while undecided), fraction of N*")
    probe_budget: float | None = Field(
        2.0, ge=1, le=1000, description="probe: the most the profile may spend, in training "
        "seconds (decode sweep included) as a multiple of the baseline's time to target; "
        "probe extensions and the confirmation stay within it (a confirmation it stops ends "
        "with outcome over_budget, and the baseline is kept); the first probes always run; "
        "null: no limit")
    probe_control: bool = Field(False, description="probe: also probe the fixed-LR control "
                                "(reported only: the probe decision never uses it)")
    schedules: list[BatchSchedule] = Field(
        [], max_length=8, description="batch schedules to compare as candidates beside the "
        "static B (full strategy): each starts at the baseline's B (steps: at its first B) "
        "and runs the LR rule at every B")

    @model_validator(mode="after")
    def _positive(self) -> ProfileConfig:
        if any(p <= 0 for p in self.prompts_per_step) or any(c <= 0 for c in self.concurrency):
            raise ValueError("profile.prompts_per_step and profile.concurrency must be positive")
        if any(p > MAX_PROMPTS for p in self.prompts_per_step) \
                or any(c > MAX_COUNT for c in self.concurrency):
            raise ValueError(f"profile.prompts_per_step must be <= {MAX_PROMPTS} and "
                             f"profile.concurrency <= {MAX_COUNT}")
        if self.schedules and self.strategy == "probe":
            raise ValueError("profile.schedules are compared by the full strategy only: set "
                             "profile.strategy: full")
        if any(not 0 <= k <= 8 for k in self.max_staleness) \
                or len(set(self.max_staleness)) != len(self.max_staleness):
            raise ValueError("profile.max_staleness: each value once, each from 0 to 8")
        if len(set(self.concurrency)) != len(self.concurrency):
            raise ValueError("profile.concurrency must name each C once (the decode sweep "
                             "measures each once)")
        if self.budget is not None and self.budget_seconds is not None:
            raise ValueError("profile.budget and profile.budget_seconds: set one of them")
        if self.sequential and self.budget is None and self.budget_seconds is None:
            raise ValueError("profile.sequential: its looks need a cap, profile.budget (or "
                             "--budget N)")
        if (self.budget is not None or self.budget_seconds is not None) \
                and self.strategy == "probe":
            raise ValueError("profile.budget is the full strategy's (the probe strategy has "
                             "profile.probe_budget): set profile.strategy: full")
        return self
