"""The fenced writes of a flush, its state rows and its events: functions that take an open
transaction's connection and the dialect's `BatchSql`; `CentralStore.write_batch` and
`write_with_events` own the engine, the transaction and the counters, and call `write_fenced`
(then `write_events`).

How a flush tells a replay from a stale write. Each row a sync worker writes carries the id of
its local cache file (``writer``, `LocalCache.writer_id`). The same store's writes with the
cache off (direct mode) carry that id too, the file's lock held meanwhile (or, before the
store has a file, an id of its own that the file it creates takes); writes of no store (the
CLI, the REST API) carry none. Invariants:

1. One live process per cache file (its file lock). So a central row carrying my file's id was
   written by me, or by an earlier process on my file, which has ended: my own chain. That
   includes my direct-mode writes, and a store never writes directly while its file still
   holds writes the central DB lacks (`localstate._pending_switch`), so those rows are never
   below a base my file's entries hold.
2. Central versions of a key only grow: every write goes in above the record it replaces.
3. In a running store an entry's base (``synced_version``) never goes backwards and, once a
   flush's outcome for a write is recorded, is at least that write's central version
   (`localstate._cache.entry_table`).
4. Hence a central row of my own chain at a version above my base and no higher than my
   write's is a write of mine whose outcome was never recorded: a commit whose answer was
   lost (a cut connection), or a flush whose mark-clean a crash lost. The fence lets my write
   replace it: no one else's write is lost, and a replay of the same version keeps it.
   Rows of an earlier release. Releases before writer ids (central schema below 3) told their
   own rows by ``updated_by`` (the triggerer id) alone, and their rows carry no writer.
   Migration 7 marks every such row ``writer = LEGACY_WRITER``. The rule: a central row
   marked `LEGACY_WRITER` is the own chain of whichever file flushes a row with the same
   ``updated_by``, the identity the earlier release itself fenced on; so its flush that
   committed before a crash lost its mark-clean is a replay after the upgrade, never a
   conflict nor a reverted write. No process writes such rows any more (the migration
   fences earlier releases out, `localstate._sync.central.schema`), so the mark only ever meets
   writes made before the upgrade. The SQL fence knows only this file's own id: such a
   replay is refused there and settled below, fenced on the central version it replaces.
5. Any other central version than my base is a conflict, settled by the owner's policy. That
   includes a row of another file under the same ``updated_by`` (a restart with a new cache
   file, two hosts given one triggerer id) and a write based on an unknown version
   (`UNKNOWN_BASE`: the central record could not be read when it was made), except that a
   row of my own chain is then simply replaced (I was the last writer).
6. My own chain *further on* than the write (central's version above the write's: a flush
   took versions whose local commit a crash then lost) keeps the newer of the two by
   ``updated_at``, with no conflict.

`own_chain_step` decides rules 1, 4 and 6 (the own chain: on its base, a replay, further on)
for a row and the central row it meets, in one place, whichever step of the flush meets it.

The common path (every row on its base) stays one statement; the writer travels once per
statement.

Claims (fencing tokens). `claim` bumps an owner's epoch; each flushed row carries the epoch its
writer holds (`DirtyRow.epoch`, 0: none). The upsert refuses a row whose epoch is below its
owner's, before any version fence or policy (`localstate._sync.central.dialects`), so within one
claim the rules above apply unchanged and across claims a lower epoch never goes in. A refused row
comes back "adopted" with ``lost_to`` set (`_claim_losses`); telling it apart costs a query on
the refusal path only.

Events. The events of a flush (`StateStore.emit`) are written inside the flush's transaction,
after the fenced state rows (`write_events`).

For each event, in emit order:

1. **Claim fence.** An event whose claim epoch is below its owner's central epoch (and whose
   cache file is not the claim's own) is "refused": a zombie's event, nothing is written. The
   owner's claim rows are read with a shared lock, so a claim committing meanwhile waits for
   this flush: the new holder then reads the watermark committed with these events.
2. **De-duplication.** An event whose ``(owner, key)`` the event table holds (or that came
   earlier in this batch) is a "duplicate": nothing is written. A replayed batch is a no-op.
3. Otherwise it is "committed": its de-duplication row, and for an asset's owner its asset
   events (`localstate._sync.central.asset_events`), in emit order.

Two flushes of the same new key at once (a zombie racing its successor) meet on the event
table's primary key: one commits, the other fails whole and is retried, and finds a duplicate.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any, Final, NamedTuple

from sqlalchemy import ARRAY, any_, bindparam, insert, select
from sqlalchemy.ext.asyncio import AsyncConnection

from localstate._cache.entry import StateKey
from localstate._core.conflicts import ConflictPolicy, PolicyMap
from localstate._core.model import asset_name
from localstate._core.rows import (
    CentralRow,
    DirtyRow,
    EventRow,
    EventStatus,
    FlushOutcome,
    central_row,
)
from localstate._sync.central.asset_events import AssetEvents
from localstate._sync.central.dialects import (
    BatchSql,
    UpsertRow,
    fleet_params,
    fleet_statement,
    upsert_with_fleet,
    upsert_with_history,
)
from localstate._sync.central.fleet import FleetStatus
from localstate._sync.central.history import event_rows, record_events
from localstate._sync.central.schema import LEGACY_WRITER, event, owner_claim

__all__ = ["OwnChainStep", "next_version", "own_chain_step", "select_rows", "write_events",
           "write_fenced"]


async def write_fenced(
    conn: AsyncConnection, sql: BatchSql, dialect: str, rows: Sequence[DirtyRow],
    policies: PolicyMap, writer: str | None, status: FleetStatus | None = None,
    history: bool = False, history_owners: set[str] | None = None,
) -> list[FlushOutcome]:
    """Write `rows` inside `conn`'s transaction, fenced on their bases, conflicts settled by
    each owner's policy and rows refused by a claim reported as claim losses; and `status`'s
    fleet row, when given. `dialect`: the engine's dialect name (`fleet` keys on it).
    `history`: on PostgreSQL, the rows written get their history rows in the upsert itself
    (`upsert_with_history`; elsewhere the caller records them), those of `history_owners`
    only when given."""
    # One lock order for every writer. Rows come in each worker's own order (the age of its
    # dirty keys), and two triggerers flushing the same keys in different orders lock them in
    # different orders: MariaDB's locked read and upsert take row locks in the order of the
    # JSON array (a nested loop driven by JSON_TABLE), and a flush of a failed-over owner met
    # its zombie's flush head-on (deadlock 1213, seen in the failover race tests). Sorted by
    # key, every flush takes its locks in the same order, so two flushes queue instead of
    # deadlocking. PostgreSQL sorts in the locked read itself (`BatchSql.select_keys_locked`).
    # SQLite's write lock serializes whole flushes: no order to keep, and no sort to pay for
    # (3 % of a 10,000-row flush there, benches/bench_flush.py). On PostgreSQL the sorted
    # batch is also the faster one: 83-84 ms against 95 ms for 10,000 rows, in index order.
    in_order = sorted(rows, key=_row_key) if sql.row_locks else rows
    marks = _Marks(history, history_owners)
    outcomes = await _write_batch(conn, sql, dialect, in_order, policies, writer, status,
                                  marks)
    outcomes = await _claim_losses(conn, sql, outcomes, writer)
    if in_order is rows:
        return outcomes
    # answered in the caller's order (`Sink.write_batch`)
    by_key = {_row_key(o.row): o for o in outcomes}
    if len(by_key) != len(outcomes):  # a key twice in one batch: no order to restore by key
        return outcomes
    return [by_key[_row_key(r)] for r in rows]


#: a row's (owner, key)
_row_key: Callable[[DirtyRow], StateKey] = operator.attrgetter("owner", "key")


async def select_rows(
    conn: AsyncConnection, sql: BatchSql, keys: Sequence[StateKey], *, lock: bool
) -> dict[StateKey, CentralRow]:
    """The central records of `keys` that exist; `lock`: locked until the transaction ends."""
    stmt = sql.select_keys_locked if lock else sql.select_keys
    result = await conn.execute(stmt, sql.key_params(keys))
    rows = (central_row(r) for r in result)
    return {(r.owner, r.key): r for r in rows}


class OwnChainStep(NamedTuple):
    """What a flushed row does to a central row of its writer's own chain."""

    #: keep the central row (a later write of the own chain): the row is adopted, no conflict
    keep_central: bool
    #: otherwise the central version the write is fenced on (it may replace only that one)
    fence: int


def own_chain_step(central: CentralRow, row: DirtyRow, writer: str | None) -> OwnChainStep | None:
    """How `row`, flushed by the cache file `writer`, meets `central`, the key's central row,
    when that row is of the file's own chain (module docstring, rules 1, 4 and 6): None when it
    is not, and the owner's conflict policy decides.

    The own chain is a row this file's sync worker wrote, or an earlier release's row under the
    same ``updated_by``. On the write's base, the write lands (the policy is not asked: it is
    based on the writer's own current record). Above the base up to the write's version, it is
    a replay of a write whose outcome was never recorded: fenced on the base for this file's
    own rows (the SQL fence accepts those, and the version stays), on the central version for
    an earlier release's (the SQL fence knows only this file's id). Above the write's version,
    it is the chain further on: the newer of the two by ``updated_at`` stays, no conflict.
    Below the base (which rule 1 rules out) it is left to the policy.
    """
    if writer is None or not (central.writer == writer or (
            central.writer == LEGACY_WRITER and central.updated_by == row.updated_by)):
        return None
    if central.version < row.base_version:
        return None
    if central.version == row.base_version:
        return OwnChainStep(False, row.base_version)
    if central.version <= row.version:
        return OwnChainStep(False, row.base_version if central.writer == writer
                            else central.version)
    if row.updated_at <= central.updated_at:
        return OwnChainStep(True, central.version)
    return OwnChainStep(False, central.version)


async def _write_batch(
    conn: AsyncConnection, sql: BatchSql, dialect: str, rows: Sequence[DirtyRow],
    policies: PolicyMap, writer: str | None, status: FleetStatus | None, history: _Marks,
) -> list[FlushOutcome]:
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
        current = await select_rows(conn, sql, [(r.owner, r.key) for r in max_rows], lock=True)
        to_write = []
        for r in rows:
            policy = policy_of(r.owner)
            c = current.get((r.owner, r.key)) if policy.is_max else None
            if c is None:
                to_write.append((r, r.base_version, False))
                continue
            step = own_chain_step(c, r, writer)
            if step is not None:  # the own chain: never a conflict (max included)
                if step.keep_central:
                    outcomes.append(FlushOutcome(r, "adopted", c, False, policy.spec))
                else:
                    to_write.append((r, step.fence, False))
                continue
            stale = c.version != r.base_version
            if policy.exceeds(r.owner, r.data, c.data, strictly=stale):
                to_write.append((r, c.version, stale))
                if stale:
                    replaced[(r.owner, r.key)] = c
            else:
                outcomes.append(FlushOutcome(r, "adopted", c, True, policy.spec))
    # 2. The fenced upsert; what it does not return was refused by the fence.
    written = await _upsert(conn, sql, dialect, to_write, writer, status, history)
    refused: list[DirtyRow] = []
    if written is None and not replaced:
        # the common case, every row through the fence: one outcome per row, built flat
        outcomes.extend([
            FlushOutcome(r, "written", CentralRow(
                r.owner, r.key, r.data, next_version(r.version, base), r.updated_at,
                r.updated_by,
            ), conflict, policy_of(r.owner).spec)
            for r, base, conflict in to_write
        ])
        return outcomes
    for r, base, conflict in to_write:
        version = next_version(r.version, base) if written is None else written.get(
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
    current = await select_rows(conn, sql, [(r.owner, r.key) for r in refused], lock=True)
    retry: list[tuple[DirtyRow, int, bool]] = []
    for r in refused:
        policy = policy_of(r.owner)
        c = current.get((r.owner, r.key))
        if c is None:  # the row vanished meanwhile: nothing to conflict with
            retry.append((r, r.base_version, True))
        elif (step := own_chain_step(c, r, writer)) is not None:
            # the own chain (module docstring, 4 and 6): a replay of an earlier release's
            # row, or the chain further on, whose local commit a crash lost (flushes do not
            # wait for the local commit): no conflict
            if step.keep_central:
                outcomes.append(FlushOutcome(r, "adopted", c, False, policy.spec))
            else:
                retry.append((r, step.fence, False))
        elif policy.local_wins(r, c):
            retry.append((r, c.version, True))
            replaced[(r.owner, r.key)] = c
        else:
            outcomes.append(FlushOutcome(r, "adopted", c, True, policy.spec))
    written = await _upsert(conn, sql, dialect, retry, writer, None, history)
    for r, base, conflict in retry:
        version = next_version(r.version, base) if written is None else written.get(
            (r.owner, r.key))
        spec = policy_of(r.owner).spec
        if version is None:
            outcomes.append(FlushOutcome(r, "retry", None, True, spec))
        else:
            central = CentralRow(r.owner, r.key, r.data, version, r.updated_at, r.updated_by)
            outcomes.append(FlushOutcome(r, "written", central, conflict, spec,
                                         replaced.get((r.owner, r.key))))
    return outcomes


class _Marks(NamedTuple):
    """Which rows a flush records in the history: none (`on` False), every written row
    (`owners` None), or those of `owners`."""

    on: bool
    owners: set[str] | None

    def statement(self, dialect: str, rows: Sequence[tuple[DirtyRow, int, bool]],
                  fleet: bool) -> tuple[Any, dict[str, Any]]:
        """The upsert that records the rows' history, and its extra parameters; (None, {})
        when there is none to record (or the dialect records after the upsert)."""
        if not self.on or not rows or dialect != "postgresql":
            return None, {}
        owners = self.owners
        if owners is not None:
            named = {r.owner for r, _b, _c in rows} & owners
            if not named:
                return None, {}
            if len(named) < len({r.owner for r, _b, _c in rows}):
                return (upsert_with_history(dialect, fleet, True),
                        {"history_owners": sorted(named)})
        return upsert_with_history(dialect, fleet), {}


#: no history rows
_NO_MARKS: Final = _Marks(False, None)


async def _upsert(
    conn: AsyncConnection, sql: BatchSql, dialect: str,
    rows: Sequence[tuple[DirtyRow, int, bool]], writer: str | None,
    status: FleetStatus | None = None, history: _Marks = _NO_MARKS,
) -> dict[StateKey, int] | None:
    """Write `rows` fenced on their bases (and `status`'s fleet row; with `history`, on
    PostgreSQL, their history rows). None: every row went in, each at
    `next_version(row.version, base)`; else the versions of the rows that went in."""
    statement = sql.upsert
    with_history, history_params = history.statement(dialect, rows, status is not None)
    fleet_extra: dict[str, Any] = dict(history_params)
    if status is not None:
        fleet_extra |= fleet_params(dialect, status,
                                    sql.timestamp if dialect == "sqlite" else None)
        combined = None if not rows else (
            with_history if with_history is not None else upsert_with_fleet(dialect, sql.upsert))
        if combined is None:
            await conn.execute(fleet_statement(dialect), fleet_extra)
            fleet_extra = dict(history_params)
        else:
            statement = combined
    elif with_history is not None:
        statement = with_history
    if not rows:
        return {}
    # an unknown base (UNKNOWN_BASE, below 0) travels as 0: "replaced nothing", which the
    # fence never matches (central versions start at 1) and an insert records as it is
    packed: list[UpsertRow] = [
        (r.owner, r.key, r.data, next_version(r.version, base), base if base > 0 else 0,
         r.updated_at, r.updated_by, r.epoch)
        for r, base, _conflict in rows
    ]
    result = await conn.execute(
        statement, sql.upsert_params(packed, writer) | fleet_extra)
    if sql.upsert_complete(result.rowcount, packed):
        return None  # the fence let every row through: the common case
    intended = {(p[0], p[1]): p[3] for p in packed}
    # Some rows were refused. Which ones: in this transaction the rows it wrote are locked
    # and hold exactly what it wrote (the fence admits nothing else with that version and
    # writer), so a row was written iff the central record is the intended one.
    current = await select_rows(conn, sql, list(intended), lock=False)
    by = {(p[0], p[1]): p[6] for p in packed}
    return {
        k: v for k, v in intended.items()
        if (c := current.get(k)) is not None and c.version == v and c.updated_by == by[k]
        and c.writer == writer
    }


async def _claim_losses(conn: AsyncConnection, sql: BatchSql, outcomes: list[FlushOutcome],
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
    current = await select_rows(conn, sql, list(lost), lock=False)
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


def next_version(version: int, base: int) -> int:
    """The central version of a write of local `version` replacing central version `base`:
    above both chains."""
    return version if version > base else base + 1


#: keys per IN list when looking up known events
_EVENT_CHUNK: Final = 500


async def known_events(conn: AsyncConnection, events: Sequence[EventRow]
                       ) -> set[tuple[str, str]]:
    """The ``(owner, key)`` of `events` the central DB holds already: per owner, one
    ``owner = ? AND key IN (...)`` per chunk of keys (on PostgreSQL ``key = ANY(?)``, one
    array), which every backend answers from the primary key's index. (A row-value
    ``(owner, key) IN ((...), ...)`` list of 500 pairs, prepared again and again by asyncpg,
    got a generic plan on PostgreSQL that filtered every row of the table against every pair:
    300 ms a look-up at 20,000 events, a cost growing with the table and the batch, most of
    a large flush's time.)"""
    by_owner: dict[str, list[str]] = {}
    for e in events:
        by_owner.setdefault(e.owner, []).append(e.key)
    known: set[tuple[str, str]] = set()
    t = event.c
    one_array = conn.dialect.name == "postgresql"
    for owner, keys in by_owner.items():
        unique = list(dict.fromkeys(keys))
        if one_array:  # one statement whatever the batch: its prepared plan stays an index scan
            known.update((owner, k) for (k,) in await conn.execute(
                select(t.key).where(t.owner == owner, t.key == any_(
                    bindparam("keys", unique, type_=ARRAY(t.key.type))))))
            continue
        for start in range(0, len(unique), _EVENT_CHUNK):
            chunk = unique[start:start + _EVENT_CHUNK]
            known.update((owner, k) for (k,) in await conn.execute(
                select(t.key).where(t.owner == owner, t.key.in_(chunk))))
    return known


async def write_events(
    conn: AsyncConnection, events: Sequence[EventRow], writer: str | None,
    assets: AssetEvents, now: Any, history: bool = False, triggerer: str | None = None,
) -> tuple[list[EventStatus], list[Callable[[], Any]]]:
    """Write `events` in `conn`'s transaction (see "Events" above); one status per event,
    and the Airflow listener callbacks to run once the transaction committed. `now`: the
    commit time (an aware datetime). `history`: with each event's history row
    (`localstate._sync.central.history`), one statement for them all, naming `triggerer`
    (the flushing writer's triggerer id)."""
    if not events:
        return [], []
    statuses, callbacks, asset_ids = await _write_events(conn, events, writer, assets, now)
    if history:
        await record_events(conn, event_rows(events, statuses, asset_ids, writer, now,
                                                 triggerer))
    return statuses, callbacks


async def _write_events(
    conn: AsyncConnection, events: Sequence[EventRow], writer: str | None,
    assets: AssetEvents, now: Any,
) -> tuple[list[EventStatus], list[Callable[[], Any]], list[int | None]]:
    owners = {e.owner for e in events}
    c = owner_claim.c
    claims = {o: (int(ep), w) for o, ep, w in await conn.execute(
        select(c.owner, c.epoch, c.writer).where(c.owner.in_(owners))
        .with_for_update(read=True))}
    statuses: list[EventStatus] = []
    candidates: list[EventRow] = []
    for e in events:
        claim = claims.get(e.owner)
        if claim is not None and e.epoch < claim[0] and (writer is None or claim[1] != writer):
            statuses.append("refused")
        else:
            statuses.append("committed")
            candidates.append(e)
    known = await known_events(conn, candidates)
    new: list[EventRow] = []
    for i, e in enumerate(events):
        if statuses[i] != "committed":
            continue
        k = (e.owner, e.key)
        if k in known:
            statuses[i] = "duplicate"
        else:
            known.add(k)
            new.append(e)
    asset_ids: list[int | None] = [None] * len(events)
    if not new:
        return statuses, [], asset_ids
    made: list[int | None] = []
    if any(asset_name(e.owner) is not None for e in new):  # an asset watcher's events
        counts, made, callbacks = await assets.apply(conn, new)
    else:
        counts, callbacks = [0] * len(new), []
    await conn.execute(insert(event), [
        {"owner": e.owner, "key": e.key, "seq": e.seq, "writer": writer, "epoch": e.epoch,
         "asset_events": n, "committed_at": now}
        for e, n in zip(new, counts, strict=True)])
    if made:  # each committed event's asset event, in the order of `events`
        by_event = iter(made)
        asset_ids = [next(by_event) if s == "committed" else None for s in statuses]
    return statuses, callbacks, asset_ids
