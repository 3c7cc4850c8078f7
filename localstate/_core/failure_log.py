"""`FailureLog`: what the log says about one operation that keeps failing and is retried.

A flush, a claim or a read-through retried through an outage must not log a WARNING on every
try (one per second fills a triggerer's log during a rolling deploy of the API server). One
`FailureLog` per operation owns that operation's failure streak and logs:

* one WARNING when the streak starts (the first failure, with its error);
* at most one WARNING summary per `summary_every` seconds while it lasts (the tries so far,
  for how long, the latest error);
* one INFO when the operation succeeds again (how many failures, how long it took).

Every other failure goes to DEBUG. The clock is injected, so tests drive the throttling.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Final

__all__ = ["SUMMARY_EVERY", "FailureLog"]

#: seconds between two summaries of a failure that lasts
SUMMARY_EVERY: Final = 60.0


class FailureLog:
    """The failure streak of one retried operation, and the few lines it logs (see module)."""

    def __init__(self, logger: logging.Logger, operation: str, *,
                 summary_every: float = SUMMARY_EVERY,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._log = logger
        #: what is retried, as a log line names it: "flush to http://...", "claim of ..."
        self.operation = operation
        self._every = summary_every
        self._clock = clock
        #: failures in the current streak (0: the operation works)
        self.failures = 0
        self._since = 0.0
        self._last_summary = 0.0

    @property
    def failing(self) -> bool:
        return self.failures > 0

    def failed(self, error: object, *, retry_in: float | None = None,
               exc_info: bool = False) -> None:
        """One more failure of the operation (`retry_in`: seconds until the next try)."""
        now = self._clock()
        self.failures += 1
        then = "" if retry_in is None else f", retrying in {retry_in:.2f} s"
        if self.failures == 1:
            self._since = self._last_summary = now
            self._log.warning("%s failed%s: %s (retried quietly; a summary every %g s while "
                              "it fails)", self.operation, then, error, self._every,
                              exc_info=exc_info)
        elif now - self._last_summary >= self._every:
            self._last_summary = now
            self._log.warning("%s still failing: %d failures in %.0f s, the last: %s",
                              self.operation, self.failures, now - self._since, error)
        else:
            self._log.debug("%s failed again (%d)%s: %s", self.operation, self.failures,
                            then, error)

    def succeeded(self) -> None:
        """The operation worked: a streak, if any, ends (one INFO line)."""
        if not self.failures:
            return
        self._log.info("%s recovered after %d failures in %.1f s", self.operation,
                       self.failures, self._clock() - self._since)
        self.failures = 0
