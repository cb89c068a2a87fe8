"""Interop layer: work with the trainers users already run (docs/design.md, Layers).

- `plan`: the exact overrides for a batch-size sweep in verl, OpenRLHF, TRL or prime-rl
  (unit conversions, the LR rule, schedules converted through samples);
- `ingest`: their logs converted into rlbatch run directories (the run-log contract), so
  `rlbatch analyze` and `rlbatch report` read them like the built-in trainer's.

It imports only `core`; the trainers that run RL themselves live in `backends`.
"""
