"""`CentralStore`: the central metadata DB through SQLAlchemy 2 async (PostgreSQL, MySQL or
SQLite).

One code path for both dialects; the SQL that differs lives in `localstate.sync.dialects`.
Every driver error is wrapped: an unreachable or failing database is `CentralUnavailable`,
anything else `CentralError`, with the driver's exception as the cause.

How a flush tells a replay from a stale write. Each row a sync worker writes carries the id of
its local cache file (``writer``, `LocalCache.writer_id`); every other write (direct mode, a
compare-and-set on the central DB) clears it. Invariants:

1. One live process per cache file (its file lock). So a central row carrying my file's id was
   written by me, or by an earlier process on my file, which has ended: my own chain.
2. Central versions of a key only grow: every write goes in above the record it replaces.
3. In a running store an entry's base (``synced_version``) never goes backwards and, once a
   flush's outcome for a write is recorded, is at least that write's central version
   (`localstate.entry_table`).
4. Hence a central row of my own chain at a version above my base and no higher than my
   write's is a write of mine whose outcome was never recorded: a commit whose answer was
   lost (a cut connection), or a flush whose mark-clean a crash lost. The fence lets my write
   replace it: no one else's write is lost, and a replay of the same version keeps it.
5. Any other central version than my base is a conflict, settled by the owner's policy. That
   includes a row of another file under the same ``updated_by`` (a restart with a new cache
   file, two hosts given one triggerer id) and a write based on an unknown version
   (`UNKNOWN_BASE`: the central record could not be read when it was made), except that a
   row of my own chain is then simply replaced (I was the last writer).
6. My own chain *further on* than the write (central's version at or above the write's: a
   flush took versions whose local commit a crash then lost) keeps the newer of the two by
   ``updated_at``, with no conflict (step 3 of `_write_batch`).

The common path (every row on its base) stays one statement; the writer travels once per
statement.

Claims (fencing tokens). `claim` bumps an owner's epoch; each flushed row carries the epoch its
writer holds (`DirtyRow.epoch`, 0: none). The upsert refuses a row whose epoch is below its
owner's, before any version fence or policy (`localstate.sync.dialects`), so within one claim
the rules above apply unchanged and across claims a lower epoch never goes in. A refused row
comes back "adopted" with ``lost_to`` set (`_claim_losses`); telling it apart costs a query on
the refusal path only.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Coroutine, Generator, Sequence
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import Executable, select, tuple_, update
from sqlalchemy.dialects import postgresql as pg_dialect
from sqlalchemy.dialects import sqlite as sqlite_dialect
from sqlalchemy.exc import DBAPIError, SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.sql.elements import ColumnElement

from localstate.entry import StateKey
from localstate.errors import (
    CentralError,
    CentralUnavailable,
    InvalidInput,
    LocalStateError,
    VersionConflict,
    WriteRejected,
)
from localstate.sync.asset_mirror import AssetMirror
from localstate.sync.conflicts import ConflictPolicy, PolicyMap
from localstate.sync.dialects import BatchSql, UpsertRow, batch_sql_for, prefix_upper_bound
from localstate.sync.driver_errors import is_unreachable
from localstate.sync.engine import make_engine, read_connection
from localstate.sync.fleet import (
    FleetRow,
    FleetStatus,
    fleet_params,
    fleet_statement,
    upsert_with_fleet,
)
from localstate.sync.rows import CentralRow, DirtyRow, FlushOutcome
from localstate.sync.schema import fleet, owner_claim, require_current, state_variable, upgrade

__all__ = ["CentralStore", "epoch_seconds"]

log = logging.getLogger(__name__)

_MAX_VERSION = 2**63 - 1  # versions are BIGINT columns
#: compare-and-delete rounds `delete_current` makes before it gives up under contention
_DELETE_TRIES = 100


def epoch_seconds(value: datetime | str) -> float:
    """A timestamp column's value as POSIX seconds."""
    if isinstance(value, str):  # SQLite rows read through text SQL
        value = datetime.fromisoformat(value)
    if value.tzinfo is None:  # SQLite keeps no offset: we always write UTC
        value = value.replace(tzinfo=timezone.utc)
    return value.timestamp()


def _central_row(row: Sequence[Any]) -> CentralRow:
    """A row of (owner, key, value, version, updated_at, updated_by[, writer])."""
    owner, key, value, version, updated_at, updated_by, *writer = row
    return CentralRow(
        owner, key, value, int(version), epoch_seconds(updated_at),
        updated_by, writer[0] if writer else None,
    )


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
        #: the fleet row the next flush records (`note_fleet`), taken by it
        self._fleet_next: FleetStatus | None = None
        #: whether the schema is known to be current; None: checked (and upgraded when this
        #: is True) before the next call, the database having been unreachable at `open`
        self._schema_pending: bool | None = None
        #: set by the opener from the asset_mirror setting (`localstate.sync.asset_mirror`)
        self.asset_mirror: AssetMirror | None = None

    @property
    def _sql(self) -> BatchSql:
        """This dialect's SQL. Looked up each time: to SQLAlchemy MariaDB is the MySQL dialect
        until it has connected, and the two name their collations differently."""
        mariadb = getattr(self.engine.dialect, "is_mariadb", False)
        return batch_sql_for("mariadb" if mariadb else self.dialect)

    @classmethod
    def open(cls, url: str, *, upgrade_schema: bool = True,
             defer_if_unreachable: bool = False) -> _Opening:
        """Open the central DB at `url` and check (or upgrade, `upgrade_schema`) its schema:
        await it, or use it as an async context manager.

        `defer_if_unreachable`: when the database cannot be reached now, open anyway and do
        the schema step before the first call that reaches it (a local-first store starts and
        serves its cache during an outage); its calls raise `CentralUnavailable` meanwhile.
        """
        return _Opening(cls._open(url, upgrade_schema=upgrade_schema,
                                  defer_if_unreachable=defer_if_unreachable))

    @classmethod
    async def _open(cls, url: str, *, upgrade_schema: bool,
                    defer_if_unreachable: bool) -> CentralStore:
        engine = make_engine(url)
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
        except (DBAPIError, OSError, TimeoutError) as exc:
            unreachable = is_unreachable(exc)
            cls = CentralUnavailable if unreachable else CentralError
            raise cls(
                f"central DB {self.url} failed to {doing}: {_short(exc)}"
                + ("; writes stay in the local cache and are retried" if unreachable else "")
            ) from exc
        except SQLAlchemyError as exc:
            raise CentralError(f"central DB {self.url} failed to {doing}: {_short(exc)}") from exc

    # -- reading -------------------------------------------------------------------------

    async def read_many(self, keys: Sequence[StateKey]) -> dict[StateKey, CentralRow]:
        if not keys:
            return {}
        await self._ready()
        async with self._errors("read"), read_connection(self.engine) as conn:
            return await self._select(conn, keys, lock=False)

    async def read_owner(self, owner: str) -> list[CentralRow]:
        await self._ready()
        t = state_variable.c
        query = select(t.owner, t.key, t.value, t.version, t.updated_at, t.updated_by).where(
            t.owner == owner
        )
        async with self._errors("read"), read_connection(self.engine) as conn:
            return [_central_row(r) for r in await conn.execute(query)]

    async def list_rows(
        self, *, owner_prefix: str = "", after: StateKey | None = None, limit: int = 100,
        include_deleted: bool = False,
    ) -> list[CentralRow]:
        """Rows whose owner starts with `owner_prefix` (literally: no character is special),
        in byte-wise (owner, key) order, starting after `after` (cursor pagination).

        Byte-wise whatever the database's collation (see `localstate.sync.dialects`), so a
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
            return [_central_row(r) for r in await conn.execute(query)]

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

    async def _select(
        self, conn: AsyncConnection, keys: Sequence[StateKey], *, lock: bool
    ) -> dict[StateKey, CentralRow]:
        stmt = self._sql.select_keys_locked if lock else self._sql.select_keys
        result = await conn.execute(stmt, self._sql.key_params(keys))
        rows = (_central_row(r) for r in result)
        return {(r.owner, r.key): r for r in rows}

    # -- claims --------------------------------------------------------------------------

    async def claim(self, owner: str, *, claimant: str, writer: str | None = None) -> int:
        """Claim `owner` for `claimant`: bump its epoch (1 for a first claim) in one
        transaction, record who, when and from which local cache file (`writer`), and return
        the new epoch. From its commit on, every flushed write of `owner` carrying a lower
        epoch is refused, except one from that cache file (its own, made before a restart)."""
        await self._ready()
        params = {"owner": owner, "by": claimant, "writer": writer,
                  "at": self._sql.timestamp(datetime.now(timezone.utc).timestamp())}
        async with self._errors("claim"), self.engine.begin() as conn:
            result = await conn.execute(self._sql.claim, params)
            if self._sql.claim_epoch is not None:  # no RETURNING: the row is locked, read it
                result = await conn.execute(self._sql.claim_epoch, params)
            epoch = int(result.scalar_one())
        self.transactions += 1
        return epoch

    async def read_claims(self, owners: Sequence[str]) -> dict[str, tuple[int, str]]:
        """The claimed owners among `owners`: each one's (epoch, claimant)."""
        await self._ready()
        c = owner_claim.c
        async with self._errors("read"), read_connection(self.engine) as conn:
            result = await conn.execute(
                select(c.owner, c.epoch, c.claimant).where(c.owner.in_(set(owners))))
            return {o: (int(e), by) for o, e, by in result}

    async def _claim_losses(self, conn: AsyncConnection, outcomes: list[FlushOutcome],
                            writer: str | None) -> list[FlushOutcome]:
        """`outcomes` with each refused row whose epoch is below its owner's (and whose claim
        is not `writer`'s) turned into a claim loss: "adopted", the current central record,
        `lost_to` the owner's epoch."""
        refused = [o.row for o in outcomes if o.resolution != "written"]
        if not refused:
            return outcomes  # the common path: no query
        c = owner_claim.c
        epochs = {o: int(e) for o, e, w in await conn.execute(
            select(c.owner, c.epoch, c.writer).where(c.owner.in_({r.owner for r in refused})))
            if writer is None or w != writer}
        lost = {(r.owner, r.key) for r in refused if r.epoch < epochs.get(r.owner, 0)}
        if not lost:
            return outcomes
        current = await self._select(conn, list(lost), lock=False)
        out: list[FlushOutcome] = []
        for o in outcomes:
            r = o.row
            k = (r.owner, r.key)
            if k not in lost:
                out.append(o)
                continue
            # no central row: the current owner never wrote it; a tombstone at version 0
            central = current.get(k) or CentralRow(r.owner, r.key, None, 0, r.updated_at,
                                                   r.updated_by)
            out.append(FlushOutcome(r, "adopted", central, False, o.policy,
                                    lost_to=epochs[r.owner]))
        return out

    # -- the fleet table -----------------------------------------------------------------

    def note_fleet(self, status: FleetStatus) -> None:
        """Have the next `write_batch` record `status` in the fleet table, in its own
        transaction (`localstate.sync.fleet`)."""
        self._fleet_next = status

    async def read_fleet(self) -> list[FleetRow]:
        """Every triggerer's row of the fleet table."""
        await self._ready()
        c = fleet.c
        async with self._errors("read"), read_connection(self.engine) as conn:
            result = await conn.execute(select(
                c.triggerer, c.host, c.pid, c.last_flush_at, c.dirty_keys,
                c.oldest_unflushed_at, c.rows_per_s, c.flush_interval))
            return [FleetRow(t, h, int(p), epoch_seconds(at), int(d),
                             None if old is None else epoch_seconds(old), float(rate), float(iv))
                    for t, h, p, at, d, old, rate, iv in result]

    # -- writing -------------------------------------------------------------------------

    async def write_direct(
        self, owner: str, key: str, data: str | None, *, updated_at: float, updated_by: str
    ) -> CentralRow:
        """One unconditional write in its own transaction: the cache-off (direct) path."""
        await self._ready()
        params = {"owner": owner, "key": key, "value": data,
                  "at": self._sql.timestamp(updated_at), "by": updated_by}
        async with self._errors("write"), self.engine.begin() as conn:
            result = await conn.execute(self._sql.direct_upsert, params)
            if self._sql.direct_version is not None:  # no RETURNING: read it back, locked
                result = await conn.execute(self._sql.direct_version, params)
            version = result.scalar_one()
        self.transactions += 1
        self.rows_written += 1
        return CentralRow(owner, key, data, int(version), updated_at, updated_by)

    async def delete_current(self, owner: str, key: str, *, updated_by: str,
                             tries: int = _DELETE_TRIES) -> bool:
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
            try:
                await self.write_if_version(owner, key, None, row.version, updated_by=updated_by)
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
        updated_by: str, updated_at: float | None = None,
    ) -> CentralRow:
        """One conditional write in its own transaction: a compare-and-set on the central DB.

        The write goes in only if the central record is at `expected_version` (0: the key has
        no value, never written or deleted); otherwise `VersionConflict` says which version it
        is at, and nothing is written. `data` None deletes (leaves a tombstone). The check and
        the write are one statement, so no other writer can slip in between; a triggerer
        whose cache still holds the old version finds out at its next flush (the fence), as
        with any other writer.
        """
        if isinstance(expected_version, bool) or not isinstance(expected_version, int) or not (
            0 <= expected_version <= _MAX_VERSION
        ):
            # beyond 64 bits the drivers raise OverflowError (a crash, not an answer)
            raise InvalidInput(f"expected_version must be an int from 0 to {_MAX_VERSION}, "
                               f"not {expected_version!r}")
        t = state_variable.c
        when = datetime.fromtimestamp(
            updated_at if updated_at is not None else datetime.now(timezone.utc).timestamp(),
            tz=timezone.utc,
        )
        value = data.decode() if isinstance(data, bytes) else data  # JSON text, None: delete
        stmt: Any = None  # where the dialect has RETURNING: the write, giving the new version
        if self._sql.direct_version is not None:
            pass  # MySQL: no RETURNING, see _write_if_version_returning_nothing
        elif expected_version == 0:
            insert = (pg_dialect.insert if self.dialect == "postgresql"
                      else sqlite_dialect.insert)(state_variable)
            stmt = insert.values(
                owner=owner, key=key, value=value, version=1, prev_version=0, updated_at=when,
                updated_by=updated_by,
            )
            stmt = stmt.on_conflict_do_update(
                index_elements=[t.owner, t.key],
                set_={"value": stmt.excluded.value, "version": t.version + 1,
                      "prev_version": t.version, "updated_at": stmt.excluded.updated_at,
                      "updated_by": stmt.excluded.updated_by, "writer": None},
                where=t.value.is_(None),
            ).returning(t.version)
        else:
            stmt = (
                update(state_variable)
                .where(t.owner == owner, t.key == key, t.version == expected_version,
                       t.value.is_not(None))
                .values(value=value, version=t.version + 1, prev_version=t.version,
                        updated_at=when, updated_by=updated_by, writer=None)
                .returning(t.version)
            )
        await self._ready()
        async with self._errors("write"), self.engine.begin() as conn:
            version = (
                (await conn.execute(stmt)).scalar_one_or_none() if stmt is not None
                else await self._write_if_version_returning_nothing(
                    conn, owner, key, value, expected_version, when, updated_by))
            if version is None:
                current = (await self._select(conn, [(owner, key)], lock=False)).get(
                    (owner, key))
                actual = 0 if current is None or current.data is None else current.version
                raise VersionConflict(
                    f"owner {owner!r} key {key!r} is at version {actual} in the central DB, "
                    f"not {expected_version}; nothing was written",
                    expected=expected_version, actual=actual,
                )
        self.transactions += 1
        self.rows_written += 1
        return CentralRow(owner, key, value, int(version), when.timestamp(), updated_by)

    async def _write_if_version_returning_nothing(
        self, conn: AsyncConnection, owner: str, key: str, value: str | None,
        expected_version: int, when: datetime, updated_by: str,
    ) -> int | None:
        """`write_if_version`'s write without RETURNING (MySQL): the new version, None if the
        record was not at `expected_version`. The row count tells (CLIENT_FOUND_ROWS off:
        0 when the condition kept the row as it was); the row stays locked by the write, so
        the version read back is the one written."""
        params = {"owner": owner, "key": key, "value": value,
                  "at": self._sql.timestamp(when.timestamp()), "by": updated_by}
        if expected_version == 0:
            assert self._sql.cas_insert is not None
            assert self._sql.direct_version is not None
            if (await conn.execute(self._sql.cas_insert, params)).rowcount == 0:
                return None
            return int((await conn.execute(self._sql.direct_version, params)).scalar_one())
        t = state_variable.c
        result = await conn.execute(
            update(state_variable)
            .where(t.owner == owner, t.key == key, t.version == expected_version,
                   t.value.is_not(None))
            .values(value=value, version=t.version + 1, prev_version=t.version,
                    updated_at=params["at"], updated_by=updated_by, writer=None))
        return expected_version + 1 if result.rowcount == 1 else None

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
        async with self._errors("flush"), self.engine.begin() as conn:
            outcomes = await self._claim_losses(
                conn, await self._write_batch(conn, rows, policies, writer, status), writer)
            if self.asset_mirror is not None:  # Airflow's asset_state_store, same transaction
                await self.asset_mirror.apply(conn, outcomes, self._sql.timestamp)
        self.transactions += 1
        self.rows_written += sum(1 for o in outcomes if o.resolution == "written")
        return outcomes

    async def _write_batch(
        self, conn: AsyncConnection, rows: Sequence[DirtyRow], policies: PolicyMap,
        writer: str | None, status: FleetStatus | None = None,
    ) -> list[FlushOutcome]:
        # this file's own chain: a central row its sync worker wrote (see the module docstring)
        def own(c: CentralRow) -> bool:
            return writer is not None and c.writer == writer

        outcomes: list[FlushOutcome] = []
        uniform = policies.uniform
        # every owner's policy: one for all (no lookup per row), or each looked up once
        policy_of: Callable[[str], ConflictPolicy] = (
            (lambda _owner: uniform) if uniform is not None
            else {r.owner: policies.for_owner(r.owner) for r in rows}.__getitem__
        )
        # 1. Under max, read (and lock) the central values first: a write that would lower
        #    another writer's value is refused even when it is based on its current version.
        to_write: list[tuple[DirtyRow, int, bool]]  # (row, base to fence on, conflict)
        replaced: dict[StateKey, CentralRow] = {}  # what a conflicting write replaces
        max_rows = [] if uniform is not None and not uniform.is_max else [
            r for r in rows if policy_of(r.owner).is_max]
        if not max_rows:
            to_write = [(r, r.base_version, False) for r in rows]
        else:
            current = await self._select(conn, [(r.owner, r.key) for r in max_rows], lock=True)
            to_write = []
            for r in rows:
                policy = policy_of(r.owner)
                c = current.get((r.owner, r.key)) if policy.is_max else None
                if c is None:
                    to_write.append((r, r.base_version, False))
                    continue
                stale = c.version != r.base_version
                # A replay of this writer's own chain (a flush that committed but was never
                # marked clean) is no conflict: the upsert's fence accepts it, and max must
                # too. Without this, max reported a spurious conflict and failed the `central`
                # waiter of a write the DB holds. Fenced on its own base, the replay keeps its
                # version (no bump).
                replay = stale and own(c) and r.base_version < c.version <= r.version
                if replay:
                    stale = False
                elif own(c) and c.version >= r.version:
                    if r.updated_at <= c.updated_at:
                        # this writer's own later write (see step 3): keep it, no conflict
                        outcomes.append(FlushOutcome(r, "adopted", c, False, policy.spec))
                        continue
                    stale = False  # written after a restart (see step 3): based on c
                # the writer's own chain (based on its own current record) always lands
                if (not stale and own(c)) or policy.exceeds(
                        r.owner, r.data, c.data, strictly=stale):
                    to_write.append((r, r.base_version if replay else c.version, stale))
                    if stale:
                        replaced[(r.owner, r.key)] = c
                else:
                    outcomes.append(FlushOutcome(r, "adopted", c, True, policy.spec))
        # 2. The fenced upsert; what it does not return was refused by the fence.
        written = await self._upsert(conn, to_write, writer, status)
        refused: list[DirtyRow] = []
        if written is None and not replaced:
            # the common case, every row through the fence: one outcome per row, built flat
            outcomes.extend([
                FlushOutcome(r, "written", CentralRow(
                    r.owner, r.key, r.data, _next_version(r.version, base), r.updated_at,
                    r.updated_by,
                ), conflict, policy_of(r.owner).spec)
                for r, base, conflict in to_write
            ])
            return outcomes
        for r, base, conflict in to_write:
            version = _next_version(r.version, base) if written is None else written.get(
                (r.owner, r.key))
            if version is None:
                refused.append(r)
                continue
            central = CentralRow(r.owner, r.key, r.data, version, r.updated_at, r.updated_by)
            outcomes.append(FlushOutcome(r, "written", central, conflict,
                                         policy_of(r.owner).spec,
                                         replaced.get((r.owner, r.key))))
        if not refused:
            return outcomes
        # 3. Conflicts: lock the central rows and settle each by its policy.
        current = await self._select(conn, [(r.owner, r.key) for r in refused], lock=True)
        retry: list[tuple[DirtyRow, int, bool]] = []
        for r in refused:
            policy = policy_of(r.owner)
            c = current.get((r.owner, r.key))
            if c is None:  # the row vanished meanwhile: nothing to conflict with
                retry.append((r, r.base_version, True))
            elif own(c) and c.version >= r.version:
                # This file's own chain, further on: a flush took versions whose local commit
                # a crash then lost (flushes do not wait for the local commit). Nobody else
                # wrote, so no conflict; the newer of the two writes stays. Central's, when
                # this row is older (left dirty in the file from before the crash); this row,
                # when it was written after the restart (acknowledged, and it used to be
                # replaced by the lost chain until the versions caught up), fenced on c.
                if r.updated_at <= c.updated_at:
                    outcomes.append(FlushOutcome(r, "adopted", c, False, policy.spec))
                else:
                    retry.append((r, c.version, False))
            elif policy.local_wins(r, c):
                retry.append((r, c.version, True))
                replaced[(r.owner, r.key)] = c
            else:
                outcomes.append(FlushOutcome(r, "adopted", c, True, policy.spec))
        written = await self._upsert(conn, retry, writer)
        for r, base, conflict in retry:
            version = _next_version(r.version, base) if written is None else written.get(
                (r.owner, r.key))
            spec = policy_of(r.owner).spec
            if version is None:
                outcomes.append(FlushOutcome(r, "retry", None, True, spec))
            else:
                central = CentralRow(r.owner, r.key, r.data, version, r.updated_at, r.updated_by)
                outcomes.append(FlushOutcome(r, "written", central, conflict, spec,
                                             replaced.get((r.owner, r.key))))
        return outcomes

    async def _upsert(
        self, conn: AsyncConnection, rows: Sequence[tuple[DirtyRow, int, bool]],
        writer: str | None, status: FleetStatus | None = None,
    ) -> dict[StateKey, int] | None:
        """Write `rows` fenced on their bases (and `status`'s fleet row). None: every row went
        in, each at `_next_version(row.version, base)`; else the versions of the rows that
        went in."""
        statement = self._sql.upsert
        fleet_extra: dict[str, Any] = {}
        if status is not None:
            sql = self._sql
            fleet_extra = fleet_params(self.dialect, status,
                                       sql.timestamp if self.dialect == "sqlite" else None)
            combined = upsert_with_fleet(self.dialect, sql.upsert) if rows else None
            if combined is None:
                await conn.execute(fleet_statement(self.dialect), fleet_extra)
                fleet_extra = {}
            else:
                statement = combined
        if not rows:
            return {}
        # an unknown base (UNKNOWN_BASE, below 0) travels as 0: "replaced nothing", which the
        # fence never matches (central versions start at 1) and an insert records as it is
        packed: list[UpsertRow] = [
            (r.owner, r.key, r.data, _next_version(r.version, base), base if base > 0 else 0,
             r.updated_at, r.updated_by, r.epoch)
            for r, base, _conflict in rows
        ]
        result = await conn.execute(
            statement, self._sql.upsert_params(packed, writer) | fleet_extra)
        if self._sql.upsert_complete(result.rowcount, packed):
            return None  # the fence let every row through: the common case
        intended = {(p[0], p[1]): p[3] for p in packed}
        # Some rows were refused. Which ones: in this transaction the rows it wrote are locked
        # and hold exactly what it wrote (the fence admits nothing else with that version and
        # writer), so a row was written iff the central record is the intended one.
        current = await self._select(conn, list(intended), lock=False)
        by = {(p[0], p[1]): p[6] for p in packed}
        return {
            k: v for k, v in intended.items()
            if (c := current.get(k)) is not None and c.version == v and c.updated_by == by[k]
            and c.writer == writer
        }


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


def _next_version(version: int, base: int) -> int:
    """The central version of a write of local `version` replacing central version `base`:
    above both chains."""
    return version if version > base else base + 1


def _short(exc: BaseException) -> str:
    orig = getattr(exc, "orig", None)
    text_ = str(orig if orig is not None else exc).strip().splitlines()
    return text_[0] if text_ else type(exc).__name__
