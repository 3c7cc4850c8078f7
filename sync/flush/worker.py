"""`SyncWorker`: moves the local cache's dirty keys to the central DB in few, large transactions.

One asyncio task per store. Every `flush_interval`, or at once when `max_batch` keys are dirty,
a flush runs its three steps, each a method tests call directly:

1. `collect_dirty` takes the dirty keys as they stand now: coalesced, since a key set 10,000
   times since the last flush is one entry at its latest version;
2. `write_batch` writes up to `max_batch` of them in one transaction through the sink, fenced on
   the central version each write was based on, conflicts settled by the owner's policy;
3. `mark_clean` records what the central DB now holds. A key whose local version moved during
   the flush stays dirty (with its new base) and goes out in the next flush.

Before its first flush, a worker whose cache file was not closed cleanly (a crash, a kill)
runs `refresh_clean`: a flush does not wait for the local commit of what it carries, so the
central DB may hold a later write of a key the file holds clean; the newer central row is taken.

One flush runs at a time (`flush()` waits for the one in flight, then runs its own). When the
central DB fails, the worker backs off (capped exponential, with jitter) and keeps the dirty set
where it is: in the local cache, so memory stays bounded by the number of distinct keys.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Final, TypeVar

from localstate._cache.entry import Entry, StateKey
from localstate._cache.entry_table import EntryTable
from localstate._cache.local_cache import LocalCache
from localstate._cache.outbox import Outbox
from localstate._core.backoff import Backoff
from localstate._core.conflicts import PolicyMap
from localstate._core.failure_log import FailureLog
from localstate._core.rows import DirtyRow, EventRow, EventStatus, FlushOutcome
from localstate._sync.central.fleet import FleetStatus, this_host
from localstate._sync.flush.budget import FlushBudget
from localstate._sync.flush.claims import ClaimBook
from localstate._sync.flush.settle import ConflictInfo, FlushReport, Settler
from localstate._sync.flush.waiters import FlushWaiters
from localstate._sync.sinks.sink import (
    EventSink,
    FleetReporting,
    Sink,
    carries_events,
    keeps_versions,
)
from localstate.errors import CentralUnavailable, InvalidInput, LocalStateError, reason

__all__ = ["CLOSE_TRIES", "SyncWorker", "wait_awake"]

log = logging.getLogger("localstate.sync.worker")

#: tries of the flush at close while the central DB refuses it for now (`_last_flush`)
CLOSE_TRIES: Final = 4
#: seconds a flush cancelled at close may take to unwind before close goes on without it
CANCEL_GRACE: Final = 1.0
#: `wait_awake` looks at its clock every this many seconds at most ...
TIMER_SLICE: Final = 1.0
#: ... and a look this much later than asked means this process did not run meanwhile
STALL: Final = 0.5

_T = TypeVar("_T")


async def wait_awake(call: Awaitable[_T], timeout: float) -> _T:
    """`call`'s result, or `asyncio.TimeoutError` once it went unanswered for `timeout` seconds
    of this process's running time.

    The wall clock runs on while the process does not: stopped (SIGSTOP, a frozen container, a
    paused VM) or its loop blocked. A central DB that committed a flush during such a stop has
    its answer waiting, unread, when the process wakes; `asyncio.wait_for` would see its timer
    expired first and throw the answer away, reporting a committed flush as failed. Here the
    clock is looked at every `TIMER_SLICE` seconds at most, and a look that comes more than
    `STALL` late counts half its slice (the process was stopped for the rest): after a stop,
    the call always gets another slice to deliver what it has."""
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(call)
    left = timeout
    try:
        while left > 0:
            step = min(left, TIMER_SLICE)
            started = loop.time()
            done, _pending = await asyncio.wait({task}, timeout=step)
            if done:
                return task.result()
            took = loop.time() - started
            left -= step / 2 if took > step + STALL else took
        task.cancel()
        await asyncio.wait({task})  # as wait_for: an answer that came meanwhile counts
    except BaseException:
        task.cancel()
        raise
    if task.cancelled():
        raise asyncio.TimeoutError
    return task.result()


class SyncWorker:
    def __init__(
        self,
        *,
        table: EntryTable,
        cache: LocalCache,
        sink: Sink,
        policies: PolicyMap,
        flush_interval: float = 1.0,
        max_batch: int = 10_000,
        on_conflict: Callable[[ConflictInfo], None] | None = None,
        claims: ClaimBook | None = None,
        budget_rows_per_s: float | None = None,
        flush_timeout: float = 60.0,
        outbox: Outbox | None = None,
    ) -> None:
        #: the store's entries: the worker reads them and changes them only through the table
        self.table = table
        self.cache = cache
        self.sink = sink
        self.policies = policies
        self.flush_interval = flush_interval
        self.max_batch = max_batch
        #: seconds one batch's transaction may take (`write_batch`)
        self.flush_timeout = flush_timeout
        #: the events emitted with watermarks (`StateStore.emit`); each flush carries them
        self.outbox = outbox if outbox is not None else Outbox(cache)
        #: the store's claim epochs: stamped on each flushed row, told of owners lost
        self.claims = claims if claims is not None else ClaimBook()
        #: the fleet's central write budget, which stretches `interval` (None: no budget)
        self.budget = (None if budget_rows_per_s is None
                       else FlushBudget(budget_rows_per_s, flush_interval))
        self._kick = asyncio.Event()
        self._stop = asyncio.Event()
        # Set by a successful flush (and by stop): ends a retry backoff early, so once any
        # flush finds the DB back the loop flushes on kicks again at once.
        self._retry_wake = asyncio.Event()
        self._flush_lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._waiters = FlushWaiters()  # central-durability calls waiting for a flush
        # capped at one flush interval: after an outage the lag recovers within two intervals
        self._backoff = Backoff(base=min(0.1, flush_interval / 4), cap=flush_interval)
        #: the log lines of a flush failing through an outage: one at its start, a summary a
        #: minute, one at recovery
        self.failure_log = FailureLog(log, f"flush to {sink.url}")
        # figures for stats()
        self.flushes = 0
        self.central_errors = 0
        self.last_flush_at: float | None = None
        self.last_flush: FlushReport | None = None
        self.last_error: BaseException | None = None
        self.lags: deque[float] = deque(maxlen=10_000)
        # the rows per second this worker writes: the last flush's rows over the time from its
        # start to the next one's (the fleet table's figure)
        self._last_start: float | None = None
        self._last_rows = 0
        self.rows_per_s = 0.0
        #: the file was not closed cleanly: its clean rows are checked against the central
        #: DB before the first flush (`refresh_clean`), where the sink keeps versions to
        #: compare (Airflow's state store does not)
        self.refresh_pending = not cache.closed_cleanly and keeps_versions(sink)
        #: settles the outcomes off the common path; owns the conflicted keys
        self._settler = Settler(table=table, waiters=self._waiters, claims=self.claims,
                                policies=policies, lags=self.lags, on_conflict=on_conflict)

    @property
    def conflicted(self) -> set[StateKey]:
        """Keys whose last flush met a conflict (the record's flush state says "conflict")."""
        return self._settler.conflicted

    @property
    def conflicts(self) -> int:
        """Conflicts settled by this worker's flushes."""
        return self._settler.conflicts

    # -- running -------------------------------------------------------------------------

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name="localstate-sync-worker"
            )

    def retune(self, *, flush_interval: float, max_batch: int) -> None:
        """Take new settings while running (a config reload); a wait in progress ends now."""
        self.flush_interval = flush_interval
        self.max_batch = max_batch
        self._backoff = Backoff(base=min(0.1, flush_interval / 4), cap=flush_interval)
        if self.budget is not None:
            self.budget.retune(flush_interval)
        self._kick.set()

    @property
    def interval(self) -> float:
        """Seconds between flushes now: `flush_interval`, stretched by the budget if any."""
        return self.flush_interval if self.budget is None else self.budget.interval

    def holds(self, key: StateKey) -> bool:
        """Whether `key`'s entry must stay in memory for this worker: a central-durability
        waiter waits on it, or its last flush lost a conflict (its flush state says so)."""
        return key in self._waiters.pending or key in self.conflicted

    def kick(self) -> None:
        """Flush now rather than at the next interval (enough keys are dirty, or a waiter)."""
        self._kick.set()

    async def stop(self, deadline: float) -> FlushReport | None:
        """Stop the loop, then flush what is dirty; within `deadline` seconds in all."""
        loop = asyncio.get_running_loop()
        end = loop.time() + deadline
        self._stop.set()
        # Wake the loop too: between flushes it waits on `_kick` (or `_retry_wake`), not on
        # `_stop`; stopping returns without waiting out an interval.
        self._kick.set()
        self._retry_wake.set()
        task, self._task = self._task, None
        abandoned = False
        if task is not None:
            # A flush under way ends the loop's last turn. A central DB that stopped answering
            # (a server frozen, packets dropped: no error, no timeout) would hold it, and this
            # close, forever: it gets the deadline, then is cancelled (its keys stay dirty).
            await asyncio.wait({task}, timeout=deadline)
            if not task.done():
                # between two steps (a deadline of 0 gives the loop no turn) or in a flush
                abandoned = self._flush_lock.locked()
                task.cancel()
                await asyncio.wait({task}, timeout=CANCEL_GRACE)
            if abandoned:
                log.warning("a flush to %s did not end within %g s (close_timeout): "
                            "abandoned; %d dirty keys stay in the local cache %s and are "
                            "flushed at the next start", self.sink.url, deadline,
                            len(self.table.dirty), self.cache.path)
        report = None
        if (self.table.dirty or len(self.outbox)) and not abandoned:
            report = await self._last_flush(max(0.0, end - loop.time()))
        self._waiters.fail_all(CentralUnavailable(
            "the store closed before the central DB held this write; it is kept in the local "
            f"cache {self.cache.path} and flushed at the next start"))
        return report

    async def _last_flush(self, deadline: float) -> FlushReport | None:
        """The flush at close, within `deadline` seconds: tried up to `CLOSE_TRIES` times
        while the central DB refuses it for now. A deadlock or a lock timeout against another
        triggerer's flush of the same keys, or a dropped connection, is gone a moment later,
        and nothing flushes after close: the keys would wait for the next start. The tries
        are few, not "until the deadline": a refusal that lasts (the DB down, an asset Airflow
        no longer takes) would hold every close for the whole ``close_timeout``."""
        loop = asyncio.get_running_loop()
        end = loop.time() + deadline
        backoff = Backoff(base=0.05, cap=0.5)
        tries = 0
        while True:
            tries += 1
            try:
                return await asyncio.wait_for(self.flush(), max(0.0, end - loop.time()))
            except CentralUnavailable as exc:
                delay = backoff.next_delay()
                if tries < CLOSE_TRIES and loop.time() + delay < end:
                    # a backoff between tries, not a poll: nothing to wait on but time
                    await asyncio.sleep(delay)
                    continue
                failure: BaseException = exc
            except (asyncio.TimeoutError, LocalStateError) as exc:
                failure = exc
            log.warning(
                "could not flush %d dirty keys before closing (%s, after %d tries in %.1f s); "
                "they stay in the local cache %s and are flushed at the next start",
                len(self.table.dirty), reason(failure), tries, deadline - (end - loop.time()),
                self.cache.path,
            )
            return None

    async def _run(self) -> None:
        retry_in: float | None = None
        loop = asyncio.get_running_loop()
        # Flushes start every flush_interval (a fixed rate, not a pause after each flush), so
        # a set waits at most one interval plus one flush's duration to reach the sink.
        tick = loop.time()
        while not self._stop.is_set():
            if retry_in is not None:
                # after a failure wait out the backoff: kicks (a full batch, a central write)
                # must not turn an outage into a busy loop of retries
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._retry_wake.wait(), retry_in)
                if self._retry_wake.is_set():  # a flush succeeded meanwhile: the DB is back
                    retry_in = None
                    self._backoff.reset()
            else:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._kick.wait(),
                                           max(0.0, tick + self.interval - loop.time()))
            tick = loop.time()
            if self._stop.is_set():
                return
            self._kick.clear()
            if not self.table.dirty and not len(self.outbox) and not self.refresh_pending:
                continue
            try:
                await self.flush()
            except Exception as exc:  # the loop must outlive any one failed flush
                retry_in = self._backoff.next_delay()
                self._retry_wake.clear()
                self.failure_log.failed(exc, retry_in=retry_in,
                                        exc_info=not isinstance(exc, LocalStateError))
            else:
                self._backoff.reset()
                retry_in = None
                if self.budget is not None:
                    await self.budget.refresh(self.sink)

    # -- one flush -----------------------------------------------------------------------

    async def flush(self) -> FlushReport:
        """Flush every key dirty now, in batches of `max_batch`; one flush at a time."""
        async with self._flush_lock:
            started = time.monotonic()
            report = FlushReport(started_at=time.time())
            self._note_fleet(report.started_at)
            try:
                if self.refresh_pending:
                    report.refreshed = await self.refresh_clean()
                    self.refresh_pending = False
                # No wait for the local commit first: under load that costs a whole round of
                # the writer. A version flushed here and then lost locally in a crash comes
                # back from the central DB as this cache file's own later write, which the flush
                # adopts without a conflict (see `localstate._sync.central.fenced_write`).
                keys = list(self.table.dirty)
                # Taken after the dirty keys, with no await between: every event staged before
                # a watermark write among `keys` is here, and goes in the first batch, so the
                # central DB never holds a watermark without the events emitted with it.
                events = self.outbox.pending()
                held = self.claims.waiting
                if held:  # owners whose claim waits: their writes go out under it, later
                    keys = [k for k in keys if k[0] not in held]
                    events = [e for e in events if e.owner not in held]
                if len(events) > self.max_batch:
                    # a backlog (after an outage): `max_batch` events per flush, and the
                    # state of the owners with events left over waits for them
                    waiting = {e.owner for e in events[self.max_batch:]}
                    events = events[:self.max_batch]
                    keys = [k for k in keys if k[0] not in waiting]
                for start in range(0, max(len(keys), 1), self.max_batch):
                    rows = self.collect_dirty(keys[start:start + self.max_batch])
                    if not rows and not events:
                        continue
                    if events:
                        try:
                            outcomes, statuses = await self.write_with_events(rows, events)
                        except InvalidInput as exc:
                            # the central side refuses some event for good: find it, drop
                            # it (logged), commit the others; then the rows alone
                            await self.settle_rejected(events, exc)
                            report.events += len(events)
                            events = []
                            if not rows:
                                continue
                            outcomes = await self.write_batch(rows)
                        else:
                            self.outbox.settle(events, statuses)
                            report.events += len(events)
                            events = []
                    else:
                        outcomes = await self.write_batch(rows)
                    self.mark_clean(outcomes, report)
                    report.transactions += 1
            except Exception as exc:
                self.central_errors += 1
                self.last_error = exc
                raise
            report.duration = time.monotonic() - started
            report.still_dirty = len(self.table.dirty)
            if self._events_to_send():  # more than one flush takes: the next one at once
                self._kick.set()
            self._last_rows = report.written
            self.flushes += 1
            self.last_flush_at = time.time()
            self.last_flush = dataclasses.replace(report, outcomes=[])  # counts only
            self.last_error = None
            self.failure_log.succeeded()
            self._retry_wake.set()
            return report

    def _events_to_send(self) -> bool:
        """Whether the outbox holds events a flush would send now (not only held ones)."""
        held = self.claims.waiting
        if not held:
            return bool(len(self.outbox))
        return any(e.owner not in held for e in self.outbox.pending())

    def _note_fleet(self, now: float) -> None:
        """Tell a sink that keeps the fleet table this triggerer's figures for the flush
        starting `now` (`localstate._sync.central.fleet`)."""
        if self._last_start is not None and now > self._last_start:
            self.rows_per_s = self._last_rows / (now - self._last_start)
        self._last_start = now
        if isinstance(self.sink, FleetReporting):
            host, pid = this_host()
            table = self.table
            # the backlog: keys still waiting once the batch carrying this row commits (the
            # keys the flush writes are not waiting; a steady triggerer shows 0)
            self.sink.note_fleet(FleetStatus(
                table.updated_by, host, pid, now, max(0, len(table.dirty) - self.max_batch),
                table.oldest_dirty(), self.rows_per_s, self.interval))

    async def refresh_clean(self) -> int:
        """Step 0, once, before the first flush of a file that was not closed cleanly: read
        the central rows of the keys the file holds clean and take those newer than the file's
        (`EntryTable.adopt`: a clean entry takes a newer row; one written meanwhile is the
        flush's). Those are writes a flush carried to the central DB before their local commit,
        which a crash then kept from the file. Returns how many rows were taken."""
        table = self.table
        clean = [k for k, e in table.entries.items() if not e.dirty]
        taken = 0
        for start in range(0, len(clean), self.max_batch):
            chunk = clean[start:start + self.max_batch]
            since = {owner: table.read_epoch(owner) for owner in {k[0] for k in chunk}}
            try:
                rows = await wait_awake(self.sink.read_many(chunk), self.flush_timeout)
            except asyncio.TimeoutError:
                raise CentralUnavailable(
                    f"the central DB {self.sink.url} did not answer a read of {len(chunk)} "
                    f"rows within {self.flush_timeout:g} s (flush_timeout); the check of the "
                    "cache file's clean rows is retried before the next flush") from None
            for k, row in rows.items():
                e = table.entries.get(k)
                if e is not None and not e.dirty and row.version > e.version:
                    table.adopt(k, row, since[k[0]])
                    taken += 1
        if taken:
            log.info("%d keys of %s were behind the central DB, which holds later writes of "
                     "theirs that the file missed (it was not closed cleanly); took them",
                     taken, self.cache.path)
        return taken

    def collect_dirty(self, keys: Sequence[StateKey] | None = None) -> list[DirtyRow]:
        """Step 1: a snapshot of the dirty entries among `keys` (default: all dirty keys)."""
        return self.table.collect_dirty(keys)

    async def write_batch(self, rows: Sequence[DirtyRow]) -> list[FlushOutcome]:
        """Step 2: one fenced transaction through the sink, as this cache file's writes, each
        with the claim epoch it was written under, within `flush_timeout` seconds.

        A central DB that stopped answering (a frozen server, or an old primary whose address
        moved to a new one while packets to the old connection are dropped) returns no error
        and fires no timeout of its own: the flush, and every flush after it, would wait until
        TCP gives up (minutes). Abandoned, the batch stays dirty and the next try opens a new
        connection. A commit whose answer was lost so is replayed safely: the version fence
        takes a write of this file's own chain again (`localstate._sync.central.fenced_write`).

        The timeout counts the time this process ran (`wait_awake`): a flush that committed
        while the process was stopped is reported committed when it wakes, whatever its
        timer said."""
        try:
            return await wait_awake(
                self.sink.write_batch(self.claims.stamp(rows), self.policies,
                                      writer=self.cache.writer_id),
                self.flush_timeout)
        except asyncio.TimeoutError:
            raise CentralUnavailable(
                f"the central DB {self.sink.url} did not answer a flush of {len(rows)} rows "
                f"within {self.flush_timeout:g} s (flush_timeout); the writes stay in the local "
                "cache and are retried") from None

    async def write_with_events(self, rows: Sequence[DirtyRow], events: Sequence[EventRow]
                                ) -> tuple[list[FlushOutcome], list[EventStatus]]:
        """Step 2 with events: `write_batch` of `rows` and `events` (each stamped with its
        owner's claim epoch) in one transaction through the sink."""
        sink = self.sink
        if not carries_events(sink) or not isinstance(sink, EventSink):
            raise CentralUnavailable(
                f"the sink {self.sink.url} does not commit events; {len(events)} events stay in "
                f"the outbox of {self.cache.path} until a sink that does (sql or api) is set")
        epoch_of = self.claims.epoch_of
        stamped = [e._replace(epoch=epoch_of(e.owner)) for e in events]
        try:
            return await wait_awake(
                sink.write_with_events(self.claims.stamp(rows), stamped, self.policies,
                                       writer=self.cache.writer_id,
                                       triggerer=self.table.updated_by),
                self.flush_timeout)
        except asyncio.TimeoutError:
            raise CentralUnavailable(
                f"the central DB {self.sink.url} did not answer a flush of {len(rows)} rows and "
                f"{len(events)} events within {self.flush_timeout:g} s (flush_timeout); they "
                "stay in the local cache and are retried") from None

    async def settle_rejected(self, events: Sequence[EventRow], error: InvalidInput) -> None:
        """`events` were refused as malformed (`error`): commit them in halves, without any
        state row (an event committed before its watermark is safe: a re-emit is a duplicate),
        down to the single events the central side refuses, which are dropped from the outbox
        with an error logged. Never a stuck outbox: the flush goes on."""
        if len(events) == 1:
            e = events[0]
            log.error("the central side refused the event %s/%s (seq %d) for good: %s; it is "
                      "dropped from the outbox of %s (its watermark goes on). Check that "
                      "max_value_bytes there is not below this triggerer's", e.owner, e.key,
                      e.seq, error, self.cache.path)
            self.outbox.reject(e)
            return
        half = len(events) // 2
        for part in (events[:half], events[half:]):
            try:
                _outcomes, statuses = await self.write_with_events([], part)
            except InvalidInput as exc:
                await self.settle_rejected(part, exc)
            else:
                self.outbox.settle(part, statuses)

    def mark_clean(self, outcomes: Sequence[FlushOutcome], report: FlushReport | None = None
                   ) -> None:
        """Step 3: record what the central DB holds now; stage it for the local file."""
        report = report if report is not None else FlushReport()
        report.rows += len(outcomes)
        report.outcomes.extend(outcomes)
        now = time.time()
        table, lags = self.table, self.lags
        entries = table.entries
        waiting = bool(self._waiters.pending)  # no await below: nobody registers meanwhile
        conflicted = self._settler.conflicted
        staged: dict[StateKey, Entry] = {}
        written = 0
        for o in outcomes:
            r = o.row
            k = (r.owner, r.key)
            e = entries.get(k)
            if e is None:
                continue
            central = o.central
            if (central is not None and o.resolution == "written" and not o.conflict
                    and e.version == r.version):
                # The common case, kept flat: the central DB holds exactly the local entry.
                written += 1
                since = table.settle_written(k, e, central.version)
                if waiting:
                    self._waiters.settle(k, r.version, None)
                if conflicted:
                    conflicted.discard(k)
                if since is not None:
                    # flush lag: from the oldest write the central DB lacked until it holds it
                    lags.append(now - since if now > since else 0.0)
            else:
                self._settler.settle(o, e, k, report, now)
            staged[k] = e
        report.written += written
        table.stage_settled(staged)

    # -- central-durability waiters ------------------------------------------------------

    def expect_flush(self, key: StateKey, version: int) -> asyncio.Future[None]:
        """Register a waiter for `version` of `key`; pass it to `wait_flushed`.

        Register it before any await a flush could overtake: a flush that carries the version
        before its waiter exists settles nothing, and the waiter then times out.
        """
        return self._waiters.expect(key, version)

    def drop_waiter(self, key: StateKey, fut: asyncio.Future[None]) -> None:
        self._waiters.drop(key, fut)

    async def wait_flushed(self, key: StateKey, version: int, timeout: float,
                           fut: asyncio.Future[None] | None = None) -> None:
        """Wait until the central DB holds `version` of `key` (or a later one)."""
        if fut is None:
            fut = self.expect_flush(key, version)
        self.kick()
        try:
            await asyncio.wait_for(asyncio.shield(fut), timeout)
        except asyncio.TimeoutError:
            raise CentralUnavailable(
                f"the central DB {self.sink.url} did not take {key[0]}/{key[1]} v{version} "
                f"within {timeout:g} s ({self.last_error or 'no error yet'}); the write is "
                "kept in the local cache and flushed when the DB answers"
            ) from None
        finally:
            self.drop_waiter(key, fut)
