"""Percentiles as the benches report them."""

from __future__ import annotations

import math
from collections.abc import Sequence


def nearest_rank(ordered: Sequence[float], q: float) -> float:
    """The `q` quantile (0 < q <= 1) of `ordered` (sorted, not empty) by nearest rank: the
    smallest value with at least q of the values at or below it (p99 of 100 values is the
    99th, not the largest)."""
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]
