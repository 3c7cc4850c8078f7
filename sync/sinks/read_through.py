"""`ReadThrough`: cache misses read from the central DB, many misses per query.

Misses that arrive while a read is in flight wait for the next one, which carries all of them:
a thousand triggers starting at once cost a handful of queries, not a thousand. A read that
fails is logged through a `FailureLog`: once when reads start failing, a summary a minute, once
when they work again (each caller gets the error itself).

Invariant: every answer comes from a query that began after `fetch` was called. A fetch joins
the next read (not yet sent), never the one running, even for the same key: that one's
snapshot may predate a write this store made and the central DB acknowledged since. The
store's reads rely on it: a reader takes its owner's read epoch, then fetches, and adopts the
row only if no entry of the owner was dropped meanwhile (`EntryTable.read_epoch`). A row from a
query older than the epoch could bring back a key evicted or released after such a write, at
the version before it; a write based on that row would then be taken by the flush's fence for
a replay of this store's own chain, and replace the acknowledged write.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from localstate._cache.entry import StateKey
from localstate._core.failure_log import FailureLog
from localstate._core.futures import mark_retrieved
from localstate._core.rows import CentralRow
from localstate._sync.sinks.sink import Sink

__all__ = ["ReadThrough"]

log = logging.getLogger("localstate.sync.read_through")


class ReadThrough:
    def __init__(self, sink: Sink) -> None:
        self._sink = sink
        #: the keys of the next read, not yet sent (a fetch joins only these: see above)
        self._pending: dict[StateKey, asyncio.Future[CentralRow | None]] = {}
        self._task: asyncio.Task[None] | None = None
        self.queries = 0
        self.failure_log = FailureLog(log, f"read-through from {sink.url}")

    async def fetch(self, key: StateKey) -> CentralRow | None:
        """The central record of `key`, or None, read by a query that begins after this call;
        raises the sink's error on failure."""
        fut = self._pending.get(key)
        if fut is None:
            fut = asyncio.get_running_loop().create_future()
            self._pending[key] = fut
            if self._task is None or self._task.done():
                self._task = asyncio.get_running_loop().create_task(
                    self._run(), name="localstate-read-through"
                )
        # shield: one caller cancelled must not cancel the read the others wait on
        return await asyncio.shield(fut)

    async def _run(self) -> None:
        while self._pending:
            batch, self._pending = self._pending, {}
            try:
                rows = await self._sink.read_many(list(batch))
            except BaseException as exc:
                if isinstance(exc, Exception):
                    self.failure_log.failed(exc)
                for fut in batch.values():
                    if not fut.done():
                        fut.set_exception(exc)
                        fut.add_done_callback(mark_retrieved)
                if not isinstance(exc, Exception):
                    raise
            else:
                self.failure_log.succeeded()
                for key, fut in batch.items():
                    if not fut.done():
                        fut.set_result(rows.get(key))
            finally:
                self.queries += 1

    async def close(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

