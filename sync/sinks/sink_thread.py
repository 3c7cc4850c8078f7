"""`ThreadedSink`: the central DB client on its own thread and event loop.

A triggerer's event loop runs every trigger. When thousands of them are busy, each turn of the
loop takes as long as all their steps together, and a flush that needs a dozen turns (a local
commit, a connection checkout, BEGIN, the statement, COMMIT: each one await) would take a dozen
of those turns: at 10,000 triggers in hot loops that stretched a 0.15 s flush to over a second.
Here the database conversation runs on a loop of its own: the trigger loop hands a batch over
and waits for one answer (one turn), while the driver's round trips never queue behind triggers.

The wrapped sink is created, used and closed on that thread's loop (asyncpg connections belong
to the loop that made them). The entries map is never touched there: the worker's
collect_dirty and mark_clean steps stay on the trigger loop.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, TypeVar

from localstate._cache.entry import StateKey
from localstate._core.conflicts import PolicyMap
from localstate._core.rows import CentralRow, DirtyRow, EventRow, EventStatus, FlushOutcome
from localstate._sync.central.fleet import FleetStatus
from localstate._sync.sinks.sink import (
    ClaimingSink,
    EventSink,
    FleetReporting,
    ReleaseRecording,
    Sink,
)
from localstate.errors import ConfigError, EventsUnsupported

__all__ = ["ThreadedSink"]

_T = TypeVar("_T")


class ThreadedSink:
    """A `Sink` that runs another sink on a private event loop thread."""

    def __init__(self, loop: asyncio.AbstractEventLoop, thread: threading.Thread,
                 inner: Sink) -> None:
        self._loop = loop
        self._thread = thread
        self.inner = inner
        self.url = inner.url

    @classmethod
    async def open(cls, make: Callable[[], Awaitable[Sink]], *, name: str = "localstate-central"
                   ) -> ThreadedSink:
        """Start the thread and build the sink there with `make()`."""
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, name=name, daemon=True)
        thread.start()

        async def build() -> Sink:
            return await make()

        try:
            inner = await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(build(), loop))
        except BaseException:
            loop.call_soon_threadsafe(loop.stop)
            thread.join()
            loop.close()
            raise
        return cls(loop, thread, inner)

    async def _call(self, coro: Coroutine[Any, Any, _T]) -> _T:
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self._loop))

    async def call(self, coro: Coroutine[Any, Any, _T]) -> _T:
        """Run `coro` (a call on the wrapped sink) on the sink's own loop and thread."""
        return await self._call(coro)

    # the counters the store's stats and the benchmark read
    @property
    def transactions(self) -> int:
        return self.inner.transactions

    @property
    def rows_written(self) -> int:
        return self.inner.rows_written

    async def write_batch(
        self, rows: Sequence[DirtyRow], policies: PolicyMap, *, writer: str | None = None
    ) -> list[FlushOutcome]:
        return await self._call(self.inner.write_batch(rows, policies, writer=writer))

    async def write_with_events(
        self, rows: Sequence[DirtyRow], events: Sequence[EventRow], policies: PolicyMap, *,
        writer: str | None = None, triggerer: str | None = None,
    ) -> tuple[list[FlushOutcome], list[EventStatus]]:
        """The wrapped sink's `write_with_events` (`EventSink`); `EventsUnsupported` when it
        has none."""
        if not isinstance(self.inner, EventSink):
            raise EventsUnsupported(f"the sink {self.url} does not commit events")
        return await self._call(self.inner.write_with_events(
            rows, events, policies, writer=writer, triggerer=triggerer))

    async def read_many(self, keys: Sequence[StateKey]) -> dict[StateKey, CentralRow]:
        return await self._call(self.inner.read_many(keys))

    async def read_owner(self, owner: str) -> list[CentralRow]:
        return await self._call(self.inner.read_owner(owner))

    async def write_direct(
        self, owner: str, key: str, data: str | None, *, updated_at: float, updated_by: str,
        writer: str | None = None,
    ) -> CentralRow:
        return await self._call(self.inner.write_direct(
            owner, key, data, updated_at=updated_at, updated_by=updated_by, writer=writer,
        ))

    async def delete_current(self, owner: str, key: str, *, updated_by: str,
                             writer: str | None = None) -> bool:
        return await self._call(self.inner.delete_current(owner, key, updated_by=updated_by,
                                                          writer=writer))

    async def write_if_version(
        self, owner: str, key: str, data: str | None, expected_version: int, *,
        updated_by: str, updated_at: float | None = None, writer: str | None = None,
    ) -> CentralRow:
        return await self._call(self.inner.write_if_version(
            owner, key, data, expected_version, updated_by=updated_by, updated_at=updated_at,
            writer=writer,
        ))

    async def claim(self, owner: str, *, claimant: str, writer: str | None = None,
                    unless_claimed_since: float | None = None) -> int:
        """The wrapped sink's `claim` (`ClaimingSink`); `ConfigError` when it has none."""
        if not isinstance(self.inner, ClaimingSink):
            raise ConfigError(f"the sink {self.url} keeps no claims: it cannot fence writers")
        return await self._call(self.inner.claim(
            owner, claimant=claimant, writer=writer, unless_claimed_since=unless_claimed_since))

    async def record_release(self, owner: str, *, epoch: int, claimant: str,
                             writer: str | None = None) -> bool:
        """The wrapped sink's `record_release` (`ReleaseRecording`); False when it has none."""
        if not isinstance(self.inner, ReleaseRecording):
            return False
        return await self._call(self.inner.record_release(owner, epoch=epoch,
                                                          claimant=claimant, writer=writer))

    def note_fleet(self, status: FleetStatus) -> None:
        """The wrapped sink's `note_fleet`, if it keeps a fleet table (a plain assignment
        there: the next write_batch, handed over after it, sees it)."""
        if isinstance(self.inner, FleetReporting):
            self.inner.note_fleet(status)

    async def read_fleet(self) -> list[FleetStatus]:
        if not isinstance(self.inner, FleetReporting):
            return []
        return await self._call(self.inner.read_fleet())

    async def close(self) -> None:
        """Close the wrapped sink on its loop, then stop the thread. Safe twice."""
        if self._loop.is_closed():
            return
        try:
            await self._call(self.inner.close())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            try:
                await asyncio.to_thread(self._thread.join)
            except RuntimeError:
                # at interpreter exit (a default store closed by atexit) the default executor
                # is shut down; the stopped loop's thread ends within one turn anyway
                self._thread.join()
            self._loop.close()
