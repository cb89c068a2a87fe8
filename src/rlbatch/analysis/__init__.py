"""Analysis layer: pure numpy/pandas over run logs (docs/design.md "Layers"). Imports no torch.

- `runs`: load run directories into tidy frames; configuration ids (`load_runs`).
- `crossing`: samples to target N*, time to target T, throughput q per run.
- `seedstats`: the pooled log-normal model across seeds (censored runs by their bounds).
- `stats`: per-configuration estimates and intervals, ratios against the reference.
- `invariance`: curve differences vs the reference, verdicts, critical batch (departure sense).
- `noise`: McCandlish et al. 2018 S-E fit (B_crit), logged B_simple summaries, T(B) prediction.
- `selection`: q ratio vs N* ratio, recommendation.
- `analyze`: the whole pipeline -> one JSON-ready document (`rlbatch analyze`).

See docs/analysis.md for every quantity and rule.
"""
