"""`ReadThrough`: cache misses read from the central DB, many misses per query.

Misses that arrive while a read is in flight wait for the next one, which carries all of them:
a thousand triggers starting at once cost a handful of queries, not a thousand. A read that
fails is logged through a `FailureLog`: once when reads start failing, a summary a minute, once
when they work again (each caller gets the error itself).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from localstate._entry import StateKey
from localstate._failure_log import FailureLog
from localstate._futures import mark_retrieved
from localstate._rows import CentralRow
from localstate._sync.sinks import Sink

__all__ = ["ReadThrough"]

log = logging.getLogger("localstate.sync.read_through")


class ReadThrough:
    def __init__(self, sink: Sink) -> None:
        self._sink = sink
        self._pending: dict[StateKey, asyncio.Future[CentralRow | None]] = {}
        self._inflight: dict[StateKey, asyncio.Future[CentralRow | None]] = {}
        self._task: asyncio.Task[None] | None = None
        self.queries = 0
        self.failure_log = FailureLog(log, f"read-through from {sink.url}")

    async def fetch(self, key: StateKey) -> CentralRow | None:
        """The central record of `key`, or None; raises the sink's error on failure."""
        fut = self._pending.get(key) or self._inflight.get(key)
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
            self._inflight = batch
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
                self._inflight = {}

    async def close(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

