"""The profile: trials, their driver and executors, probes, banks and replays."""

# What `rlbatch profile` and `rlbatch replay` run unless told otherwise (one definition for
# both, so that a replay with no flags scores what a profile with no flags decides;
# docs/analysis.md, "The default decision"): the full strategy as a sequential decision
# capped at DEFAULT_BUDGET baseline runs' time to target. `--follow N` asks for the
# decision rule's looks instead (N = 0: the first look alone), `--budget` for another cap.
DEFAULT_FOLLOW = 0
DEFAULT_BUDGET = 16


def default_sets(prof, follow: int | None) -> list[str]:
    """The `--set`s the default decision stands for: none where the command named its own
    procedure (`--follow`, a budget, the probe strategy), else a sequential decision within
    DEFAULT_BUDGET baseline runs."""
    own = (follow is not None or prof.strategy != "full" or prof.budget is not None
           or prof.budget_seconds is not None)
    return [] if own else [f"profile.budget={DEFAULT_BUDGET}", "profile.sequential=true"]
