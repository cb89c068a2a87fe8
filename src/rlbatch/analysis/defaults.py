"""The analysis's default settings, in a module that imports nothing heavy: the CLI shows them
as defaults without loading numpy and scipy at start-up. `stats` and `invariance` re-export
them under the same names."""

from __future__ import annotations

import math

DEFAULT_MARGIN = math.log(1.15)  # equivalence margin m on log(N* ratio)
DEFAULT_CI = 0.90  # level of the two-sided intervals across seeds
DEFAULT_BOOT = 2000  # bootstrap resamples of the invariance curves' bands
