"""`StateEnabledTrigger` on real ``BaseEventTrigger`` subclasses, driven through ``run()``.

With the ``sql`` sink the state lands in the central table (both backends); with the
``airflow`` sink in Airflow's asset state store, here an in-memory implementation of the
accessor methods (`MemoryAccessor`: the real one needs a triggerer's supervisor socket, which
`tests/airflow/test_airflow_e2e.py` provides). The drop-in ``self.asset_state_store`` wraps
Airflow's own ``AssetStateStoreAccessors``: in this process Airflow's accessor would fail (no
supervisor), so a test that passes proves the calls were served locally.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import greenback
import pytest
from airflow.sdk import Asset
from airflow.sdk.definitions.asset import AssetUriRef
from airflow.sdk.execution_time.context import AssetStateStoreAccessor, AssetStateStoreAccessors
from airflow.triggers.base import BaseEventTrigger, TriggerEvent
from conftest import StoreFactory
from driven_triggers import EmittingTrigger, drive

from localstate import StateStore
from localstate._store import StateVariable
from localstate._sync.central.central_store import CentralStore
from localstate._sync.sinks.airflow_sink import AirflowSink, process_sink
from localstate._testing.mysql_server import MysqlServer
from localstate._testing.postgres_server import PostgresServer
from localstate.airflow.trigger import StateEnabledTrigger, asset_owner, trigger_owner
from localstate.errors import LocalStateError


class CountingTrigger(StateEnabledTrigger, BaseEventTrigger):
    """Yields watermark+1, watermark+2, ... and advances the watermark after each event."""

    def __init__(self, *, source: str, step: int = 1) -> None:
        super().__init__()
        self.source = source
        self.step = step

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (f"{__name__}.CountingTrigger", {"source": self.source, "step": self.step})

    async def run(self) -> AsyncIterator[TriggerEvent]:
        n = await self.get_watermark(default=0)
        while True:
            n += self.step
            yield TriggerEvent(n)
            await self.set_watermark(n)


class DropInTrigger(BaseEventTrigger):
    """Written against Airflow's own API only: ``self.asset_state_store.aget/aset``."""

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (f"{__name__}.DropInTrigger", {})

    async def run(self) -> AsyncIterator[TriggerEvent]:
        assert self.asset_state_store is not None
        last = int(await self.asset_state_store.aget("last_id", default=0))  # type: ignore[arg-type]
        while True:
            last += 1
            await self.asset_state_store.aset("last_id", last)
            yield TriggerEvent(last)


class LocalDropInTrigger(StateEnabledTrigger, DropInTrigger):
    pass


class SyncCallsTrigger(StateEnabledTrigger, BaseEventTrigger):
    """Airflow's synchronous accessor calls inside run(), through greenback's portal."""

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (f"{__name__}.SyncCallsTrigger", {})

    async def run(self) -> AsyncIterator[TriggerEvent]:
        assert self.asset_state_store is not None
        self.asset_state_store.set("etag", "v1")
        yield TriggerEvent(self.asset_state_store.get("etag"))


class MemoryAccessor(AssetStateStoreAccessor):
    """One asset's store in memory, with the methods the sink calls; counts the calls."""

    def __init__(self, name: str) -> None:
        super().__init__(name=name)
        self.values: dict[str, Any] = {}
        self.sets = 0
        self.gets = 0

    async def aget(self, key: str, default: Any = None) -> Any:
        self.gets += 1
        return self.values.get(key, default)

    async def aset(self, key: str, value: Any) -> None:
        self.sets += 1
        self.values[key] = json.loads(json.dumps(value))  # stored as JSON text, as Airflow does

    async def adelete(self, key: str) -> None:
        self.values.pop(key, None)

    async def aclear(self) -> None:
        self.values.clear()


class MemoryAccessors(AssetStateStoreAccessors):
    """What a triggerer injects, for assets kept in memory."""

    def __init__(self, *accessors: MemoryAccessor) -> None:
        super().__init__(inlets=[])
        self._by_name = {a._name or "": a for a in accessors}
        self._total = len(accessors)


@pytest.fixture(autouse=True)
def _no_default_store() -> Iterator[None]:
    yield
    StateVariable.configure(None)


async def use(store: StateStore) -> StateStore:
    StateVariable.configure(store)
    return store


async def test_watermark_continues_on_another_triggerer(open_store: StoreFactory) -> None:
    first = await use(await open_store())
    trigger = CountingTrigger(source="orders")
    assert await drive(trigger, 50) == list(range(1, 51))
    assert await trigger.state.get() == 49  # the 50th event's set had not run yet
    await trigger.state.set(50)
    await first.flush()
    assert trigger.state_owner.startswith("trigger:")

    # the same trigger (same classpath and kwargs) on another triggerer: same owner, continues
    await use(await open_store())
    again = CountingTrigger(source="orders")
    assert again.state_owner == trigger.state_owner
    assert await drive(again, 3) == [51, 52, 53]
    other = CountingTrigger(source="invoices")
    assert other.state_owner != trigger.state_owner
    assert await drive(other, 1) == [1]


async def test_state_is_opened_by_run(open_store: StoreFactory) -> None:
    await use(await open_store())
    trigger = CountingTrigger(source="orders")
    with pytest.raises(LocalStateError, match="open_state"):
        trigger.state  # noqa: B018 (the property is the test)
    await drive(trigger, 1)
    assert trigger.state.owner == trigger.state_owner
    assert trigger.state_variable("cursor").key == "cursor"


def test_owner_is_a_stable_hash_of_the_kwargs() -> None:
    trigger = CountingTrigger(source="orders", step=2)
    text = json.dumps({"source": "orders", "step": 2}, sort_keys=True, separators=(",", ":"))
    digest = hashlib.sha256(f"{__name__}.CountingTrigger\0{text}".encode()).hexdigest()[:32]
    assert trigger.state_owner == f"trigger:{__name__}.CountingTrigger:{digest}"
    assert trigger_owner("x.Y", {"b": 1, "a": 2}) == trigger_owner("x.Y", {"a": 2, "b": 1})


def test_owner_comes_from_the_watched_asset() -> None:
    trigger = CountingTrigger(source="orders")
    trigger.asset_state_store = AssetStateStoreAccessors(inlets=[Asset(name="orders")])
    assert trigger.state_owner == "asset_watcher:orders"
    assert isinstance(trigger.asset_state_store, AssetStateStoreAccessors)
    several = CountingTrigger(source="orders")
    several.asset_state_store = AssetStateStoreAccessors(
        inlets=[Asset(name="orders"), Asset(name="refunds")])
    assert several.state_owner.startswith("trigger:")


async def test_drop_in_asset_state_store_is_served_locally(open_store: StoreFactory) -> None:
    store = await use(await open_store())
    trigger = LocalDropInTrigger()
    # what the triggerer injects: Airflow's accessors, which would need its supervisor
    trigger.asset_state_store = AssetStateStoreAccessors(inlets=[Asset(name="orders")])
    assert await drive(trigger, 20) == list(range(1, 21))
    assert await store.get("asset_watcher:orders", "last_id") == 20
    assert isinstance(trigger.asset_state_store, AssetStateStoreAccessors)
    with pytest.raises(ValueError, match="None"):
        await trigger.asset_state_store.aset("last_id", None)
    accessor = trigger.asset_state_store[Asset(name="orders")]
    await accessor.adelete("last_id")
    assert await accessor.aget("last_id", default="gone") == "gone"


async def test_sync_accessor_calls_through_the_portal(open_store: StoreFactory) -> None:
    store = await use(await open_store())
    trigger = SyncCallsTrigger()
    trigger.asset_state_store = AssetStateStoreAccessors(inlets=[Asset(name="etags")])
    assert await drive(trigger, 1) == ["v1"]
    assert await store.get("asset_watcher:etags", "etag") == "v1"


@pytest.fixture
def airflow_sink() -> Iterator[AirflowSink]:
    """The process's Airflow sink, with a clean registry after the test."""
    sink = process_sink()
    saved = dict(sink.registry._by_owner)
    yield sink
    sink.registry._by_owner = saved


def test_the_sink_knows_which_owners_are_named_by_their_asset(airflow_sink: AirflowSink
                                                             ) -> None:
    """Only an owner ``asset_watcher:<name>`` of an accessor addressing the asset by that name
    is read in batches from Airflow's asset_state_store (`AirflowSink.use_batch_reads`)."""
    long_name = "n" * 300  # its owner is a hash: no asset has that name
    for inlets in ([Asset(name="orders")], [AssetUriRef(uri="s3://bucket/refunds")],
                   [Asset(name=long_name)], [Asset(name="a"), Asset(name="b")]):
        trigger = CountingTrigger(source="orders")
        trigger.asset_state_store = AssetStateStoreAccessors(inlets=inlets)
    registry = airflow_sink.registry
    assert registry.by_asset_name("asset_watcher:orders")
    assert registry.lookup("asset_watcher:s3://bucket/refunds")
    assert not registry.by_asset_name("asset_watcher:s3://bucket/refunds")
    hashed = [o for o in registry.owners() if o.startswith("asset_watcher:sha256:")]
    assert hashed
    assert not any(registry.by_asset_name(o) for o in hashed)
    assert registry.by_asset_name("asset_watcher:a")  # each asset's own owner
    several = [o for o in registry.owners() if o.startswith(f"trigger:{__name__}")]
    assert several
    assert not any(registry.by_asset_name(o) for o in several)


async def test_airflow_sink_one_write_per_key_per_flush(
    tmp_path: Path, airflow_sink: AirflowSink
) -> None:
    stored = MemoryAccessor("orders")
    store = await use(await StateStore.open(
        cache_path=tmp_path / "t1.db", sink="airflow", flush_interval=60))
    try:
        trigger = CountingTrigger(source="orders")
        trigger.asset_state_store = MemoryAccessors(stored)
        await drive(trigger, 1000)
        await store.flush()
        assert stored.values == {"watermark": 999}
        assert stored.sets == 1  # 999 watermark updates, one write
    finally:
        await store.close()

    # another triggerer (its own cache) reads the watermark through, then continues
    other = await use(await StateStore.open(
        cache_path=tmp_path / "t2.db", sink="airflow", flush_interval=60))
    try:
        again = CountingTrigger(source="orders")
        again.asset_state_store = MemoryAccessors(stored)
        assert await drive(again, 2) == [1000, 1001]
        assert stored.gets >= 1
    finally:
        await other.close()
    assert stored.values == {"watermark": 1000}  # close() flushed


async def test_cleanup_flushes_before_the_trigger_leaves(open_store: StoreFactory,
                                                        central_url: str) -> None:
    await use(await open_store())
    trigger = CountingTrigger(source="moving")
    await drive(trigger, 5)
    key = (trigger.state_owner, "watermark")
    central = await CentralStore.open(central_url)
    try:
        assert key not in await central.read_many([key])
        await trigger.cleanup()  # the triggerer calls it when the trigger moves or stops
        assert (await central.read_many([key]))[key].data == "4"
    finally:
        await central.close()


async def test_drop_in_clear_empties_local_and_airflow_keys(
    tmp_path: Path, airflow_sink: AirflowSink
) -> None:
    stored = MemoryAccessor("orders")
    stored.values["only_in_airflow"] = 1
    store = await use(await StateStore.open(
        cache_path=tmp_path / "c.db", sink="airflow", flush_interval=60))
    try:
        trigger = LocalDropInTrigger()
        trigger.asset_state_store = MemoryAccessors(stored)
        await drive(trigger, 3)
        await store.flush()
        assert stored.values == {"only_in_airflow": 1, "last_id": 3}
        assert trigger.asset_state_store is not None
        await trigger.asset_state_store.aclear()
        assert await trigger.asset_state_store.aget("last_id") is None
        await store.flush()
        assert stored.values == {}
    finally:
        await store.close()


async def test_a_trigger_claims_its_owner_and_stops_when_another_claims_it(
        open_store: StoreFactory) -> None:
    first = await use(await open_store(triggerer_id="first"))
    zombie = CountingTrigger(source="orders")
    assert await drive(zombie, 3) == [1, 2, 3]
    assert first.claim_epoch(zombie.state_owner) == 1
    await first.flush()
    # the trigger moved: the other triggerer's start claims the owner
    second = await use(await open_store(triggerer_id="second"))
    moved = CountingTrigger(source="orders")
    assert await drive(moved, 2) == [3, 4]
    assert second.claim_epoch(moved.state_owner) == 2
    await second.flush()
    # the zombie goes on from its own state (watermark 2): event 3, its set of 3, event 4; the
    # flush after event 4 learns the owner was lost, so the set of 4 raises and run() ends
    StateVariable.configure(first)
    await greenback.ensure_portal()
    events: list[Any] = []
    async for event in zombie.run():
        events.append(event.payload)
        await first.flush()
        if len(events) > 5:
            break
    assert events == [3, 4]
    assert first.claims_refused >= 1
    # the new owner's record stands (its set after event 3); the zombie's set of 3 was refused
    assert await second.get(moved.state_owner, "watermark") == 3
    assert await second.record(moved.state_owner, "watermark") is not None
    record = await first.record(moved.state_owner, "watermark")
    assert record is not None
    assert record.updated_by == "second"  # the zombie took it


async def test_a_trigger_started_while_the_central_db_is_down_claims_once_it_is_back(
        private_pg: PostgresServer, tmp_path: Path) -> None:
    url = private_pg.create_database(f"late_claim_{os.getpid()}")
    private_pg.stop()
    try:
        store = await use(await StateStore.open(
            central_url=url, cache_path=tmp_path / "cache.db", triggerer_id="t",
            central_transaction_timeout=0.5))
        await store.set(trigger_owner(f"{__name__}.CountingTrigger",
                                      {"source": "late", "step": 1}), "watermark", 7)
        trigger = CountingTrigger(source="late")
        # the watermark is in the cache: the trigger runs from it, unclaimed
        assert await drive(trigger, 2) == [8, 9]
        assert store.claim_epoch(trigger.state_owner) == 0
        # a trigger whose watermark is in no cache waits for the central DB, and never
        # starts over from the default
        other = CountingTrigger(source="elsewhere")
        waiting = asyncio.create_task(drive(other, 1))
        await asyncio.sleep(1.5)
        assert not waiting.done()
    finally:
        private_pg.start()
    assert await asyncio.wait_for(waiting, 60) == [1]
    for _ in range(200):  # the background claim's backoff starts at 0.5-1 s
        if store.claim_epoch(trigger.state_owner):
            break
        await asyncio.sleep(0.05)
    assert store.claim_epoch(trigger.state_owner) == 1
    await trigger.cleanup()
    await other.cleanup()
    await store.close()


async def committed_keys(url: str, owner: str) -> list[str]:
    return [key for key, _epoch in await committed_events(url, owner)]


async def committed_events(url: str, owner: str) -> list[tuple[str, int]]:
    """(key, claim epoch) of each event of `owner` the central DB committed, in order."""
    from sqlalchemy import select

    from localstate._sync.central.schema import event

    async with CentralStore.open(url) as central:
        e = event.c
        return [(k, int(epoch)) for k, epoch in await central.run_read(
            select(e.key, e.epoch).where(e.owner == owner).order_by(e.seq), "read events")]


async def test_an_emitting_trigger_resumes_on_another_triggerer_without_duplicates(
        open_store: StoreFactory, central_url: str) -> None:
    first = await use(await open_store(triggerer_id="first"))
    trigger = EmittingTrigger(source="orders", last=5)
    assert await drive(trigger, 1) == []  # it yields nothing: its events go with the flush
    await first.flush()
    owner = trigger.state_owner
    assert await committed_keys(central_url, owner) == ["1", "2", "3", "4", "5"]
    # moved: the next triggerer resumes from the committed watermark
    await use(await open_store(triggerer_id="second"))
    moved = EmittingTrigger(source="orders", last=8)
    assert moved.state_owner == owner
    await drive(moved, 1)
    await moved._open_store().flush()
    # (seqs are per cache file: the second file's start at 1 again)
    assert sorted(map(int, await committed_keys(central_url, owner))) == list(range(1, 9))


async def test_an_asset_watchers_emit_on_a_db_without_airflow_is_a_typed_error(
        open_store: StoreFactory) -> None:
    from localstate.errors import EventsUnsupported

    await use(await open_store())
    trigger = EmittingTrigger(source="orders", last=3)
    trigger.asset_state_store = AssetStateStoreAccessors(inlets=[Asset(name="orders")])
    with pytest.raises(EventsUnsupported, match="sink = api"):
        await drive(trigger, 1)


@pytest.mark.parametrize("call", ["emit", "emit_many"])
async def test_a_trigger_emitting_to_its_assets_while_the_central_db_is_down_claims_them_later(
        db_server: PostgresServer | MysqlServer, tmp_path: Path, call: str) -> None:
    """A trigger watching several assets claims each asset's owner at its first emit. The
    central DB down then: the emit runs from the local cache (never raises
    `CentralUnavailable`) and the assets are claimed in the background once it is back. Their
    events wait in this store meanwhile: the previous holder's claim stands until then, and
    would refuse them (the events dropped, the trigger gone on past them)."""
    url = db_server.create_database(f"asset_claims_{uuid.uuid4().hex[:12]}")
    holder = await StateStore.open(central_url=url, cache_path=tmp_path / "holder.db",
                                   triggerer_id="holder", flush_interval=3600)
    late = await use(await StateStore.open(
        central_url=url, cache_path=tmp_path / "late.db", triggerer_id="late",
        flush_interval=3600, central_transaction_timeout=0.5, central_timeout=2))
    owners = [asset_owner("a"), asset_owner("b")]
    trigger = EmittingTrigger(source="fan-out", last=0)
    trigger.asset_state_store = AssetStateStoreAccessors(
        inlets=[Asset(name="a"), Asset(name="b")])
    try:
        for owner in owners:  # the triggerer the assets' watcher ran on before, now dead
            assert await holder.claim(owner) == 1
        await holder.close()
        await asyncio.to_thread(db_server.stop)
        try:
            await trigger.open_state()
            if call == "emit":  # each watched asset gets the event
                await trigger.emit({"n": 1}, watermark=1)
                expected = {owners[0]: ["1"], owners[1]: ["1"]}
            else:
                await trigger.emit_many([("x", {"n": 1}), ("y", {"n": 2})], watermark=2,
                                        routes=[["a"], ["a", "b"]])
                expected = {owners[0]: ["x", "y"], owners[1]: ["y"]}
            assert [late.claim_epoch(owner) for owner in owners] == [0, 0]
        finally:
            await asyncio.to_thread(db_server.start)
        # back: a flush made before the background claims carries none of the assets' events
        # (held), one made after carries them under the claim
        await late.flush()
        for owner in owners:
            assert (await committed_events(url, owner)) in ([], [
                (key, 2) for key in expected[owner]])
        for _ in range(1200):  # the background claims' backoff: 1 s, then up to 2, 4, ...
            if all(late.claim_epoch(owner) for owner in [*owners, trigger.state_owner]):
                break
            await asyncio.sleep(0.05)
        assert [late.claim_epoch(owner) for owner in owners] == [2, 2]
        assert late.claim_epoch(trigger.state_owner) == 1
        await late.flush()
        for owner in owners:  # each once, under this triggerer's claim
            assert await committed_events(url, owner) == [(key, 2) for key in expected[owner]]
        assert late.claims_refused == 0
    finally:
        await trigger.cleanup()
        await late.close()
        await holder.close()


async def test_a_trigger_leaving_before_its_assets_background_claim_lets_their_events_go(
        db_server: PostgresServer | MysqlServer, tmp_path: Path) -> None:
    """The trigger leaves this triggerer (moved while the central DB was down) before its
    assets' background claims are made. The events it emitted to them meanwhile wait for no
    claim any more: they go out, fenced as any write made without one, and are refused (the
    triggerer the trigger moved to claimed the assets and emits them from the committed
    watermark). Nothing stays pending in this store's outbox, and when the trigger comes back
    its new claims carry none of them."""
    url = db_server.create_database(f"left_{uuid.uuid4().hex[:12]}")
    late = await use(await StateStore.open(
        central_url=url, cache_path=tmp_path / "late.db", triggerer_id="late",
        flush_interval=3600, central_transaction_timeout=0.5, central_timeout=2))
    newer = await StateStore.open(central_url=url, cache_path=tmp_path / "newer.db",
                                  triggerer_id="newer", flush_interval=3600)
    owners = [asset_owner("a"), asset_owner("b")]

    def fan_out(last: int) -> EmittingTrigger:
        trigger = EmittingTrigger(source="fan-out", last=last)
        trigger.asset_state_store = AssetStateStoreAccessors(
            inlets=[Asset(name="a"), Asset(name="b")])
        return trigger

    trigger = fan_out(0)
    try:
        for owner in owners:  # the triggerer the assets' watcher ran on before
            assert await newer.claim(owner) == 1
        await asyncio.to_thread(db_server.stop)
        try:
            await trigger.open_state()
            await trigger.emit({"n": 1}, watermark=1)  # held: the assets are not claimed
            assert [late.event_figures()[owner].pending for owner in owners] == [1, 1]
            await trigger.cleanup()  # moved away, the claims still not made
        finally:
            await asyncio.to_thread(db_server.start)
        # the triggerer it moved to claims the trigger's owner and the assets' and goes on
        # (its events would need Airflow's metadata DB: only its watermark is written here)
        for owner in owners:
            assert await newer.claim(owner) == 2
        assert await newer.claim(trigger.state_owner) == 1
        await newer.set(trigger.state_owner, trigger.watermark_key, 1)
        await newer.flush()
        await late.flush()
        figures = late.event_figures()
        assert [(figures[o].pending, figures[o].committed, figures[o].refused)
                for o in owners] == [(0, 0, 1), (0, 0, 1)]
        for owner in owners:
            assert await committed_events(url, owner) == []
        # the trigger comes back here: it reads the watermark the other triggerer left, and
        # its claims of the assets carry none of the events it emitted before it left
        back = fan_out(2)
        assert await back.get_watermark(default=0) == 1
        for owner in owners:
            assert await late.claim(owner) == 3
        await late.flush()
        for owner in owners:
            assert await committed_events(url, owner) == []
        assert [late.event_figures()[o].pending for o in owners] == [0, 0]
        await back.cleanup()
    finally:
        await late.close()
        await newer.close()
