"""`CentralStore`: the central metadata DB through SQLAlchemy 2 async (PostgreSQL, MySQL or
SQLite).

One code path for both dialects; the SQL that differs lives in `localstate._sync.central.dialects`.
Every driver error is wrapped: an unreachable or failing database is `CentralUnavailable`,
anything else `CentralError`, with the driver's exception as the cause.

`CentralStore` owns the engine, the schema step and the counters; the statements of the
fenced batch write (a flush: versions, replays, claim losses) are in
`localstate._sync.central.fenced_write`, the compare-and-set in
`localstate._sync.central.cas_write`, each run inside a transaction opened here.

Why one file of this length: `CentralStore` is one object, the one owner of the engine and
of every transaction localstate opens on the central DB (flushes, claims, reads, direct
writes, the history's trims, the fleet rows). Its methods share the engine, the transaction
bound and the error wrapping; split across files, each part would reach into the others'
private state. What is a concept of its own (the fenced batch, the compare-and-set, the
history rows, the dialects' SQL) already lives in its own module.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import (
    AsyncIterator,
    Callable,
    Coroutine,
    Generator,
    Iterable,
    Sequence,
)
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import Executable, select, tuple_
from sqlalchemy.exc import DBAPIError, SQLAlchemyError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.sql.elements import ColumnElement

from localstate._cache.entry import StateKey
from localstate._core.conflicts import PolicyMap
from localstate._core.made_together import MadeTogether
from localstate._core.model import MAX_VERSION
from localstate._core.rows import (
    CentralRow,
    DirtyRow,
    EventRow,
    EventStatus,
    FlushOutcome,
    central_row,
    posix_time,
)
from localstate._sync.central.asset_events import AssetEvents, run_callbacks
from localstate._sync.central.asset_mirror import AssetMirror
from localstate._sync.central.cas_write import check_expected_version, compare_and_set
from localstate._sync.central.dialects import (
    BatchSql,
    batch_sql_for,
    claim_many,
    claim_with_history,
    prefix_upper_bound,
)
from localstate._sync.central.driver_errors import is_unreachable
from localstate._sync.central.engine import (
    DEFAULT_TRANSACTION_TIMEOUT,
    make_engine,
    read_connection,
)
from localstate._sync.central.fenced_write import select_rows, write_events, write_fenced
from localstate._sync.central.fleet import FleetStatus
from localstate._sync.central.history import (
    HistoryPolicy,
    HistoryRow,
    HistoryTrim,
    OwnerSummary,
    column_time,
    event_rows,
    history_query,
    record_claim,
    record_events,
    record_release,
    record_watermarks,
    rows_of,
    summary,
    trim,
)
from localstate._sync.central.schema import (
    fleet,
    owner_claim,
    require_current,
    state_variable,
    upgrade,
)
from localstate.errors import (
    CentralError,
    CentralUnavailable,
    LocalStateError,
    OwnerLost,
    VersionConflict,
    VersionExhausted,
    WriteRejected,
)

__all__ = ["CentralStore"]

log = logging.getLogger("localstate.sync.central_store")

#: compare-and-delete rounds `delete_current` makes before it gives up under contention
_DELETE_TRIES = 100
#: claims in flight at once, of the pool's 10 connections: the flush and the reads keep the
#: rest, so a storm of claims (hundreds of triggers starting, or moving to this triggerer,
#: some waiting on row locks) never stalls this triggerer's own flushes
_CLAIM_SLOTS = 2
#: the most owners one claim transaction, or one read of owners, takes (`MadeTogether`)
_GROUP = 500
#: the connections reads of whole owners may hold at once: a takeover's claims end together,
#: and their reads of the owners' keys, made together, leave the pool to the flush
_OWNER_READ_SLOTS = 2

def _first(claim: tuple[str, str, str | None]) -> str:
    return claim[0]


class CentralStore:
    """The central table, read and written in batches.

    ``store = await CentralStore.open(url)`` ... ``await store.close()``, or
    ``async with CentralStore.open(url) as store:`` (closed on the way out).
    """

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine
        self.dialect = engine.dialect.name
        batch_sql_for(self.dialect)  # refuses a dialect it has no SQL for
        self.url = engine.url.render_as_string(hide_password=True)
        #: committed write transactions and the rows they wrote (for stats and the benchmark)
        self.transactions = 0
        self.rows_written = 0
        #: events committed by `write_with_events` (new keys: no duplicate, no refusal)
        self.events_committed = 0
        #: registers an asset watcher's events as Airflow asset events (Airflow's DB only)
        self.asset_events = AssetEvents()
        #: the fleet row the next flush records (`note_fleet`), taken by it
        self._fleet_next: FleetStatus | None = None
        #: whether the schema is known to be current; None: checked (and upgraded when this
        #: is True) before the next call, the database having been unreachable at `open`
        self._schema_pending: bool | None = None
        #: set by the opener from the asset_mirror setting (`localstate._sync.central.asset_mirror`)
        self.asset_mirror: AssetMirror | None = None
        #: the connections claims may hold at once (see `_CLAIM_SLOTS`)
        self._claim_slots = asyncio.Semaphore(_CLAIM_SLOTS)
        #: claims (owner, claimant, writer) made together (`MadeTogether`, PostgreSQL)
        self._claims_together = MadeTogether(self._claim_slots, _first, self._make_claims,
                                             _GROUP)
        #: reads of whole owners made together (`MadeTogether`)
        self._owner_reads = MadeTogether(asyncio.Semaphore(_OWNER_READ_SLOTS), str,
                                         self._read_owners, _GROUP)
        #: the owners' history this store writes and trims (`use_history`)
        self._history_trim = HistoryTrim(HistoryPolicy())

    @property
    def history(self) -> HistoryPolicy:
        """Whether writes record history, and its bounds (`localstate._sync.central.history`)."""
        return self._history_trim.policy

    def use_history(self, policy: HistoryPolicy, clock: Callable[[], float] = time.monotonic
                    ) -> None:
        """Write (or not) history under `policy` from the next write on (set by the opener
        from the settings ``history``, ``history_max_rows``, ``history_max_age``,
        ``history_watermark_every``); `clock`: the seconds its windows are counted in."""
        self._history_trim = HistoryTrim(policy, clock)

    @property
    def _sql(self) -> BatchSql:
        """This dialect's SQL. Looked up each time: to SQLAlchemy MariaDB is the MySQL dialect
        until it has connected, and the two name their collations differently."""
        mariadb = getattr(self.engine.dialect, "is_mariadb", False)
        return batch_sql_for("mariadb" if mariadb else self.dialect)

    @classmethod
    def open(cls, url: str, *, upgrade_schema: bool = True,
             defer_if_unreachable: bool = False,
             transaction_timeout: float | None = DEFAULT_TRANSACTION_TIMEOUT) -> _Opening:
        """Open the central DB at `url` and check (or upgrade, `upgrade_schema`) its schema:
        await it, or use it as an async context manager.

        `transaction_timeout`: the server-side bound of each transaction's lock waits and idle
        time (`localstate._sync.central.engine.make_engine`; None: unbounded).

        `defer_if_unreachable`: when the database cannot be reached now, open anyway and do
        the schema step before the first call that reaches it (a local-first store starts and
        serves its cache during an outage); its calls raise `CentralUnavailable` meanwhile.
        """
        return _Opening(cls._open(url, upgrade_schema=upgrade_schema,
                                  defer_if_unreachable=defer_if_unreachable,
                                  transaction_timeout=transaction_timeout))

    @classmethod
    async def _open(cls, url: str, *, upgrade_schema: bool, defer_if_unreachable: bool,
                    transaction_timeout: float | None) -> CentralStore:
        engine = make_engine(url, transaction_timeout=transaction_timeout)
        store = cls(engine)
        try:
            await store._prepare(upgrade_schema)
        except CentralUnavailable as exc:
            if not defer_if_unreachable:
                await engine.dispose()
                raise
            log.warning("%s; opening anyway, the schema is checked once it answers", exc)
            store._schema_pending = upgrade_schema
        except BaseException:
            await engine.dispose()
            raise
        return store

    async def _prepare(self, upgrade_schema: bool) -> None:
        async with self._errors("open"):
            if upgrade_schema:
                await upgrade(self.engine)
            else:
                await require_current(self.engine)
        self._schema_pending = None

    async def _ready(self) -> None:
        """Do the schema step `open` deferred, if any (one attribute test otherwise)."""
        if self._schema_pending is not None:
            await self._prepare(self._schema_pending)

    async def close(self) -> None:
        """Release the connections. Safe twice."""
        await self.engine.dispose()

    async def __aenter__(self) -> CentralStore:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    @contextlib.asynccontextmanager
    async def _errors(self, doing: str) -> AsyncIterator[None]:
        try:
            yield
        except LocalStateError:
            raise
        except (DBAPIError, OSError, TimeoutError, PoolTimeout) as exc:
            unreachable = is_unreachable(exc)
            cls = CentralUnavailable if unreachable else CentralError
            raise cls(
                f"central DB {self.url} failed to {doing}: {_short(exc)}"
                + ("; writes stay in the local cache and are retried" if unreachable else "")
            ) from exc
        except SQLAlchemyError as exc:
            raise CentralError(f"central DB {self.url} failed to {doing}: {_short(exc)}") from exc

    @contextlib.asynccontextmanager
    async def _at_ceiling(self, owner: str, key: str) -> AsyncIterator[None]:
        """A one-key write that failed (rolled back: nothing written) because the key's
        version is at `MAX_VERSION` becomes `VersionExhausted`: every dialect fails the
        statement's ``version + 1`` on a BIGINT at the ceiling, each in its own words, so
        the key is read to tell it from any other failure."""
        try:
            yield
        except CentralError as exc:
            if isinstance(exc, CentralUnavailable):
                raise
            try:
                row = (await self.read_many([(owner, key)])).get((owner, key))
            except LocalStateError:
                raise exc from None
            if row is not None and row.version >= MAX_VERSION:
                raise VersionExhausted.at_ceiling(owner, key) from exc
            raise

    # -- reading -------------------------------------------------------------------------

    async def read_many(self, keys: Sequence[StateKey]) -> dict[StateKey, CentralRow]:
        if not keys:
            return {}
        await self._ready()
        async with self._errors("read"), read_connection(self.engine) as conn:
            return await select_rows(conn, self._sql, keys, lock=False)

    async def read_owner(self, owner: str) -> list[CentralRow]:
        """Every row of `owner`. Reads of owners waiting for a connection are made together,
        one query (`MadeTogether`): a takeover's claims end together and each reads its
        owner's keys."""
        await self._ready()
        return await self._owner_reads(owner)

    async def _read_owners(self, owners: list[str]) -> dict[str, list[CentralRow]]:
        t = state_variable.c
        query = select(t.owner, t.key, t.value, t.version, t.updated_at, t.updated_by).where(
            t.owner.in_(owners))
        found: dict[str, list[CentralRow]] = {o: [] for o in owners}
        async with self._errors("read"), read_connection(self.engine) as conn:
            for r in await conn.execute(query):
                found[r[0]].append(central_row(r))  # names compare byte-wise (schema._name)
        return found

    async def list_rows(
        self, *, owner_prefix: str = "", after: StateKey | None = None, limit: int = 100,
        include_deleted: bool = False,
    ) -> list[CentralRow]:
        """Rows whose owner starts with `owner_prefix` (literally: no character is special),
        in byte-wise (owner, key) order, starting after `after` (cursor pagination).

        Byte-wise whatever the database's collation (see `localstate._sync.central.dialects`), so a
        caller may continue after any row it was given, and merge or sort rows with Python's
        `sorted()`, and find the same order.
        """
        await self._ready()
        t = state_variable.c
        owner, key = self._sql.bytewise(t.owner), self._sql.bytewise(t.key)
        query = select(t.owner, t.key, t.value, t.version, t.updated_at, t.updated_by)
        if owner_prefix:
            query = query.where(owner >= owner_prefix)
            bound = prefix_upper_bound(owner_prefix)
            if bound is not None:
                query = query.where(owner < bound)
        if after is not None:
            query = query.where(tuple_(owner, key) > tuple_(after[0], after[1]))
        if not include_deleted:
            query = query.where(t.value.is_not(None))
        query = query.order_by(owner, key).limit(limit)
        async with self._errors("list"), read_connection(self.engine) as conn:
            return [central_row(r) for r in await conn.execute(query)]

    # -- statements of other modules (retention), wrapped as every call here -------------

    def bytewise(self, column: ColumnElement[str]) -> ColumnElement[str]:
        """`column` compared byte-wise on this database (see `BatchSql.bytewise`)."""
        return self._sql.bytewise(column)

    async def run_read(self, query: Executable, doing: str) -> list[tuple[Any, ...]]:
        """The rows of `query`, its driver errors wrapped (`doing` names it in them)."""
        await self._ready()
        async with self._errors(doing), read_connection(self.engine) as conn:
            return [tuple(row) for row in await conn.execute(query)]

    async def run_write(self, statement: Executable, doing: str) -> int:
        """Run `statement` in a transaction of its own; return the rows it changed."""
        await self._ready()
        async with self._errors(doing), self.engine.begin() as conn:
            result = await conn.execute(statement)
        self.transactions += 1
        return int(result.rowcount)

    # -- claims --------------------------------------------------------------------------

    async def claim(self, owner: str, *, claimant: str, writer: str | None = None,
                    unless_claimed_since: float | None = None) -> int:
        """Claim `owner` for `claimant`: bump its epoch (1 for a first claim) in one
        transaction, record who, when and from which local cache file (`writer`), and return
        the new epoch. From its commit on, every flushed write of `owner` carrying a lower
        epoch is refused, except one from that cache file (its own, made before a restart).

        `unless_claimed_since` (POSIX time): claim only if nobody claimed `owner` after then
        (its claim row is read locked, in the same transaction); else `OwnerLost`, nothing
        changed. A claim retried later (a trigger that started while the DB was out of
        reach) so never takes the owner back from a triggerer that took it over meanwhile.
        """
        await self._ready()
        if unless_claimed_since is None and claim_many(self.dialect, False) is not None:
            return await self._claims_together((owner, claimant, writer))
        now = datetime.now(timezone.utc).timestamp()
        params = {"owner": owner, "by": claimant, "writer": writer,
                  "at": self._sql.timestamp(now)}
        async with self._claim_slots, self._errors("claim"), self.engine.begin() as conn:
            if unless_claimed_since is not None:
                c = owner_claim.c
                row = (await conn.execute(select(c.epoch, c.claimed_at)
                                          .where(c.owner == owner).with_for_update())).first()
                if row is not None and posix_time(row[1]) > unless_claimed_since:
                    raise OwnerLost.claimed_since(owner, int(row[0]))
            # with its history row in the same statement where the dialect can
            combined = claim_with_history(self.dialect) if self.history.enabled else None
            result = await conn.execute(combined if combined is not None else self._sql.claim,
                                        params)
            if self._sql.claim_epoch is not None:  # no RETURNING: the row is locked, read it
                result = await conn.execute(self._sql.claim_epoch, params)
            epoch = int(result.scalar_one())
            if self.history.enabled and combined is None:
                await record_claim(conn, owner, epoch, claimant, writer,
                                   column_time(self.dialect, now))
        self.transactions += 1
        if self.history.enabled:
            await self._trim_history([owner])
        return epoch

    async def _make_claims(self, claims: list[tuple[str, str, str | None]]) -> dict[str, int]:
        """Claim each (owner, claimant, writer) of `claims` in one transaction, one statement
        (`claim_many`, with their history rows); each owner's new epoch."""
        statement = claim_many(self.dialect, self.history.enabled)
        assert statement is not None
        params = {"owners": [c[0] for c in claims], "claimants": [c[1] for c in claims],
                  "writers": [c[2] for c in claims],
                  "at": self._sql.timestamp(datetime.now(timezone.utc).timestamp())}
        async with self._errors("claim"), self.engine.begin() as conn:
            epochs = {row[0]: int(row[1]) for row in await conn.execute(statement, params)}
        self.transactions += 1
        if self.history.enabled:
            await self._trim_history(epochs)
        return epochs

    async def read_claims(self, owners: Sequence[str]) -> dict[str, tuple[int, str]]:
        """The claimed owners among `owners`: each one's (epoch, claimant)."""
        await self._ready()
        c = owner_claim.c
        async with self._errors("read"), read_connection(self.engine) as conn:
            result = await conn.execute(
                select(c.owner, c.epoch, c.claimant).where(c.owner.in_(set(owners))))
            return {o: (int(e), by) for o, e, by in result}

    # -- the fleet table -----------------------------------------------------------------

    def note_fleet(self, status: FleetStatus) -> None:
        """Have the next `write_batch` record `status` in the fleet table, in its own
        transaction (`localstate._sync.central.fleet`)."""
        self._fleet_next = status

    async def read_fleet(self) -> list[FleetStatus]:
        """Every triggerer's row of the fleet table."""
        await self._ready()
        c = fleet.c
        async with self._errors("read"), read_connection(self.engine) as conn:
            result = await conn.execute(select(
                c.triggerer, c.host, c.pid, c.last_flush_at, c.dirty_keys,
                c.oldest_unflushed_at, c.rows_per_s, c.flush_interval))
            return [FleetStatus(t, h, int(p), posix_time(at), int(d),
                             None if old is None else posix_time(old), float(rate), float(iv))
                    for t, h, p, at, d, old, rate, iv in result]

    # -- writing -------------------------------------------------------------------------

    async def write_direct(
        self, owner: str, key: str, data: str | None, *, updated_at: float, updated_by: str,
        writer: str | None = None,
    ) -> CentralRow:
        """One unconditional write in its own transaction: the cache-off (direct) path.
        `writer`: the writing store's id, recorded with the row (`Sink.write_direct`)."""
        await self._ready()
        params = {"owner": owner, "key": key, "value": data,
                  "at": self._sql.timestamp(updated_at), "by": updated_by, "writer": writer}
        async with (self._at_ceiling(owner, key), self._errors("write"),
                    self.engine.begin() as conn):
            result = await conn.execute(self._sql.direct_upsert, params)
            if self._sql.direct_version is not None:  # no RETURNING: read it back, locked
                result = await conn.execute(self._sql.direct_version, params)
            version = result.scalar_one()
            if not isinstance(version, int) or version > MAX_VERSION:  # SQLite: a REAL
                raise VersionExhausted.at_ceiling(owner, key)  # rolled back
        self.transactions += 1
        self.rows_written += 1
        return CentralRow(owner, key, data, int(version), updated_at, updated_by)

    async def delete_current(self, owner: str, key: str, *, updated_by: str,
                             writer: str | None = None, tries: int = _DELETE_TRIES) -> bool:
        """Delete whatever value `key` of `owner` has; False when it has none.

        A compare-and-delete (`write_if_version`) on the version just read, repeated while other
        writers move the key on: the delete that succeeds removed a committed value (it takes
        effect at its statement), and False comes only from a read, or a conflict, that found
        no value. Two deletes of one value: one answers True, the other False. After `tries`
        rounds lost to other writers, `WriteRejected` and nothing deleted.
        """
        for _ in range(tries):
            row = (await self.read_many([(owner, key)])).get((owner, key))
            if row is None or row.data is None:
                return False
            if row.version >= MAX_VERSION:  # its tombstone would need the next version
                raise VersionExhausted.at_ceiling(owner, key)
            try:
                await self.write_if_version(owner, key, None, row.version, updated_by=updated_by,
                                            writer=writer)
            except VersionConflict as exc:
                if exc.actual == 0:  # deleted by another writer meanwhile
                    return False
                continue
            return True
        raise WriteRejected(
            f"owner {owner!r} key {key!r} changed {tries} times while being deleted; nothing "
            "was deleted: try again"
        )

    async def write_if_version(
        self, owner: str, key: str, data: str | bytes | None, expected_version: int, *,
        updated_by: str, updated_at: float | None = None, writer: str | None = None,
    ) -> CentralRow:
        """One conditional write in its own transaction: a compare-and-set on the central DB.

        The write goes in only if the central record is at `expected_version` (0: the key has
        no value, never written or deleted); otherwise `VersionConflict` says which version it
        is at, and nothing is written. `data` None deletes (leaves a tombstone). The check and
        the write are one statement, so no other writer can slip in between; a triggerer
        whose cache still holds the old version finds out at its next flush (the fence), as
        with any other writer.
        """
        expected_version = check_expected_version(expected_version)
        when = datetime.fromtimestamp(
            updated_at if updated_at is not None else datetime.now(timezone.utc).timestamp(),
            tz=timezone.utc,
        )
        value = data.decode() if isinstance(data, bytes) else data  # JSON text, None: delete
        await self._ready()
        # _at_ceiling: the key at the ceiling (expected there, or a tombstone there with 0)
        async with (self._at_ceiling(owner, key), self._errors("write"),
                    self.engine.begin() as conn):
            version = await compare_and_set(conn, self._sql, self.dialect, owner, key, value,
                                            expected_version, when, updated_by, writer)
        self.transactions += 1
        self.rows_written += 1
        return CentralRow(owner, key, value, version, when.timestamp(), updated_by)

    async def write_batch(
        self, rows: Sequence[DirtyRow], policies: PolicyMap, *, writer: str | None = None
    ) -> list[FlushOutcome]:
        """Write `rows` in one transaction, fenced; resolve conflicts by each owner's policy.

        `writer`: the id of the local cache file the rows come from (`LocalCache.writer_id`),
        recorded with each row; None for rows with no file behind them (no replay is then
        recognised).
        """
        if not rows:
            return []
        # taken before any await: a status noted just before this call is this batch's
        status, self._fleet_next = self._fleet_next, None
        await self._ready()
        history = self.history.enabled
        marks = self._history_trim.marks_due({r.owner for r in rows}) if history else None
        async with self._errors("flush"), self.engine.begin() as conn:
            outcomes = await self._write_state(conn, rows, policies, writer, status, history,
                                               marks)
        self._count_flush(outcomes)
        if history:
            await self._trim_history(self._marked(outcomes, marks))
        return outcomes

    async def write_with_events(
        self, rows: Sequence[DirtyRow], events: Sequence[EventRow], policies: PolicyMap, *,
        writer: str | None = None, triggerer: str | None = None,
    ) -> tuple[list[FlushOutcome], list[EventStatus]]:
        """`write_batch` of `rows` and `events` in ONE transaction (`EventSink`): the fenced
        state rows, then each event's claim fence, de-duplication row and, for an asset's
        owner on Airflow's metadata DB, its asset events (`localstate._sync.central.fenced_write`).
        Airflow's listeners hear of the asset events once the transaction has committed.
        `triggerer`: the flushing writer's triggerer id, recorded with the events' history."""
        status, self._fleet_next = self._fleet_next, None
        await self._ready()
        history = self.history.enabled
        marks = self._history_trim.marks_due({r.owner for r in rows}) if history else None
        async with self._errors("flush"), self.engine.begin() as conn:
            outcomes = await self._write_state(conn, rows, policies, writer, status, history,
                                               marks)
            statuses, callbacks = await write_events(
                conn, events, writer, self.asset_events, self._now_column(), history,
                triggerer)
        self._count_flush(outcomes)
        self.events_committed += statuses.count("committed")
        if callbacks:  # Airflow's listeners, of the asset events just committed
            run_callbacks(callbacks)
        if history:
            await self._trim_history([*self._marked(outcomes, marks), *(e.owner for e in events)])
        return outcomes, statuses

    async def _write_state(
        self, conn: AsyncConnection, rows: Sequence[DirtyRow], policies: PolicyMap,
        writer: str | None, status: FleetStatus | None, history: bool,
        marks: set[str] | None,
    ) -> list[FlushOutcome]:
        """A flush's state rows in its transaction: fenced, their watermarks in the history,
        and Airflow's asset_state_store following them (the part `write_batch` and
        `write_with_events` share)."""
        outcomes = await write_fenced(conn, self._sql, self.dialect, rows, policies, writer,
                                      status, history, marks)
        if history and self.dialect != "postgresql":  # there: in the upsert itself
            await record_watermarks(conn, outcomes, writer, self._column_time, marks)
        if self.asset_mirror is not None and outcomes:  # same transaction
            await self.asset_mirror.apply(conn, outcomes, self._sql.timestamp)
        return outcomes

    def _count_flush(self, outcomes: list[FlushOutcome]) -> None:
        self.transactions += 1
        self.rows_written += sum(1 for o in outcomes if o.resolution == "written")

    # -- the owners' history (`localstate._sync.central.history`) ---------------------------------

    async def record_rejected(self, events: Sequence[EventRow], writer: str | None,
                              triggerer: str | None = None) -> None:
        """Record `events` as ``rejected`` (refused as malformed by the central side, so no
        flush transaction carries them), in a transaction of their own, flushed by
        `triggerer`; nothing when history is off."""
        if not events or not self.history.enabled:
            return
        await self._ready()
        rows = event_rows(events, ["rejected"] * len(events), None, writer, self._now_column(),
                          triggerer)
        async with self._errors("record rejected events"), self.engine.begin() as conn:
            await record_events(conn, rows)
        self.transactions += 1

    async def record_release(self, owner: str, *, epoch: int, claimant: str,
                             writer: str | None = None) -> bool:
        """Record in `owner`'s history that `claimant` (from the local cache file `writer`)
        released it at `epoch`, in a transaction of its own (`ReleaseRecording`); whether it
        was (False: history is off). The claim stands: a release only says the owner left
        that store."""
        if not self.history.enabled:
            return False
        await self._ready()
        async with self._errors("record a release"), self.engine.begin() as conn:
            await record_release(conn, owner, epoch, claimant, writer, self._now_column())
        self.transactions += 1
        await self._trim_history([owner])
        return True

    async def read_history(self, owner: str, *, before: int | None = None, limit: int = 100,
                           kinds: Sequence[str] = ()) -> list[HistoryRow]:
        """`owner`'s history, newest first: `limit` rows older than row id `before`."""
        await self._ready()
        async with self._errors("read history"), read_connection(self.engine) as conn:
            return rows_of(await conn.execute(
                history_query(owner, before=before, limit=limit, kinds=kinds)))

    async def history_summary(self, owner: str) -> OwnerSummary:
        """`owner`'s counts at a glance (`localstate._sync.central.history.OwnerSummary`)."""
        await self._ready()
        now = datetime.now(timezone.utc).timestamp()
        async with self._errors("read history"), read_connection(self.engine) as conn:
            return await summary(conn, owner, now, self._column_time)

    async def trim_history(self, *, max_rows: int | None = None,
                           max_age: float | None = None) -> int:
        """Trim every owner's history to `max_rows` rows and `max_age` seconds (default: this
        store's policy), in one transaction; the rows deleted (``localstate db prune``)."""
        await self._ready()
        policy = self.history
        rows = policy.max_rows if max_rows is None else max_rows
        age = policy.max_age if max_age is None else max_age
        cutoff = column_time(self.dialect, datetime.now(timezone.utc).timestamp() - age)
        async with self._errors("trim history"), self.engine.begin() as conn:
            deleted = await trim(conn, None, rows, cutoff)
        self.transactions += 1
        return deleted

    def _marked(self, outcomes: Sequence[FlushOutcome], marks: set[str] | None) -> list[str]:
        """The owners of `outcomes` whose watermark rows a committed flush recorded (`marks`:
        the owners due, None: all), noted as recorded; an owner per row."""
        owners = [o.row.owner for o in outcomes if o.resolution == "written"
                  and (marks is None or o.row.owner in marks)]
        self._history_trim.marked(owners)
        return owners

    async def _trim_history(self, owners: Iterable[str]) -> None:
        """Count the rows just added to `owners`' history; trim those due (`HistoryTrim`), in
        a transaction of its own. A failed trim is logged and left to the next one: the
        write it follows has committed."""
        trimmer = self._history_trim
        trimmer.added(owners)
        due, aged = trimmer.due()
        if not due and not aged:
            return
        policy = trimmer.policy
        cutoff = column_time(self.dialect, datetime.now(timezone.utc).timestamp()
                             - policy.max_age) if aged else None
        try:
            async with self._errors("trim history"), self.engine.begin() as conn:
                deleted = await trim(conn, due, policy.max_rows, cutoff)
        except LocalStateError as exc:
            log.warning("%s; the history is trimmed again after the next writes", exc)
            return
        self.transactions += 1
        trimmer.done(due, aged, deleted)


    async def asset_events_ready(self) -> bool:
        """Whether this DB (Airflow's metadata DB, Airflow importable here) takes asset events
        (`localstate._sync.central.asset_events`); checked once."""
        await self._ready()
        async with self._errors("read"):
            return await self.asset_events.ready(self.engine)

    def _column_time(self, ts: float) -> datetime:
        """POSIX time `ts` as a timestamp column takes it (`column_time`)."""
        return column_time(self.dialect, ts)

    def _now_column(self) -> datetime:
        """Now, as a timestamp column takes it: UTC, naive where the dialect keeps no offset."""
        moment = datetime.now(timezone.utc)
        return moment if self.dialect == "postgresql" else moment.replace(tzinfo=None)


class _Opening:
    """`CentralStore.open(...)`: awaitable (the open store) and an async context manager
    (the open store, closed on exit), as ``aiosqlite.connect`` is."""

    def __init__(self, opening: Coroutine[Any, Any, CentralStore]) -> None:
        self._opening = opening
        self._store: CentralStore | None = None

    def __await__(self) -> Generator[Any, None, CentralStore]:
        return self._opening.__await__()

    async def __aenter__(self) -> CentralStore:
        self._store = await self._opening
        return self._store

    async def __aexit__(self, *exc_info: object) -> None:
        if self._store is not None:
            await self._store.close()


def _short(exc: BaseException) -> str:
    orig = getattr(exc, "orig", None)
    text_ = str(orig if orig is not None else exc).strip().splitlines()
    return text_[0] if text_ else type(exc).__name__
