"""`percentile`: the nearest-rank percentile every benchmark reports (p50, p99)."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["percentile"]


def percentile(samples: Sequence[float], q: float) -> float:
    """The sample at rank ``q × n`` of `samples` sorted (`q` from 0 to 1; 0.99 is p99): a value
    that was measured, never one interpolated between two. NaN when there are none."""
    if not samples:
        return float("nan")
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]
