"""`CentralStore` against both backends: schema migrations, the fenced batch upsert, reads.

Every test takes `central_url`, parametrized over SQLite and the real PostgreSQL server the
suite starts, so each runs on both without being written twice. Statement and transaction counts
come from SQLAlchemy's own cursor and commit events, not from the store's counters.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sqlite3
import time
from collections.abc import AsyncIterator
from datetime import datetime, timezone
from typing import Any

import orjson
import pytest
import pytest_asyncio
from conftest import collations
from sqlalchemy import event, func, inspect, select, text
from sqlalchemy.ext.asyncio import AsyncEngine
from statement_log import StatementLog, rows_carried

from localstate import SchemaError, StateStore
from localstate._core.conflicts import PolicyMap
from localstate._core.rows import CentralRow, DirtyRow, FlushOutcome
from localstate._sync.central.central_store import CentralStore
from localstate._sync.central.dialects import prefix_upper_bound
from localstate._sync.central.engine import make_engine
from localstate._sync.central.schema import (
    FILLFACTOR,
    LATEST_VERSION,
    MIGRATIONS,
    STATE_TABLE,
    schema_table,
    upgrade,
)
from localstate._testing.postgres_server import PostgresServer

OWNER = "asset_watcher:orders"
_DELETED: Any = object()


def dirty(
    key: str, value: Any, *, version: int, base: int, by: str = "triggerer-a",
    owner: str = OWNER, at: float | None = None,
) -> DirtyRow:
    """A dirty row as the worker would take it for a flush (`_DELETED` for a deletion),
    written at `at` (default: now)."""
    data = None if value is _DELETED else orjson.dumps(value).decode()  # JSON text
    return DirtyRow(owner, key, data, version, base, time.time() if at is None else at, by)


async def write(sink: CentralStore, rows: list[DirtyRow], policies: PolicyMap
                ) -> list[FlushOutcome]:
    """`write_batch` as the sync worker of a cache file calls it. Here a file stands for each
    writer: a row's `updated_by` is also the id of the file it comes from (a batch mixing
    writers comes from no file)."""
    writers = {r.updated_by for r in rows}
    return await sink.write_batch(
        rows, policies, writer=writers.pop() if len(writers) == 1 else None)


def value_of(row: CentralRow | None) -> Any:
    assert row is not None
    assert row.data is not None
    return orjson.loads(row.data)


def only(outcomes: list[FlushOutcome]) -> FlushOutcome:
    assert len(outcomes) == 1, outcomes
    return outcomes[0]


@pytest_asyncio.fixture
async def central(central_url: str) -> AsyncIterator[CentralStore]:
    store = await CentralStore.open(central_url)
    try:
        yield store
    finally:
        await store.close()


async def _tables(engine: AsyncEngine) -> set[str]:
    async with engine.connect() as conn:
        return set(await conn.run_sync(lambda c: inspect(c).get_table_names()))


# -- schema --------------------------------------------------------------------------------


async def test_upgrade_creates_the_tables_and_is_idempotent(
    central_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    engine = make_engine(central_url)
    try:
        assert not {STATE_TABLE, "localstate_schema"} & await _tables(engine)
        with caplog.at_level(logging.INFO, logger="localstate.sync.schema"):
            applied = await upgrade(engine)
        assert [m.version for m in applied] == [m.version for m in MIGRATIONS]
        # announced once, with the versions it went from and to
        announced = [r.getMessage() for r in caplog.records if "upgraded" in r.getMessage()]
        assert len(announced) == 1, announced
        assert f"from version 0 to {MIGRATIONS[-1].version}" in announced[0]
        caplog.clear()
        assert {STATE_TABLE, "localstate_schema"} <= await _tables(engine)
        async with engine.connect() as conn:
            columns = await conn.run_sync(
                lambda c: {col["name"] for col in inspect(c).get_columns(STATE_TABLE)}
            )
            primary = await conn.run_sync(
                lambda c: inspect(c).get_pk_constraint(STATE_TABLE)["constrained_columns"]
            )
        assert columns == {"owner", "key", "value", "version", "prev_version", "updated_at",
                           "updated_by", "writer"}
        assert primary == ["owner", "key"]

        assert await upgrade(engine) == []  # a second run applies nothing...
        assert not [r for r in caplog.records if "upgraded" in r.getMessage()]  # ...says nothing
        async with engine.connect() as conn:  # ...and records nothing twice
            versions = (await conn.execute(select(schema_table.c.version))).scalars().all()
        assert sorted(versions) == [m.version for m in MIGRATIONS]
    finally:
        await engine.dispose()
    # opening on an up-to-date DB, with or without upgrading, works and keeps the data
    store = await CentralStore.open(central_url)
    try:
        await write(store, [dirty("k", 1, version=1, base=0)], PolicyMap())
    finally:
        await store.close()
    store = await CentralStore.open(central_url, upgrade_schema=False)
    try:
        assert value_of((await store.read_many([(OWNER, "k")]))[(OWNER, "k")]) == 1
    finally:
        await store.close()


async def test_upgrades_racing_from_many_processes_apply_each_migration_once(
    central_url: str,
) -> None:
    """Triggerers starting together each upgrade the schema: one applies every migration,
    the others wait for its lock and then find nothing to do (none fails, none applies a
    migration twice). Each engine is its own pool, as each process would be."""
    engines = [make_engine(central_url) for _ in range(6)]
    try:
        results = await asyncio.gather(*(upgrade(e) for e in engines))
        applied = sorted(m.version for result in results for m in result)
        assert applied == [m.version for m in MIGRATIONS]
        async with engines[0].connect() as conn:
            versions = (await conn.execute(select(schema_table.c.version))).scalars().all()
        assert sorted(versions) == [m.version for m in MIGRATIONS]
    finally:
        for engine in engines:
            await engine.dispose()


async def test_postgres_state_table_leaves_room_for_hot_updates(
    pg_server: PostgresServer,
) -> None:
    """Migration 2: a flush's UPDATEs of existing watermarks are HOT (no new index entry)."""
    url = pg_server.create_database(f"hot_{os.getpid()}_{time.monotonic_ns()}")
    store = await CentralStore.open(url)
    try:
        rows = [dirty(f"k{i}", 0, version=1, base=0) for i in range(500)]
        await write(store, rows, PolicyMap())
        await write(store,
            [dirty(f"k{i}", 1, version=2, base=1) for i in range(500)], PolicyMap())
    finally:
        await store.close()
    engine = make_engine(url)
    try:
        async with engine.connect() as conn:
            options = (await conn.execute(text(
                "SELECT reloptions FROM pg_class WHERE relname = :t"), {"t": STATE_TABLE}
            )).scalar_one()
            assert f"fillfactor={FILLFACTOR}" in options
            # table statistics reach pg_stat_user_tables within a second or so of the commit
            hot = 0
            deadline = time.monotonic() + 15
            while hot < 500 and time.monotonic() < deadline:
                await conn.rollback()  # a fresh snapshot of the statistics
                hot = (await conn.execute(text(
                    "SELECT n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = :t"),
                    {"t": STATE_TABLE})).scalar_one()
                if hot < 500:
                    await asyncio.sleep(0.2)
        assert hot == 500  # every one of the 500 updates was HOT
    finally:
        await engine.dispose()


async def test_a_newer_schema_is_refused(central_url: str) -> None:
    engine = make_engine(central_url)
    try:
        await upgrade(engine)
        async with engine.begin() as conn:
            await conn.execute(schema_table.insert().values(
                version=LATEST_VERSION + 1, description="from the future",
                applied_at=datetime.now(timezone.utc),
            ))
        with pytest.raises(SchemaError, match="upgrade localstate"):
            await upgrade(engine)
    finally:
        await engine.dispose()
    for upgrade_schema in (True, False):
        with pytest.raises(SchemaError, match=f"version {LATEST_VERSION + 1}, newer"):
            await CentralStore.open(central_url, upgrade_schema=upgrade_schema)
    # and the refusal reaches StateStore.open too, naming what to do
    with pytest.raises(SchemaError, match="upgrade localstate"):
        await StateStore.open(central_url=central_url, triggerer_id="t", flush_interval=60)


async def test_open_without_upgrade_on_an_empty_db_says_to_run_db_upgrade(
    central_url: str,
) -> None:
    with pytest.raises(SchemaError, match="run `localstate db upgrade"):
        await CentralStore.open(central_url, upgrade_schema=False)
    engine = make_engine(central_url)
    try:  # the refusal created nothing
        assert not {STATE_TABLE, "localstate_schema"} & await _tables(engine)
    finally:
        await engine.dispose()


# -- write_batch: inserts, fencing, conflict policies --------------------------------------


async def test_fresh_rows_are_inserted(central: CentralStore) -> None:
    rows = [dirty(f"k{i}", {"n": i}, version=1 + i % 3, base=0) for i in range(5)]
    rows.append(dirty("gone", _DELETED, version=2, base=0))
    outcomes = await write(central, rows, PolicyMap())
    assert [(o.row.key, o.resolution, o.conflict) for o in outcomes] == [
        (r.key, "written", False) for r in rows
    ]
    assert all(o.central is not None and o.central.version == o.row.version for o in outcomes)
    found = await central.read_many([(OWNER, r.key) for r in rows] + [(OWNER, "never")])
    assert set(found) == {(OWNER, r.key) for r in rows}
    for r in rows[:-1]:
        got = found[(OWNER, r.key)]
        assert (value_of(got), got.version, got.updated_by) == (
            orjson.loads(r.data or b""), r.version, "triggerer-a")
        assert got.updated_at == pytest.approx(r.updated_at, abs=1e-3)
    assert found[(OWNER, "gone")].data is None  # a deletion is kept as a tombstone
    assert (central.transactions, central.rows_written) == (1, 6)
    assert await write(central, [], PolicyMap()) == []


async def test_a_stale_write_under_reject_adopts_the_central_record(
    central: CentralStore,
) -> None:
    await write(central, [dirty("k", 10, version=1, base=0, by="b")], PolicyMap())
    # "a" never saw b's write: its base (0) is stale
    o = only(await write(central, [dirty("k", 99, version=3, base=0)], PolicyMap()))
    assert (o.resolution, o.conflict, o.policy) == ("adopted", True, "reject")
    assert o.central is not None
    assert (value_of(o.central), o.central.version, o.central.updated_by) == (10, 1, "b")
    got = (await central.read_many([(OWNER, "k")]))[(OWNER, "k")]
    assert (value_of(got), got.version, got.updated_by) == (10, 1, "b")
    # a write based on the central version goes in
    o = only(await write(central, [dirty("k", 11, version=2, base=1)], PolicyMap()))
    assert (o.resolution, o.conflict) == ("written", False)
    assert value_of((await central.read_many([(OWNER, "k")]))[(OWNER, "k")]) == 11


async def test_a_stale_write_under_last_writer_wins_goes_in_above_both_versions(
    central: CentralStore,
) -> None:
    policies = PolicyMap("last_writer_wins")
    await write(central, [dirty("k", "b's", version=5, base=0, by="b")], policies)
    o = only(await write(central, [dirty("k", "a's", version=2, base=0)], policies))
    assert (o.resolution, o.conflict, o.policy) == ("written", True, "last_writer_wins")
    got = (await central.read_many([(OWNER, "k")]))[(OWNER, "k")]
    assert (value_of(got), got.updated_by) == ("a's", "triggerer-a")
    assert got.version > 5
    assert got.version > 2
    assert o.central is not None
    assert o.central.version == got.version
    assert o.replaced is not None  # what the winning write overwrote
    assert (value_of(o.replaced), o.replaced.version, o.replaced.updated_by) == ("b's", 5, "b")


@pytest.mark.parametrize(
    ("central_value", "local_value", "winner"),
    [(10, 20, 20), (20, 10, 20), (10.5, 10, 10.5), (-1, 0, 0)],
)
async def test_a_stale_write_under_max_keeps_the_greater_value(
    central: CentralStore, central_value: float, local_value: float, winner: float,
) -> None:
    policies = PolicyMap("max")
    await write(central, [dirty("wm", central_value, version=4, base=0, by="b")], policies)
    o = only(await write(central, [dirty("wm", local_value, version=1, base=0)], policies))
    assert o.conflict
    assert o.resolution == ("written" if winner == local_value else "adopted")
    if o.resolution == "written":
        assert o.replaced is not None
        assert (value_of(o.replaced), o.replaced.version) == (central_value, 4)
    else:
        assert o.replaced is None
    got = (await central.read_many([(OWNER, "wm")]))[(OWNER, "wm")]
    assert value_of(got) == winner
    assert got.version == (5 if winner == local_value else 4)


async def test_max_never_lowers_another_writers_value_even_from_its_current_version(
    central: CentralStore,
) -> None:
    policies = PolicyMap("max")
    await write(central, [dirty("wm", 100, version=1, base=0, by="b")], policies)
    # based on b's current version, but lower: refused all the same
    o = only(await write(central, [dirty("wm", 50, version=2, base=1)], policies))
    assert (o.resolution, o.conflict) == ("adopted", True)
    # equal is not lower: a rewrite of the same value based on the current version goes in
    o = only(await write(central, [dirty("wm", 100, version=2, base=1)], policies))
    assert (o.resolution, o.conflict) == ("written", False)
    got = (await central.read_many([(OWNER, "wm")]))[(OWNER, "wm")]
    assert (value_of(got), got.version, got.updated_by) == (100, 2, "triggerer-a")


async def test_max_lets_a_writers_own_sequential_write_lower_its_value(
    central: CentralStore,
) -> None:
    """The writer's own chain is no conflict: its next write, based on the record it wrote,
    lands whatever max's order says (a trigger resetting its watermark, "10" after "9")."""
    policies = PolicyMap("max")
    await write(central, [dirty("wm", "9", version=1, base=0)], policies)
    o = only(await write(central, [dirty("wm", "10", version=2, base=1)], policies))
    assert (o.resolution, o.conflict) == ("written", False)
    o = only(await write(central, [dirty("wm", 5, version=3, base=2)], policies))
    assert (o.resolution, o.conflict) == ("written", False)
    got = (await central.read_many([(OWNER, "wm")]))[(OWNER, "wm")]
    assert (value_of(got), got.version) == (5, 3)
    # stale, though by the same writer: not its current record, so max compares (strictly)
    o = only(await write(central, [dirty("wm", 4, version=1, base=0, by="b")], policies))
    assert (o.resolution, o.conflict) == ("adopted", True)


async def test_max_of_a_field_compares_that_field(central: CentralStore) -> None:
    policies = PolicyMap({"asset_watcher:*": "max:offset", "*": "reject"})
    await write(central,
        [dirty("cur", {"offset": 7, "file": "z"}, version=1, base=0, by="b")], policies)
    # a lower offset loses whatever the other fields say
    o = only(await write(central,
        [dirty("cur", {"offset": 6, "file": "zzz"}, version=9, base=0)], policies))
    assert (o.resolution, o.policy) == ("adopted", "max:offset")
    # an object without the field never wins
    o = only(await write(central, [dirty("cur", {"file": "a"}, version=9, base=0)],
                                       policies))
    assert o.resolution == "adopted"
    o = only(await write(central,
        [dirty("cur", {"offset": 8, "file": "a"}, version=2, base=0)], policies))
    assert (o.resolution, o.conflict) == ("written", True)
    got = (await central.read_many([(OWNER, "cur")]))[(OWNER, "cur")]
    assert value_of(got) == {"offset": 8, "file": "a"}
    # owners the glob does not match fall back to reject
    other = "dag:x/y"
    await write(central, [dirty("cur", {"offset": 1}, version=1, base=0, owner=other,
                                     by="b")], policies)
    o = only(await write(central, [dirty("cur", {"offset": 5}, version=1, base=0,
                                              owner=other)], policies))
    assert (o.resolution, o.policy) == ("adopted", "reject")


async def test_max_compares_iso_timestamps_as_times(central: CentralStore) -> None:
    policies = PolicyMap("max")
    # As text "2024-01-01T00:30:00+02:00" sorts after "2023-12-31T23:00:00Z"; as a time it is
    # 22:30 UTC on Dec 31, half an hour earlier.
    await write(central,
        [dirty("ts", "2023-12-31T23:00:00Z", version=1, base=0, by="b")], policies)
    o = only(await write(central,
        [dirty("ts", "2024-01-01T00:30:00+02:00", version=1, base=0)], policies))
    assert o.resolution == "adopted"
    o = only(await write(central,
        [dirty("ts", "2024-01-01T01:30:00+02:00", version=1, base=0)], policies))
    assert o.resolution == "written"  # 23:30 UTC: later
    got = (await central.read_many([(OWNER, "ts")]))[(OWNER, "ts")]
    assert value_of(got) == "2024-01-01T01:30:00+02:00"


@pytest.mark.parametrize("policy", ["reject", "max"])
async def test_a_replayed_flush_of_the_writers_own_chain_is_accepted(
    central: CentralStore, policy: str,
) -> None:
    """A flush committed but never marked clean (a crash) is replayed from the same base."""
    policies = PolicyMap(policy)
    await write(central, [dirty("k", "v1", version=1, base=0)], policies)
    first = dirty("k", "v3", version=3, base=1)
    assert only(await write(central, [first], policies)).resolution == "written"
    # the same rows again: the central DB already holds this writer's v3 of this chain
    o = only(await write(central, [first], policies))
    assert (o.resolution, o.conflict) == ("written", False)
    # and the chain moved on locally before the replay: still the same writer, still fine
    o = only(await write(central, [dirty("k", "v4", version=4, base=1)], policies))
    assert (o.resolution, o.conflict) == ("written", False)
    got = (await central.read_many([(OWNER, "k")]))[(OWNER, "k")]
    assert (value_of(got), got.version) == ("v4", 4)
    # another writer on the same stale base is a conflict, not a replay
    o = only(await write(central, [dirty("k", "b's", version=4, base=1, by="b")],
                                       policies))
    assert (o.resolution, o.conflict) == ("adopted", True)
    # nor is the same writer's stale base with a *lower* version than central's (not a replay
    # of the chain that produced central's record): central holds this writer's own later
    # write (flushed, then lost from the local file in a crash). When the row is older than
    # it (left dirty in the file from before the crash) central's is kept under every
    # policy, last_writer_wins included, and is no conflict
    o = only(await write(central,
        [dirty("k", "old", version=2, base=1, at=time.time() - 60)], policies))
    assert (o.resolution, o.conflict) == ("adopted", False)
    assert o.central is not None
    assert (o.central.version, o.central.updated_by) == (4, "triggerer-a")
    assert value_of((await central.read_many([(OWNER, "k")]))[(OWNER, "k")]) == "v4"


async def _as_written_by_an_earlier_release(central: CentralStore) -> None:
    """What an upgrade leaves of rows an earlier release wrote (no writer id): the table as
    it was before migration 7 (its old name), then migration 7 run on it."""
    migration = next(m for m in MIGRATIONS if m.version == 7)
    mysql = central.engine.dialect.name in ("mysql", "mariadb")
    rename = "RENAME TABLE {} TO {}" if mysql else "ALTER TABLE {} RENAME TO {}"
    async with central.engine.begin() as conn:
        await conn.execute(text(f"UPDATE {STATE_TABLE} SET writer = NULL"))
        await conn.execute(text(rename.format(STATE_TABLE, "localstate_state_variable")))
        await conn.run_sync(migration.apply)


@pytest.mark.parametrize("policy", ["reject", "last_writer_wins", "max"])
async def test_an_earlier_releases_flush_is_the_own_chain_of_its_updated_by(
    central: CentralStore, policy: str,
) -> None:
    """The earlier release flushed v3 (based on v1) and was killed before its mark-clean;
    v5 was acknowledged locally meanwhile. After the upgrade the file has a writer id the
    central row does not carry: its flush of v5 (still based on v1) is a replay of its own
    chain, written with no conflict, under every policy (under reject it used to adopt v3:
    an acknowledged write reverted, and a conflict reported against itself)."""
    policies = PolicyMap(policy)
    old = [dirty("k", 1, version=1, base=0), dirty("j", 1, version=1, base=0)]
    await central.write_batch(old, policies, writer=None)
    await central.write_batch([dirty("k", 3, version=3, base=1),
                               dirty("j", 3, version=3, base=1)], policies, writer=None)
    await _as_written_by_an_earlier_release(central)
    rows = [dirty("k", 5, version=5, base=1), dirty("j", 3, version=3, base=1)]
    outcomes = await central.write_batch(rows, policies, writer="file-after-upgrade")
    assert [(o.resolution, o.conflict) for o in outcomes] == [("written", False)] * 2
    got = await central.read_many([(OWNER, "k"), (OWNER, "j")])
    assert (value_of(got[(OWNER, "k")]), got[(OWNER, "k")].version) == (5, 5)
    assert value_of(got[(OWNER, "j")]) == 3  # the very write replayed: the same value
    # from now on the rows are the file's by its writer id: its next write is on the
    # common path
    again = await central.write_batch([dirty("k", 6, version=6, base=5)], policies,
                                      writer="file-after-upgrade")
    assert (only(again).resolution, only(again).conflict) == ("written", False)


@pytest.mark.parametrize("policy", ["reject", "max"])
async def test_an_earlier_releases_row_of_another_triggerer_is_still_a_conflict(
    central: CentralStore, policy: str,
) -> None:
    """The mark names the earlier release's identity, updated_by: another triggerer's row
    is no replay; nor is a row written with no file behind it after the upgrade."""
    policies = PolicyMap(policy)
    await central.write_batch([dirty("k", 1, version=1, base=0, by="b"),
                               dirty("j", 1, version=1, base=0)], policies, writer=None)
    await central.write_batch([dirty("k", 3, version=3, base=1, by="b")], policies,
                              writer=None)
    await _as_written_by_an_earlier_release(central)
    # after the upgrade, a write with no file behind it (writer NULL, same updated_by)
    await central.write_batch([dirty("j", 3, version=3, base=1)], policies, writer=None)
    outcomes = await central.write_batch(
        [dirty("k", 5, version=5, base=1), dirty("j", 5, version=5, base=1)], policies,
        writer="file-a")
    # conflicts, settled by the policy (reject adopts; max keeps the greater value, 5)
    assert [o.conflict for o in outcomes] == [True, True]
    assert {o.resolution for o in outcomes} == {"adopted" if policy == "reject" else "written"}


@pytest.mark.parametrize(("policy", "value"), [
    ("reject", "v9"), ("last_writer_wins", "v9"), ("max", "v9"), ("max", "v0")])
async def test_a_write_made_after_a_restart_goes_on_top_of_the_chain_the_crash_cut(
    central: CentralStore, policy: str, value: str,
) -> None:
    """The restarted writer's file lost versions 2-4 that a flush had taken (a crash before
    their local commit); its next write is version 2 again, made after central's v4. It is
    the newer write: it goes in on top of v4, no conflict (it used to be replaced by v4, an
    acknowledged write lost). Under max too, even when lower: it is the writer's own chain."""
    policies = PolicyMap(policy)
    await write(central, [dirty("k", "v1", version=1, base=0)], policies)
    await write(central, [dirty("k", "v4", version=4, base=1)], policies)
    o = only(await write(central, [dirty("k", value, version=2, base=1)], policies))
    got = (await central.read_many([(OWNER, "k")]))[(OWNER, "k")]
    assert (o.resolution, o.conflict) == ("written", False)
    assert (value_of(got), got.version) == (value, 5)


async def test_one_batch_mixes_inserts_updates_and_conflicts(central: CentralStore) -> None:
    policies = PolicyMap()
    await write(central,
        [dirty("a", 1, version=1, base=0), dirty("b", 1, version=1, base=0, by="b")], policies)
    outcomes = await write(central, [
        dirty("a", 2, version=2, base=1),  # based on the current version
        dirty("b", 2, version=2, base=0),  # stale
        dirty("c", 1, version=1, base=0),  # new
    ], policies)
    assert {o.row.key: (o.resolution, o.conflict) for o in outcomes} == {
        "a": ("written", False), "b": ("adopted", True), "c": ("written", False)}
    found = await central.read_many([(OWNER, k) for k in "abc"])
    assert {k[1]: value_of(r) for k, r in found.items()} == {"a": 2, "b": 1, "c": 1}


# names a case-insensitive, accent-insensitive or space-padding collation would merge
LOOKALIKES = ["k", "K", "k ", "k  ", "é", "e", "E\u0301", "ß", "ss", "k\u00a0"]


async def test_names_differing_in_case_accents_or_trailing_spaces_are_different_keys(
    central: CentralStore,
) -> None:
    rows = [dirty(k, i, version=1, base=0, owner=o)
            for i, (o, k) in enumerate((o, k) for o in LOOKALIKES for k in LOOKALIKES)]
    outcomes = await write(central, rows, PolicyMap())
    assert [(o.resolution, o.conflict) for o in outcomes] == [("written", False)] * len(rows)
    found = await central.read_many([(r.owner, r.key) for r in rows])
    assert {k: value_of(r) for k, r in found.items()} == {
        (r.owner, r.key): orjson.loads(r.data or b"") for r in rows}
    # rewrites based on the versions just written: each row matches its own key only
    again = [dirty(r.key, -1, version=2, base=1, owner=r.owner) for r in rows]
    outcomes = await write(central, again, PolicyMap())
    assert [(o.resolution, o.conflict) for o in outcomes] == [("written", False)] * len(rows)
    for owner in LOOKALIKES:
        assert sorted(r.key for r in await central.read_owner(owner)) == sorted(LOOKALIKES)
    written = await central.write_if_version("k ", "k ", "1", 2, updated_by="cas")
    assert written.version == 3
    assert value_of((await central.read_many([("k", "k")]))[("k", "k")]) == -1


# -- reading -------------------------------------------------------------------------------


@collations
async def test_read_owner_and_list_rows(central: CentralStore) -> None:
    owners = ["a%b", "a%bc", "a_b", "axb", "ab", "b"]
    rows = [dirty(k, f"{o}/{k}", version=1, base=0, owner=o)
            for o in owners for k in ("k1", "k2")]
    rows.append(dirty("k3", _DELETED, version=1, base=0, owner="a%b"))
    await write(central, rows, PolicyMap())

    own = {r.key: r for r in await central.read_owner("a%b")}
    assert sorted(own) == ["k1", "k2", "k3"]  # the tombstone is included
    assert own["k3"].data is None
    assert value_of(own["k1"]) == "a%b/k1"
    assert await central.read_owner("a") == []  # exact owner, not a prefix

    everything = await central.list_rows(limit=1000)
    assert [(r.owner, r.key) for r in everything] == sorted(
        (o, k) for o in owners for k in ("k1", "k2"))
    with_deleted = await central.list_rows(limit=1000, include_deleted=True)
    assert ("a%b", "k3") in {(r.owner, r.key) for r in with_deleted}

    # "%" and "_" in a prefix are literal characters, not LIKE wildcards
    assert {r.owner for r in await central.list_rows(owner_prefix="a%")} == {"a%b", "a%bc"}
    assert {r.owner for r in await central.list_rows(owner_prefix="a_")} == {"a_b"}
    assert {r.owner for r in await central.list_rows(owner_prefix="a")} == {
        "a%b", "a%bc", "a_b", "axb", "ab"}

    # cursor pagination: pages of 5 starting after the last row of the previous page
    paged: list[tuple[str, str]] = []
    after: tuple[str, str] | None = None
    while True:
        page = await central.list_rows(after=after, limit=5)
        paged += [(r.owner, r.key) for r in page]
        if len(page) < 5:
            break
        after = (page[-1].owner, page[-1].key)
    assert paged == [(r.owner, r.key) for r in everything]
    # `after` inside one owner continues with the owner's next key
    assert [(r.owner, r.key) for r in await central.list_rows(after=("a_b", "k1"), limit=2)] \
        == [("a_b", "k2"), ("ab", "k1")]


#: names whose orders differ between byte-wise (C) and a language's collation (en-US: case and
#: punctuation weigh last), with LIKE's metacharacters, and beyond ASCII up to the last code
#: point (UTF-8 byte order is code-point order only if the surrogates are skipped right)
MIXED_NAMES = [
    "a", "B", "b", "A:1", "a:1", "a/1", "a-1", "a_1", "a.1", "a%1", "a\\1", "asset:294",
    "Asset/039", "ASSET-7", "a b", "é", "Z", "z", "\ud7ff", "\ue000", "\ufffd", "\U0001f600",
    "\U0010ffff", "\U0010ffff\U0010ffff", "a\U0010ffff", "a\U0010ffffb",
]


def utf8_order(name: tuple[str, str]) -> tuple[bytes, bytes]:
    return name[0].encode(), name[1].encode()


@collations
async def test_list_rows_orders_byte_wise_whatever_the_databases_collation(
    central: CentralStore,
) -> None:
    names = [(o, k) for o in MIXED_NAMES for k in ("k", "K", "k_1", "k1")]
    await write(central, [dirty(k, 1, version=1, base=0, owner=o) for o, k in names],
                              PolicyMap())
    expected = sorted(names, key=utf8_order)
    assert sorted(names) == expected  # Python's str order is the UTF-8 byte order
    listed = [(r.owner, r.key) for r in await central.list_rows(limit=len(names) + 1)]
    assert listed == expected
    # a cursor taken anywhere continues right after it
    for at in range(0, len(expected), 7):
        page = await central.list_rows(after=expected[at], limit=5)
        assert [(r.owner, r.key) for r in page] == expected[at + 1:at + 6]


@collations
@pytest.mark.parametrize("prefix", [
    "a", "A", "a%", "a_", "a\\", "a:", "asset", "Asset", "\ud7ff", "\U0010ffff", "a\U0010ffff",
    "%", "_", "\\", "é", "nothing",
])
async def test_list_rows_prefix_is_literal_and_case_sensitive(
    central: CentralStore, prefix: str
) -> None:
    names = [(o, "k") for o in MIXED_NAMES]
    await write(central, [dirty(k, 1, version=1, base=0, owner=o) for o, k in names],
                              PolicyMap())
    expected = sorted(n for n in names if n[0].startswith(prefix))
    listed = [(r.owner, r.key) for r in await central.list_rows(owner_prefix=prefix)]
    assert listed == expected
    paged: list[tuple[str, str]] = []
    after: tuple[str, str] | None = None
    for _ in range(len(names)):
        page = await central.list_rows(owner_prefix=prefix, after=after, limit=2)
        paged += [(r.owner, r.key) for r in page]
        if len(page) < 2:
            break
        after = (page[-1].owner, page[-1].key)
    assert paged == expected


async def test_sqlite_pages_by_seeking_the_primary_key(tmp_path: Any) -> None:
    """A page on SQLite seeks its cursor (and prefix) in the primary key, never scans it."""
    store = await CentralStore.open(f"sqlite:///{tmp_path / 'central.db'}")
    try:
        await store.write_batch([dirty(f"k{i}", 1, version=1, base=0, owner=f"o{i % 7}")
                                 for i in range(200)], PolicyMap())
        cases: list[dict[str, Any]] = [{"after": ("o3", "k10")}, {"owner_prefix": "o3"},
                                       {"owner_prefix": "o", "after": ("o3", "k10")}]
        for options in cases:
            with StatementLog(store).watching() as log:
                await store.list_rows(limit=5, **options)
            [(statement, params)] = log.of_kind("SELECT")
            async with store.engine.connect() as conn:
                plan = " ".join(str(row[-1]) for row in (await conn.exec_driver_sql(
                    "EXPLAIN QUERY PLAN " + statement, params)).all())
            assert plan.startswith("SEARCH"), (options, plan)
            assert "USING INDEX" in plan, (options, plan)
    finally:
        await store.close()


async def test_sqlite_reads_do_not_queue_behind_a_writer_holding_the_lock(tmp_path: Any) -> None:
    """Reads on SQLite take no write lock: a triggerer loading an owner, or the status page,
    reads the committed state while another process sits in a flush (even one paused by
    SIGSTOP), instead of waiting out busy_timeout (30 s) and failing."""
    path = tmp_path / "central.db"
    async with CentralStore.open(f"sqlite:///{path}") as store:
        await store.write_batch([dirty("k", 1, version=1, base=0, owner="o")], PolicyMap())
        await store.claim("o", claimant="t1")
        other = sqlite3.connect(path, isolation_level=None)
        try:
            other.execute("BEGIN IMMEDIATE")  # another process's flush, in progress
            other.execute(f"UPDATE {STATE_TABLE} SET value = '2'")
            reads = asyncio.gather(
                store.read_owner("o"), store.read_many([("o", "k")]),
                store.list_rows(), store.read_claims(["o"]), store.read_fleet(),
                store.run_read(text(f"SELECT count(*) FROM {STATE_TABLE}"), "count"))
            owner, many, listed, claims, _fleet, counted = await asyncio.wait_for(reads, 10)
        finally:
            other.rollback()
            other.close()
    assert [value_of(r) for r in owner] == [1] == [value_of(r) for r in many.values()]
    assert [value_of(r) for r in listed] == [1]
    assert claims == {"o": (1, "t1")}
    assert counted == [(1,)]


@pytest.mark.parametrize(("prefix", "bound"), [
    ("a", "b"), ("a%", "a&"), ("a_", "a`"), ("a\\", "a]"), ("\ud7ff", "\ue000"),
    ("a\U0010ffff", "b"), ("a\U0010ffff\U0010ffff", "b"), ("\U0010ffff", None),
    ("\U0001f600", "\U0001f601"),
])
def test_prefix_upper_bound_is_the_least_string_above_the_prefixs(prefix: str,
                                                                 bound: str | None) -> None:
    assert prefix_upper_bound(prefix) == bound
    if bound is not None:
        bound.encode()  # a string the database can hold: no surrogate
        assert prefix.encode() < bound.encode()
        assert (prefix + "\U0010ffff" * 3).encode() < bound.encode()


# -- statement and transaction counts ------------------------------------------------------


@pytest.mark.parametrize("policy", ["reject", "max"])
async def test_a_batch_of_1000_rows_is_one_insert_in_one_transaction(
    central: CentralStore, policy: str,
) -> None:
    policies = PolicyMap(policy)
    # half the keys exist already, so the batch is a mix of updates and inserts
    await write(central,
        [dirty(f"k{i:04}", i, version=1, base=0) for i in range(0, 1000, 2)], policies)
    batch = [dirty(f"k{i:04}", i + 1, version=2 if i % 2 == 0 else 1, base=1 if i % 2 == 0 else 0)
             for i in range(1000)]
    with StatementLog(central).watching() as log:
        outcomes = await write(central, batch, policies)
    assert [o.resolution for o in outcomes].count("written") == 1000
    inserts = log.of_kind("INSERT")
    assert len(inserts) == 1
    assert rows_carried(inserts[0][1]) == 1000
    assert log.commits == 1
    # besides the insert: at most BEGIN (SQLite's BEGIN IMMEDIATE) and, under max, one SELECT
    # of the current values; never a statement per row
    others = [s for s, _ in log.statements if not s.lstrip().upper().startswith("INSERT")]
    assert len(others) <= 2, others
    async with central.engine.connect() as conn:
        count = (await conn.execute(
            select(func.count()).select_from(text(STATE_TABLE)))).scalar_one()
        total = (await conn.execute(
            text(f"SELECT sum(CAST(value AS INTEGER)) FROM {STATE_TABLE}"))).scalar_one()
    assert count == 1000
    assert total == sum(i + 1 for i in range(1000))


async def test_open_is_an_async_context_manager_that_closes(central_url: str) -> None:
    closed: list[object] = []
    async with CentralStore.open(central_url) as central:
        event.listen(central.engine.sync_engine.pool, "close",
                     lambda conn, _record: closed.append(conn))
        row = await central.write_direct("o", "k", '"v"', updated_at=1.0, updated_by="t")
        assert row.version == 1
        assert closed == []
    assert len(closed) >= 1  # the pool's connections were closed on the way out
    again = await CentralStore.open(central_url)  # and awaitable, as before
    try:
        assert (await again.read_many([("o", "k")]))[("o", "k")].data == '"v"'
    finally:
        await again.close()


async def test_reads_of_many_owners_at_once_each_get_their_owners_rows(
    central: CentralStore,
) -> None:
    """A takeover's reads of its owners, all at once (some owners twice, one with no row):
    made together, each read gets exactly its owner's rows, byte-wise names kept apart."""
    owners = [f"took:{i:03d}" for i in range(120)] + ["Took:000"]
    rows = [dirty(k, [o, k], version=1, base=0, owner=o) for o in owners for k in ("a", "b")]
    await write(central, rows, PolicyMap())
    asked = [*owners, "took:000", "took:nothing", "took:007"]
    found = await asyncio.gather(*(central.read_owner(o) for o in asked))
    for owner, got in zip(asked, found, strict=True):
        expected = {} if owner == "took:nothing" else {"a": [owner, "a"], "b": [owner, "b"]}
        assert {r.key: value_of(r) for r in got} == expected, owner
        assert all(r.owner == owner for r in got)
