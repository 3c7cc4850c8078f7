"""`StateStore.emit`: an event and the watermark it advances, one local commit (the outbox in
the cache file) and one central transaction (`CentralStore.write_with_events`), de-duplicated
by (owner, key), fenced by claim epochs, in emit order. Each test runs on every central backend.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from conftest import StoreFactory
from sqlalchemy import select
from statement_log import StatementLog

from localstate import StateStore
from localstate._core.conflicts import PolicyMap
from localstate._core.rows import EventRow
from localstate._store import event_key
from localstate._sync.central.central_store import CentralStore
from localstate._sync.central.schema import event
from localstate._testing.mysql_server import MysqlServer
from localstate._testing.postgres_server import PostgresServer
from localstate.errors import (
    CentralUnavailable,
    EventsUnsupported,
    InvalidInput,
    InvalidName,
    OwnerLost,
    ValueEncodingError,
    ValueTooLarge,
)

OWNER = "trigger:orders"


async def committed_events(central_url: str) -> list[tuple[str, str, int, int]]:
    """(owner, key, seq, epoch) of every event the central DB committed, in seq order."""
    async with CentralStore.open(central_url) as central:
        t = event.c
        rows = await central.run_read(select(t.owner, t.key, t.seq, t.epoch)
                                      .order_by(t.owner, t.seq), "read events")
    return [(o, k, int(s), int(e)) for o, k, s, e in rows]


def outbox_rows(path: Path) -> list[tuple[int, str, str, str]]:
    with sqlite3.connect(path) as conn:
        return conn.execute("SELECT seq, owner, key, payload FROM outbox ORDER BY seq").fetchall()


def watermark_in_file(path: Path, owner: str = OWNER) -> str | None:
    with sqlite3.connect(path) as conn:
        row = conn.execute("SELECT value FROM state WHERE owner = ? AND key = 'watermark'",
                           (owner,)).fetchone()
    return None if row is None else str(row[0])


async def test_an_event_and_its_watermark_are_one_local_commit_then_one_flush(
    open_store: StoreFactory, central_url: str, tmp_path: Path,
) -> None:
    store = await open_store(durability="local")
    assert await store.emit(OWNER, {"id": 7}, watermark=7) == 1
    cache = tmp_path / "cache-triggerer-1.db"
    # acknowledged: both in the file, neither in the central DB yet
    assert outbox_rows(cache) == [(1, OWNER, "7", '{"id":7}')]
    assert watermark_in_file(cache) == "7"
    assert await committed_events(central_url) == []
    assert store.event_figures()[OWNER].pending == 1
    report = await store.flush()
    assert report.events == 1
    assert await committed_events(central_url) == [(OWNER, "7", 1, 0)]
    record = await store.read_committed(OWNER, "watermark")
    assert record is not None
    assert record.value == 7
    await store.sync_local()
    assert outbox_rows(cache) == []  # dropped once the central DB holds it
    figures = store.event_figures()[OWNER]
    assert (figures.emitted, figures.pending, figures.committed) == (1, 0, 1)
    assert figures.oldest_pending_at is None


async def test_events_of_an_owner_commit_in_emit_order(
    open_store: StoreFactory, central_url: str,
) -> None:
    store = await open_store()
    for i in range(1, 41):
        await store.emit(OWNER, i, watermark=i)
        await store.emit("trigger:other", -i, watermark=i, key=f"o{i}")
    await store.flush()
    mine = [row for row in await committed_events(central_url) if row[0] == OWNER]
    assert [int(k) for _o, k, _s, _e in mine] == list(range(1, 41))
    seqs = [s for _o, _k, s, _e in mine]
    assert seqs == sorted(seqs)


async def test_a_replayed_batch_commits_nothing_twice(
    open_store: StoreFactory, central_url: str,
) -> None:
    """A flush whose answer was lost is sent again: every event is then a duplicate."""
    async with CentralStore.open(central_url) as central:
        events = [EventRow(i, OWNER, str(i), str(i), 0.0) for i in range(1, 6)]
        _out, first = await central.write_with_events([], events, PolicyMap("reject"),
                                                      writer="w")
        _out, again = await central.write_with_events([], events, PolicyMap("reject"),
                                                      writer="w")
        # the same key twice in one batch: the first one counts
        _out, inner = await central.write_with_events(
            [], [EventRow(9, OWNER, "new", "1", 0.0), EventRow(10, OWNER, "new", "2", 0.0)],
            PolicyMap("reject"), writer="w")
    assert first == ["committed"] * 5
    assert again == ["duplicate"] * 5
    assert inner == ["committed", "duplicate"]
    assert len(await committed_events(central_url)) == 6


async def test_owners_sharing_key_names_are_each_de_duplicated_by_their_own_keys(
    central_url: str,
) -> None:
    """The central lookup of known events goes owner by owner: a key another owner holds is
    no duplicate, and in one batch of several owners each owner's own repeats are."""
    async with CentralStore.open(central_url) as central:
        first = [EventRow(1, OWNER, "k1", "1", 0.0), EventRow(2, "trigger:b", "k1", "1", 0.0),
                 EventRow(3, OWNER, "k2", "2", 0.0)]
        _out, statuses = await central.write_with_events([], first, PolicyMap("reject"),
                                                         writer="w")
        again = [EventRow(4, "trigger:b", "k2", "2", 0.0), EventRow(5, OWNER, "k2", "2", 0.0),
                 EventRow(6, "trigger:b", "k1", "1", 0.0), EventRow(7, "trigger:c", "k1", "1",
                                                                     0.0)]
        _out, later = await central.write_with_events([], again, PolicyMap("reject"),
                                                      writer="w")
    assert statuses == ["committed"] * 3
    assert later == ["committed", "duplicate", "duplicate", "committed"]
    assert sorted((o, k) for o, k, _s, _e in await committed_events(central_url)) == [
        ("trigger:b", "k1"), ("trigger:b", "k2"), ("trigger:c", "k1"), (OWNER, "k1"),
        (OWNER, "k2")]


def _plan(conn: Any, statement: str, parameters: Any, backend: str) -> str:
    """The backend's plan of `statement` (as the driver got it), as text."""
    explain = "EXPLAIN QUERY PLAN " if backend == "sqlite" else "EXPLAIN "
    rows = conn.exec_driver_sql(explain + statement, parameters).fetchall()
    return "\n".join(" ".join(str(v) for v in row) for row in rows)


async def test_the_known_event_lookup_reads_the_primary_key_not_the_table(
    open_store: StoreFactory, central_url: str, backend: str,
) -> None:
    """A flush's look-up of the events the central DB holds already is answered from the
    events' primary key (owner, key), not a scan that compares every row with every key of
    the batch (a cost growing with the table); on PostgreSQL it is one statement with one
    array of keys (its plan is the index or a hashed scan, by the sizes, and a prepared
    statement of a fixed shape)."""
    store = await open_store()
    await store.emit_many(OWNER, [(f"old/{n}", n) for n in range(3000)], watermark=1)
    await store.emit_many("trigger:other", [(f"old/{n}", n) for n in range(3000)],
                          watermark=1)
    await store.flush()
    analyze = {"postgresql": "ANALYZE localstate_event", "sqlite": "ANALYZE",
               "mysql": "ANALYZE TABLE localstate_event"}[backend]
    async with CentralStore.open(central_url) as central, central.engine.begin() as conn:
        await conn.exec_driver_sql(analyze)
    await store.emit_many(OWNER, [(f"new/{n}", n) for n in range(50)], watermark=2)
    with StatementLog(store).watching() as log:
        await store.flush()
    lookups = [(s, p) for s, p in log.statements
               if s.lstrip().startswith("SELECT") and "FROM localstate_event" in s]
    assert lookups, [s for s, _p in log.statements]
    async with CentralStore.open(central_url) as central, central.engine.connect() as conn:
        for statement, parameters in lookups:
            plan = await conn.run_sync(_plan, statement, parameters, backend)
            if backend == "sqlite":
                assert "SEARCH localstate_event USING COVERING INDEX" in plan, plan
                assert "SCAN localstate_event" not in plan, plan
            elif backend == "mysql":
                assert "PRIMARY" in plan, plan
                assert " ALL " not in f" {plan} ", plan
                assert " range " in f" {plan} ", plan  # bounded by the keys
            else:  # one array: the planner picks the index or a hashed scan by the sizes
                assert "= ANY" in plan, plan
    if backend == "postgresql":  # one statement of one array per owner, whatever the batch
        assert len(lookups) == 1, lookups


async def test_a_re_emitted_item_after_a_restart_is_a_duplicate(
    open_store: StoreFactory, central_url: str, tmp_path: Path,
) -> None:
    """A trigger that resumes from an older watermark re-emits items: same keys, no event."""
    store = await open_store()
    for i in range(1, 4):
        await store.emit(OWNER, i, watermark=i)
    await store.flush()
    other = await open_store(triggerer_id="triggerer-next")
    for i in range(2, 6):
        await other.emit(OWNER, i, watermark=i)
    await other.flush()
    assert [k for _o, k, _s, _e in await committed_events(central_url)] == [
        "1", "2", "3", "4", "5"]
    figures = other.event_figures()[OWNER]
    assert (figures.committed, figures.duplicates) == (2, 2)


async def test_a_zombies_events_and_watermark_are_refused_whole(
    open_store: StoreFactory, central_url: str,
) -> None:
    zombie = await open_store(triggerer_id="zombie")
    assert await zombie.claim(OWNER) == 1
    await zombie.emit(OWNER, "before", watermark=1)
    await zombie.flush()
    successor = await open_store(triggerer_id="successor")
    assert await successor.claim(OWNER) == 2
    # the zombie does not know yet: its emit is acknowledged locally, then refused centrally
    await zombie.emit(OWNER, "late", watermark=2)
    await zombie.flush()
    assert [k for _o, k, _s, _e in await committed_events(central_url)] == ["1"]
    record = await successor.read_committed(OWNER, "watermark")
    assert record is not None
    assert record.value == 1
    figures = zombie.event_figures()[OWNER]
    assert (figures.committed, figures.refused, figures.pending) == (1, 1, 0)
    with pytest.raises(OwnerLost):
        await zombie.emit(OWNER, "later", watermark=3)
    # the successor goes on from the committed watermark
    await successor.emit(OWNER, "late", watermark=2)
    await successor.flush()
    assert [(k, e) for _o, k, _s, e in await committed_events(central_url)] == [
        ("1", 1), ("2", 2)]


@pytest.mark.parametrize(("payload", "error"), [
    (object(), ValueEncodingError), ({"blob": "x" * 2048}, ValueTooLarge),
])
async def test_a_bad_payload_is_refused_at_emit_and_nothing_is_written(
    open_store: StoreFactory, payload: Any, error: type[Exception],
) -> None:
    store = await open_store(max_value_bytes=1024)
    with pytest.raises(error):
        await store.emit(OWNER, payload, watermark=1)
    with pytest.raises(ValueEncodingError):
        await store.emit(OWNER, 1, watermark=object())
    with pytest.raises(InvalidName):
        await store.emit(OWNER, 1, watermark=1, key="")
    assert store.event_figures() == {}
    assert await store.get(OWNER, "watermark") is None
    assert store.unflushed() == []


async def test_a_batch_is_one_local_commit_and_one_central_transaction(
    open_store: StoreFactory, central_url: str, tmp_path: Path,
) -> None:
    store = await open_store(durability="local")
    cache = store.local_cache
    assert cache is not None
    before = cache.commits
    batch = [(f"t/0/{n}", {"n": n}) for n in range(500)]
    assert await store.emit_many(OWNER, batch, watermark={"0": 500}) == 1
    assert cache.commits == before + 1  # 500 events and the watermark: one commit
    assert len(outbox_rows(tmp_path / "cache-triggerer-1.db")) == 500
    report = await store.flush()
    assert report.events == 500
    assert [k for _o, k, _s, _e in await committed_events(central_url)] == [k for k, _ in batch]
    # an empty batch sets the watermark alone
    await store.emit_many(OWNER, [], watermark={"0": 501})
    assert await store.get(OWNER, "watermark") == {"0": 501}


async def test_a_bad_event_in_a_batch_refuses_the_whole_batch(open_store: StoreFactory) -> None:
    store = await open_store(max_value_bytes=1024)
    for bad, error in (([("a", 1), ("b", object())], ValueEncodingError),
                       ([("a", 1), ("", 2)], InvalidName),
                       ([("a", 1), ("b", "x" * 2000)], ValueTooLarge)):
        with pytest.raises(error):
            await store.emit_many(OWNER, bad, watermark=1)
    with pytest.raises(InvalidInput, match="durability"):
        await store.emit_many(OWNER, [("a", 1)], watermark=1, durability="disk")  # type: ignore[arg-type]
    assert store.event_figures() == {}
    assert await store.get(OWNER, "watermark") is None


async def test_emit_with_the_cache_off_is_refused(open_store: StoreFactory) -> None:
    store = await open_store(enabled=False)
    with pytest.raises(EventsUnsupported, match="enabled"):
        await store.emit(OWNER, 1, watermark=1)


async def test_emit_through_airflows_state_store_is_refused(tmp_path: Path) -> None:
    store = await StateStore.open(cache_path=tmp_path / "c.db", sink="airflow")
    try:
        with pytest.raises(EventsUnsupported, match="sink = api"):
            await store.emit(OWNER, 1, watermark=1)
        assert await store.get(OWNER, "watermark") is None
    finally:
        await store.close(timeout=0)


async def test_an_asset_event_on_a_db_without_airflows_tables_is_refused(
    open_store: StoreFactory,
) -> None:
    """``sink = sql`` on localstate's own DB: an asset watcher's event could never become an
    asset event there, so emit says so up front and writes nothing."""
    store = await open_store()
    owner = "asset_watcher:orders"
    with pytest.raises(EventsUnsupported, match="Airflow's metadata DB"):
        await store.emit(owner, 1, watermark=1)
    assert await store.get(owner, "watermark") is None
    assert store.event_figures() == {}
    await store.emit(OWNER, 1, watermark=1)  # a trigger's own owner is fine there


async def test_the_outbox_survives_a_restart_and_flushes_once(
    open_store: StoreFactory, central_url: str, tmp_path: Path,
) -> None:
    store = await open_store(durability="local")
    for i in range(1, 4):
        await store.emit(OWNER, i, watermark=i)
    await store.close(timeout=0)  # no flush: the events stay in the file
    cache = tmp_path / "cache-triggerer-1.db"
    assert [s for s, *_ in outbox_rows(cache)] == [1, 2, 3]
    again = await open_store(triggerer_id="triggerer-1", durability="local")
    assert again.event_figures()[OWNER].pending == 3
    await again.emit(OWNER, 4, watermark=4)  # after the ones found: seq 4
    await again.flush()
    assert [(k, s) for _o, k, s, _e in await committed_events(central_url)] == [
        ("1", 1), ("2", 2), ("3", 3), ("4", 4)]


def test_the_default_key_is_the_watermarks_string_form() -> None:
    assert event_key("2026-12-05T10:00:00") == "2026-12-05T10:00:00"
    assert event_key(42) == "42"
    assert event_key({"id": 7}) == '{"id":7}'


async def test_flush_true_and_central_durability_commit_without_waiting_for_the_interval(
    open_store: StoreFactory, central_url: str,
) -> None:
    store = await open_store(flush_interval=60, central_timeout=30)
    # central durability: returns once the central DB holds the watermark, and so the event
    await store.emit(OWNER, "a", watermark=1, durability="central")
    assert [k for _o, k, _s, _e in await committed_events(central_url)] == ["1"]
    # flush=True: a flush starts now, not in 60 s
    await store.emit(OWNER, "b", watermark=2, flush=True)
    for _ in range(400):
        if store.stats().events_committed == 2:
            break
        await asyncio.sleep(0.025)
    assert [k for _o, k, _s, _e in await committed_events(central_url)] == ["1", "2"]
    stats = store.stats()
    assert (stats.events_emitted, stats.events_pending, stats.events_committed) == (2, 0, 2)
    assert stats.events_by_owner[OWNER]["committed"] == 2


async def test_a_backlog_of_events_goes_max_batch_at_a_time_never_behind_its_watermark(
    open_store: StoreFactory, central_url: str,
) -> None:
    store = await open_store(max_batch=10)
    for i in range(1, 26):
        await store.emit(OWNER, i, watermark=i)
    await store.set("trigger:plain", "k", 1)
    report = await store.flush()
    assert report.events == 10
    # the owner's watermark waited for its events; other owners' state went
    assert [(o.row.owner, o.row.key) for o in report.outcomes] == [("trigger:plain", "k")]
    # the rest follows at once (the worker kicks itself), in order
    for _ in range(400):
        if store.stats().events_pending == 0 and not store.unflushed():
            break
        await asyncio.sleep(0.025)
    assert [int(k) for _o, k, _s, _e in await committed_events(central_url)] == list(
        range(1, 26))
    record = await store.read_committed(OWNER, "watermark")
    assert record is not None
    assert record.value == 25


async def test_writes_made_while_a_claim_waits_go_out_under_it_not_refused(
    db_server: PostgresServer | MysqlServer, tmp_path: Path,
) -> None:
    """A trigger moved here while the central DB is down cannot claim its owner: it runs on
    from the watermark it read and claims later (`StateEnabledTrigger`). The previous
    holder's claim stands meanwhile, so a flush of the emits made here before the claim would
    be refused and the events dropped, while the trigger goes on past them once its claim
    is made: lost items. Held by the claim that waits, they go out under it, each once."""
    url = db_server.create_database(f"held_{uuid.uuid4().hex[:12]}")
    holder = await StateStore.open(central_url=url, cache_path=tmp_path / "holder.db",
                                   triggerer_id="holder", flush_interval=3600)
    late = await StateStore.open(central_url=url, cache_path=tmp_path / "late.db",
                                 triggerer_id="late", flush_interval=3600,
                                 central_transaction_timeout=0.5, central_timeout=2)
    try:
        assert await holder.claim(OWNER) == 1
        await holder.emit(OWNER, {"n": 1}, watermark=1)
        await holder.flush()
        await holder.close()  # the holder's triggerer dies; its claim stands
        started = time.time()
        assert await late.get(OWNER, "watermark") == 1  # the trigger reads where to go on
        await asyncio.to_thread(db_server.stop)
        try:
            with pytest.raises(CentralUnavailable):
                await late.claim(OWNER, hold=True)
            for n in (2, 3):  # from its cache, as in an outage
                await late.emit(OWNER, {"n": n}, watermark=n)
        finally:
            await asyncio.to_thread(db_server.start)
        # the central DB is back: a flush comes before the claim
        await late.flush()
        assert [k for _o, k, _s, _e in await committed_events(url)] == ["1"]
        assert await late.claim(OWNER, unless_claimed_since=started) == 2
        await late.emit(OWNER, {"n": 4}, watermark=4)  # the trigger goes on from 3
        await late.flush()
        assert [(k, e) for _o, k, _s, e in await committed_events(url)] == [
            ("1", 1), ("2", 2), ("3", 2), ("4", 2)]
        record = await late.read_committed(OWNER, "watermark")
        assert record is not None
        assert record.value == 4
    finally:
        await late.close()
        await holder.close()


async def test_a_held_owner_whose_claim_is_refused_loses_its_writes_and_says_so(
    db_server: PostgresServer | MysqlServer, tmp_path: Path,
) -> None:
    """The other side: someone claimed the owner after this store started waiting. Its held
    writes go out once its claim is refused, and are refused (OwnerLost), none committed."""
    url = db_server.create_database(f"held_{uuid.uuid4().hex[:12]}")
    late = await StateStore.open(central_url=url, cache_path=tmp_path / "late.db",
                                 triggerer_id="late", flush_interval=3600,
                                 central_transaction_timeout=0.5, central_timeout=2)
    newer = await StateStore.open(central_url=url, cache_path=tmp_path / "newer.db",
                                  triggerer_id="newer", flush_interval=3600)
    try:
        started = time.time()
        await asyncio.to_thread(db_server.stop)
        try:
            with pytest.raises(CentralUnavailable):
                await late.claim(OWNER, hold=True)
            await late.emit(OWNER, {"n": 1}, watermark=1)
        finally:
            await asyncio.to_thread(db_server.start)
        assert await newer.claim(OWNER) == 1
        await late.flush()  # held: nothing of the owner goes out
        assert await committed_events(url) == []
        with pytest.raises(OwnerLost):
            await late.claim(OWNER, unless_claimed_since=started)
        await late.flush()  # now out, and refused
        assert await committed_events(url) == []
        assert late.event_figures()[OWNER].refused == 1
        with pytest.raises(OwnerLost):
            await late.emit(OWNER, {"n": 2}, watermark=2)
    finally:
        await late.close()
        await newer.close()
