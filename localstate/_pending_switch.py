"""`PendingTurnOff`: a turn-off of the local cache that waits for its backlog to be central.

Turning the cache off (``enabled = False``) must never leave an acknowledged write behind: the
store switches to direct mode only once every write its cache holds is in the central DB. While
the central DB cannot take that backlog (it is down, or refuses the flush), the turn-off is
*pending*: the store goes on serving every call from the local cache, exactly as with the cache
on, and this task flushes (with the gate open: writes keep being acknowledged meanwhile). After
each flush that succeeds it tries the switch itself (`finish`: calls held back at the gate, the
rest of the backlog flushed within ``close_timeout``, the cache closed); when that fails too,
it goes on waiting. There is no other bound: the wait lasts as long as the central DB does not
take the writes, and nothing is lost meanwhile (they are in the local file).

Closing the store ends the wait (`cancel`): the close flushes as usual, and what it cannot
flush stays in the local file; the next start finds it there and finishes the turn-off first
(it serves from the cache until those writes are central, even with ``enabled = False``).

Owned by `StateStore`, which alone starts and cancels it. The figures (`since`, `tries`,
`last_error`) are read by the store's stats.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Final

from localstate._local_first import LocalFirstMode
from localstate.errors import LocalStateError

__all__ = ["PendingTurnOff"]

# the store's logger: a pending switch is the store's news
log = logging.getLogger("localstate.store")

#: seconds between two warnings that the switch is still pending
_WARN_EVERY: Final = 30.0


class PendingTurnOff:
    """Flush `mode` until its backlog is central, then have `finish` switch (see the module
    docstring). `finish` returns True once the switch is made (or nothing is left to switch),
    False when the backlog could not be flushed with the calls held (try again later)."""

    def __init__(self, mode: LocalFirstMode, finish: Callable[[], Awaitable[bool]], *,
                 retry_interval: float) -> None:
        self.mode = mode
        self._finish = finish
        self.retry_interval = retry_interval
        #: POSIX time the turn-off was asked for
        self.since = time.time()
        #: flushes tried so far, and the error of the last one that failed (None: none yet)
        self.tries = 0
        self.last_error: str | None = None
        self.finished = asyncio.Event()
        self._stop = asyncio.Event()
        self._switching = False
        self._warned_at = 0.0
        self._task = asyncio.get_running_loop().create_task(
            self._run(), name="localstate-turn-off")

    @property
    def pending_s(self) -> float:
        """Seconds the turn-off has been waiting."""
        return max(0.0, time.time() - self.since)

    async def wait(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds for the switch; whether it was made."""
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.finished.wait(), timeout)
        return self.finished.is_set()

    async def cancel(self) -> bool:
        """Stop waiting (the cache was turned on again, or the store closes); whether the
        switch was made first (a switch in progress is let finish)."""
        self._stop.set()
        if not self._switching:
            self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        return self.finished.is_set()

    async def _run(self) -> None:
        table = self.mode.parts.table
        while not self._stop.is_set():
            self.tries += 1
            try:
                await self.mode.worker.flush()
            except LocalStateError as exc:
                self.last_error = str(exc)
                self._warn(len(table.dirty), exc)
            else:
                self._switching = True
                try:
                    if await self._finish():
                        self.finished.set()
                        log.info("the local cache is off after %.1f s waiting for the central "
                                 "DB; every call goes to the central DB now", self.pending_s)
                        return
                finally:
                    self._switching = False
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._stop.wait(), self.retry_interval)

    def _warn(self, dirty: int, exc: BaseException) -> None:
        now = time.monotonic()
        if now - self._warned_at < _WARN_EVERY:
            return
        self._warned_at = now
        log.warning(
            "turning the local cache off is pending for %.0f s: %d writes are not in the "
            "central DB yet (%s); the store serves from the local cache and switches once "
            "they are flushed", self.pending_s, dirty, exc)
