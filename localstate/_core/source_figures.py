"""`SourceFigures`: what the sources a store's triggers read (queues) report about themselves,
per owner: counters (messages a watcher could not deliver as they were) and gauges (how far
behind its source it is), for `StateStore.stats` and the metrics."""

from __future__ import annotations

from collections import Counter

__all__ = ["SourceFigures"]


class SourceFigures:
    """Per owner, counters that only grow and gauges that stand as last set. The owner's
    trigger alone changes its figures (`count`, `gauge`); `forget` drops them when it leaves."""

    def __init__(self) -> None:
        self._counts: dict[str, Counter[str]] = {}
        self._gauges: dict[str, dict[str, float]] = {}

    def count(self, owner: str, name: str, n: int = 1) -> None:
        """Add `n` to `owner`'s counter `name`."""
        self._counts.setdefault(owner, Counter())[name] += n

    def gauge(self, owner: str, name: str, value: float) -> None:
        """Set `owner`'s gauge `name`."""
        self._gauges.setdefault(owner, {})[name] = value

    def forget(self, owner: str) -> None:
        """Drop `owner`'s gauges (it left this store: they no longer describe it); its
        counters stay, so that the store's totals never go down."""
        self._gauges.pop(owner, None)

    def total(self, name: str) -> float:
        """The sum of counter (or gauge) `name` over the owners."""
        return (sum(c[name] for c in self._counts.values())
                + sum(g.get(name, 0) for g in self._gauges.values()))

    def by_owner(self) -> dict[str, dict[str, float]]:
        """Each owner's figures: its counters and gauges by name."""
        out: dict[str, dict[str, float]] = {o: dict(c) for o, c in self._counts.items()}
        for owner, gauges in self._gauges.items():
            out.setdefault(owner, {}).update(gauges)
        return out
