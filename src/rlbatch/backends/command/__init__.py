"""`backend: command`: a trial as the user's own training command (verl, OpenRLHF, prime-rl,
`trl grpo`, `rlbatch train`). `run.py` starts, judges and stops it; `follow.py` reads its log
into the run log through `rlbatch ingest`'s converters; `exec_child.py` starts it so that it
dies with its follower. The words appended per framework are `interop/launch.py`'s."""
