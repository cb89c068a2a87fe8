"""Named phase timer (docs/design.md, house rule 6: time honestly).

`with timer.phase("rollout"): ...` adds wall seconds to that phase. A `sync` callable (for
CUDA: `torch.cuda.synchronize`) runs at both boundaries so queued device work is charged to
the phase that queued it. The first `warmup_steps` steps are kept apart: `end_step()` returns
the step's phase times and whether it was a warm-up step, so callers can report warm-up
separately instead of folding one-off compilation or allocation into steady-state figures.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager


class PhaseTimer:
    def __init__(self, sync: Callable[[], None] | None = None, warmup_steps: int = 0,
                 clock: Callable[[], float] = time.perf_counter):
        self._sync = sync or (lambda: None)
        self._clock = clock
        self.warmup_steps = warmup_steps
        self._current: dict[str, float] = defaultdict(float)
        self.steps_done = 0
        self.totals: dict[str, float] = defaultdict(float)
        self.warmup_totals: dict[str, float] = defaultdict(float)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        self._sync()
        start = self._clock()
        try:
            yield
        finally:
            self._sync()
            self._current[name] += self._clock() - start

    def add(self, name: str, seconds: float) -> None:
        self._current[name] += seconds

    def reassign(self, source: str, target: str, seconds: float) -> None:
        """Move `seconds` measured inside phase `source` to phase `target` (work timed by the
        callee inside a phase, such as the noise-scale probe inside an update), so each
        second is counted once. At most the seconds `source` holds are moved."""
        seconds = min(max(0.0, seconds), self._current[source])
        self._current[source] -= seconds
        self._current[target] += seconds

    def end_step(self) -> tuple[dict[str, float], bool]:
        """Close the step: return ({phase: seconds}, is_warmup) and start a fresh one."""
        times = dict(self._current)
        warm = self.steps_done < self.warmup_steps
        sink = self.warmup_totals if warm else self.totals
        for k, v in times.items():
            sink[k] += v
        self.steps_done += 1
        self._current = defaultdict(float)
        return times, warm


def cuda_sync_or_none(device: str) -> Callable[[], None] | None:
    """torch.cuda.synchronize for CUDA devices, None otherwise (imports torch lazily)."""
    if not str(device).startswith("cuda"):
        return None
    import torch

    return torch.cuda.synchronize
