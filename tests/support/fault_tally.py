"""`FaultTally`: what the fault-injection scenarios tried and what they found lost.

Each scenario adds what it did (``fault_tally.add("rounds killed", 12)``), what it found lost
(``fault_tally.lost("local", 0)``) and what else it found wrong (``fault_tally.found("stale
reads", 0)``): both recorded even when zero, so the summary shows the promise was checked. The
`fault_tally` fixture in `tests/conftest.py` hands it out and prints it after the run.
"""

from __future__ import annotations

from collections import Counter

__all__ = ["FaultTally"]


class FaultTally:
    """Counts of what the fault scenarios tried and what they found lost."""

    def __init__(self) -> None:
        self.tried: Counter[str] = Counter()
        self.losses: dict[str, int] = {}
        self.findings: dict[str, int] = {}
        self.longest_s: dict[str, float] = {}

    def add(self, what: str, n: int = 1) -> None:
        """Record `n` more of `what` (``"rounds killed"``, ``"acknowledged writes checked"``,
        ``"outages survived"``, ``"inputs tried"``, ...)."""
        self.tried[what] += n

    def lost(self, promise: str, n: int) -> None:
        """Record that checking `promise` (a durability mode, or a surface) found `n` lost."""
        self.losses[promise] = self.losses.get(promise, 0) + n

    def found(self, what: str, n: int) -> None:
        """Record that a check found `n` of `what` (``"lost updates"``, ``"stale reads"``,
        ``"linearizability violations"``, ...)."""
        self.findings[what] = self.findings.get(what, 0) + n

    def longest(self, what: str, seconds: float) -> None:
        """Record a duration of `what` (``"survivor's longest claim wait"``): the summary
        shows the longest recorded."""
        self.longest_s[what] = max(seconds, self.longest_s.get(what, 0.0))

    def as_dict(self) -> dict[str, dict[str, float]]:
        """The counts as plain data (a pytest-xdist worker sends them to the controller)."""
        return {"tried": dict(self.tried), "losses": dict(self.losses),
                "findings": dict(self.findings), "longest_s": dict(self.longest_s)}

    def merge(self, data: dict[str, dict[str, float]]) -> None:
        """Add the counts of another process's tally (`as_dict`)."""
        for what, n in data.get("tried", {}).items():
            self.add(what, int(n))
        for promise, n in data.get("losses", {}).items():
            self.lost(promise, int(n))
        for what, n in data.get("findings", {}).items():
            self.found(what, int(n))
        for what, s in data.get("longest_s", {}).items():
            self.longest(what, s)

    def lines(self) -> list[str]:
        out = [f"{what}: {n:,}" for what, n in sorted(self.tried.items())]
        out += [f"lost ({promise}): {n:,}" for promise, n in sorted(self.losses.items())]
        out += [f"{what}: {n:,}" for what, n in sorted(self.findings.items())]
        out += [f"{what}: {s:.2f} s" for what, s in sorted(self.longest_s.items())]
        return out
