"""`FlushBudget`: the fleet's central write budget, shared by stretching flush intervals.

With ``central_budget_rows_per_s`` set, each triggerer reads the fleet table
(`localstate._sync.central.fleet`) now and then and sets its flush interval so the live fleet's
rows/s together stay within the budget. Coalescing makes this work: a key set many times between two
flushes is one row, so for a working set of hot keys the rows a triggerer writes per second fall
as its interval grows (rows/s ≈ hot keys / interval). The cost is lag, reported in the stats
(``flush_interval_s``), the metrics and the fleet view.

The rule, at each reading, with T the fleet's rows/s and B the budget: over budget, the
interval is multiplied by T/B (every triggerer does the same, so each keeps its share of the
load); under 0.8 B, it shrinks by the same ratio (at most halved per reading), never below the
configured ``flush_interval``. Rates are measured over whole flush intervals, so the interval
moves at most 4× per reading: the fleet settles in a few readings without oscillating.

Invariant: ``interval >= base`` always; with no budget it is ``base``.
"""

from __future__ import annotations

import logging
import time
from typing import Final

from localstate._sync.central.fleet import fleet_total_rate
from localstate._sync.sinks.sink import FleetReporting, Sink
from localstate.errors import LocalStateError

__all__ = ["FlushBudget"]

log = logging.getLogger("localstate.sync.budget")

#: seconds between two readings of the fleet table (at least one flush interval)
READ_EVERY_S: Final = 2.0
#: below this share of the budget the interval shrinks back
_SLACK: Final = 0.8
#: the most an interval moves per reading
_MAX_STEP: Final = 4.0


class FlushBudget:
    """One triggerer's part in the fleet's budget (see the module docstring)."""

    def __init__(self, rows_per_s: float, base: float) -> None:
        self.rows_per_s = rows_per_s
        self.base = base
        #: the flush interval to use now
        self.interval = base
        #: the fleet's rows/s at the last reading (None: none yet)
        self.fleet_rows_per_s: float | None = None
        self._read_at = 0.0

    def retune(self, base: float) -> None:
        self.base = base
        self.interval = max(self.interval, base)

    def due(self, now: float) -> bool:
        return now - self._read_at >= max(READ_EVERY_S, self.interval)

    def adjust(self, fleet_rate: float) -> float:
        """The interval for a fleet writing `fleet_rate` rows/s."""
        self.fleet_rows_per_s = fleet_rate
        ratio = fleet_rate / self.rows_per_s
        if ratio > 1.0:
            self.interval *= min(ratio, _MAX_STEP)
        elif ratio < _SLACK:
            self.interval *= max(ratio / _SLACK, 0.5)
        self.interval = max(self.interval, self.base)
        return self.interval

    async def refresh(self, sink: Sink) -> float:
        """Read the fleet table when due and adjust; the interval to use."""
        now = time.time()
        if not isinstance(sink, FleetReporting) or not self.due(now):
            return self.interval
        self._read_at = now
        try:
            rows = await sink.read_fleet()
        except LocalStateError as exc:  # the flush itself went through: keep the interval
            log.debug("could not read the fleet table: %s", exc)
            return self.interval
        return self.adjust(fleet_total_rate(rows, now))
