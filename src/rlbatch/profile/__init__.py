"""The profile: trials, their driver and executors, probes, banks and replays."""

# How many times a profile, and a replay of one, follows its decision's `next` unless told:
# one number for both, so that `rlbatch replay` with no flags scores what `rlbatch profile`
# with no flags decides (docs/analysis.md, "The information floor")
DEFAULT_FOLLOW = 0
