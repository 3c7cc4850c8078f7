"""Capped exponential backoff with jitter, for retries against the central DB."""

from __future__ import annotations

import random
from dataclasses import dataclass

__all__ = ["Backoff"]


@dataclass
class Backoff:
    base: float = 0.1
    cap: float = 10.0
    failures: int = 0

    def next_delay(self) -> float:
        """The wait before the next try: full jitter over base·2^failures, capped."""
        self.failures += 1
        ceiling = min(self.cap, self.base * (2 ** min(self.failures, 30)))
        return random.uniform(ceiling / 2, ceiling)

    def reset(self) -> None:
        self.failures = 0
