"""Analysis layer: pure numpy/pandas over run logs (docs/design.md "Layers"). Imports no torch.

- `runs`: load run directories into tidy frames; configuration ids (`load_runs`).
- `crossing`: samples to target N*, time to target T, throughput q per run.
- `stats`: seed bootstrap of medians across seeds, censoring, intervals.
- `invariance`: curve differences vs the reference, verdicts, critical batch (departure sense).
- `noise`: McCandlish et al. 2018 S-E fit (B_crit), logged B_simple summaries, T(B) prediction.
- `selection`: q ratio vs N* ratio, recommendation.
- `analyze`: the whole pipeline -> one JSON-ready document (`rlbatch analyze`).

See docs/analysis.md for every quantity and rule.
"""
