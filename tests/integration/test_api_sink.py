"""`sink = api`: the batched endpoints (/api/v1/flush, /read, /write) and `ApiSink`, on every
central backend.

The endpoint tests run the real app through httpx's ASGI transport with the real `ApiSink`
as the client; the store tests go through a real `localstate serve` subprocess.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import pytest_asyncio
from api_server import DAG_TOKEN, RO_TOKEN, RW_TOKEN, TOKENS, ServeProcess
from conftest import StoreFactory
from raw_http import answer_while_sending
from sqlalchemy import select

from localstate import Settings, StateStore
from localstate._core.config import max_batch_body
from localstate._core.conflicts import PolicyMap
from localstate._core.protocol import (
    WireError,
    decode_body,
    decode_outcomes,
    decode_rows,
    encode_body,
    encode_outcomes,
    encode_rows,
    field_header,
)
from localstate._core.rows import CentralRow, DirtyRow, FlushOutcome
from localstate._sync.central.central_store import CentralStore
from localstate._sync.sinks.api_sink import ApiSink
from localstate._sync.sinks.sink import FleetReporting
from localstate.api import create_app
from localstate.api._auth import Principal
from localstate.errors import (
    AccessDenied,
    ConfigError,
    InvalidInput,
    OwnerLost,
    ValueTooLarge,
    VersionConflict,
)

WRITER = "cache-file-a"


class Endpoint:
    """The app (its lifespan running) and an `ApiSink` per token over the ASGI transport."""

    def __init__(self, app: Any, central: CentralStore) -> None:
        self.app = app
        self.central = central
        self.sinks: list[ApiSink] = []

    def sink(self, token: str | None = RW_TOKEN) -> ApiSink:
        s = ApiSink("http://localstate.test", token, transport=httpx.ASGITransport(app=self.app))
        self.sinks.append(s)
        return s

    async def value(self, owner: str, key: str) -> tuple[Any, int] | None:
        row = (await self.central.read_many([(owner, key)])).get((owner, key))
        return None if row is None or row.data is None else (orjson.loads(row.data),
                                                             row.version)


#: RW_TOKEN's name (the first of TOKENS): what the server records as its writes' updated_by
RW_NAME = "token 1"


def tagged(writer: str, identity: str = RW_NAME) -> str | None:
    """The writer id the server records for `writer` sent with a token of `identity`."""
    return Principal(identity, True, ("",), identity).writer_tag(writer)


@pytest_asyncio.fixture
async def endpoint(open_store: StoreFactory, central_url: str) -> AsyncIterator[Endpoint]:
    store = await open_store(triggerer_id="api-server")
    tokens = Settings.resolve({"api_tokens": TOKENS}).api_tokens
    central = await CentralStore.open(central_url)
    app = create_app(store.settings, tokens=tokens)
    ep = Endpoint(app, central)
    try:
        async with app.router.lifespan_context(app):
            yield ep
            for s in ep.sinks:
                await s.close()
    finally:
        await central.close()


def dirty(owner: str, key: str, value: Any, version: int, base: int,
          by: str = "triggerer-a") -> DirtyRow:
    return DirtyRow(owner, key, orjson.dumps(value).decode(), version, base, time.time(), by)


async def test_an_event_the_server_refuses_is_dropped_not_stuck(
    open_store: StoreFactory, central_url: str, tmp_path: Path,
) -> None:
    """The API server's max_value_bytes is below the triggerer's: its refusal of one event
    never blocks the outbox. The others (and the watermark) commit, the refused one is
    dropped and counted."""
    from localstate._sync.central.schema import event

    server_store = await open_store(triggerer_id="api-server", max_value_bytes=1024)
    tokens = Settings.resolve({"api_tokens": TOKENS}).api_tokens
    app = create_app(server_store.settings, tokens=tokens)
    async with app.router.lifespan_context(app):
        sink = ApiSink("http://localstate.test", RW_TOKEN,
                       transport=httpx.ASGITransport(app=app))
        store = await StateStore.open(cache_path=tmp_path / "t.db", sink=sink,
                                      flush_interval=60, triggerer_id="t")
        try:
            for i in range(1, 7):
                payload = {"blob": "x" * 2000} if i == 4 else {"n": i}
                await store.emit("trigger:t", payload, watermark=i)
            await store.flush()
            stats = store.stats()
            assert (stats.events_committed, stats.events_rejected, stats.events_pending) == (
                5, 1, 0)
            await store.emit("trigger:t", {"n": 7}, watermark=7)
            await store.flush()
            assert store.stats().events_committed == 6
        finally:
            await store.close()
            await sink.close()
    async with CentralStore.open(central_url) as central:
        keys = [k for (k,) in await central.run_read(
            select(event.c.key).where(event.c.owner == "trigger:t"), "read")]
        row = (await central.read_many([("trigger:t", "watermark")]))[("trigger:t", "watermark")]
    assert sorted(map(int, keys)) == [1, 2, 3, 5, 6, 7]
    assert row.data == "7"


# -- the flush endpoint ------------------------------------------------------------------


async def test_events_ride_a_flush_in_its_transaction_and_are_checked(
    endpoint: Endpoint,
) -> None:
    """`ApiSink.write_with_events`: the rows and the events in one request (one transaction of
    the server: `CentralStore.write_with_events`); a replay is all duplicates; a token that
    may not write an event's owner, or a malformed event, is refused whole (nothing written);
    the REST status counts them."""
    from localstate._core.rows import EventRow

    sink = endpoint.sink()
    rows = [dirty("dag:etl", "watermark", 3, 1, 0)]
    events = [EventRow(i, "dag:etl", str(i), orjson.dumps({"n": i}).decode(), time.time())
              for i in range(1, 4)]
    outcomes, statuses = await sink.write_with_events(rows, events, PolicyMap("reject"),
                                                      writer=WRITER)
    assert [o.resolution for o in outcomes] == ["written"]
    assert statuses == ["committed"] * 3
    _o, again = await sink.write_with_events(rows, events, PolicyMap("reject"), writer=WRITER)
    assert again == ["duplicate"] * 3
    with pytest.raises(AccessDenied):  # the dag: token may not write a trigger's events
        await endpoint.sink(DAG_TOKEN).write_with_events(
            [], [EventRow(9, "trigger:other", "9", "1", time.time())], PolicyMap("reject"))
    with pytest.raises(InvalidInput):  # a payload that is not JSON text
        await sink.write_with_events(
            [], [EventRow(10, "dag:etl", "10", "{nope", time.time())], PolicyMap("reject"))
    _o, fresh = await sink.write_with_events(
        [], [EventRow(10, "dag:etl", "10", "1", time.time())], PolicyMap("reject"))
    assert fresh == ["committed"]  # the refused batches left nothing behind
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=endpoint.app),
                                 base_url="http://localstate.test") as client:
        status = (await client.get("/api/v1/status",
                                   headers={"Authorization": f"Bearer {RW_TOKEN}"})).json()
    assert status["events_committed"] == 4



async def test_a_batch_is_written_in_one_transaction(endpoint: Endpoint) -> None:
    sink = endpoint.sink()
    rows = [dirty("trigger:t", f"k{i}", {"wm": i}, 1, 0) for i in range(500)]
    before = endpoint.central.transactions
    outcomes = await sink.write_batch(rows, PolicyMap("reject"), writer=WRITER)
    assert [o.resolution for o in outcomes] == ["written"] * 500
    assert {o.row for o in outcomes} == set(rows)  # the client's own rows, by index
    assert all(o.central is not None and o.central.version == 1 for o in outcomes)
    assert sink.transactions == 1
    assert sink.rows_written == 500
    assert endpoint.central.transactions == before  # the test's reader wrote nothing
    assert await endpoint.value("trigger:t", "k499") == ({"wm": 499}, 1)
    # the writer travelled: the next flush on these rows is this file's own chain
    again = [dirty("trigger:t", f"k{i}", i, 2, 1) for i in range(500)]
    outcomes = await sink.write_batch(again, PolicyMap("reject"), writer=WRITER)
    assert {(o.resolution, o.conflict) for o in outcomes} == {("written", False)}
    row = (await endpoint.central.read_many([("trigger:t", "k7")]))[("trigger:t", "k7")]
    assert row.writer == tagged(WRITER)  # the file's id, bound to the caller's token
    assert row.version == 2


@pytest.mark.parametrize(("policy", "local", "resolution", "central_value"), [
    ("reject", 5, "adopted", 9),
    ("last_writer_wins", 5, "written", 5),
    ("max", 5, "adopted", 9),
    ("max", 12, "written", 12),
])
async def test_conflicts_are_settled_by_the_clients_policy(
        endpoint: Endpoint, policy: str, local: int, resolution: str, central_value: int,
) -> None:
    other = endpoint.sink()
    await other.write_batch([dirty("asset_watcher:o", "wm", 9, 1, 0, by="other")],
                            PolicyMap("reject"), writer="cache-file-other")
    # based on version 0: another writer's version 1 is there now
    row = dirty("asset_watcher:o", "wm", local, 1, 0)
    [outcome] = await endpoint.sink().write_batch([row], PolicyMap(policy), writer=WRITER)
    assert outcome.row is row
    assert outcome.resolution == resolution
    assert outcome.conflict
    assert outcome.policy == policy
    assert outcome.central is not None
    assert orjson.loads(outcome.central.data or "") == (
        central_value)
    if resolution == "written":  # the record the local write replaced travels back too
        assert outcome.replaced is not None
        # a token shared by a fleet (no identity bound): its rows name the token, not the
        # triggerer the request gives (the server decides who wrote)
        assert outcome.replaced.updated_by == RW_NAME
        assert outcome.replaced.writer == tagged("cache-file-other")
    stored = await endpoint.value("asset_watcher:o", "wm")
    assert stored is not None
    assert stored[0] == central_value


async def test_owner_specific_policies_travel_as_the_setting_gives_them(
        endpoint: Endpoint) -> None:
    await endpoint.sink().write_batch(
        [dirty("asset_watcher:o", "wm", 9, 1, 0, by="other"),
         dirty("dag:d", "c", 9, 1, 0, by="other")], PolicyMap("reject"), writer="other-file")
    policies = PolicyMap({"asset_watcher:*": "max:int", "*": "last_writer_wins"})
    outcomes = await endpoint.sink().write_batch(
        [dirty("asset_watcher:o", "wm", 3, 1, 0), dirty("dag:d", "c", 3, 1, 0)], policies,
        writer=WRITER)
    by_owner = {o.row.owner: o for o in outcomes}
    assert by_owner["asset_watcher:o"].resolution == "adopted"  # max: 3 < 9
    assert by_owner["asset_watcher:o"].policy == "max:int"
    assert by_owner["dag:d"].resolution == "written"  # last_writer_wins
    assert await endpoint.value("asset_watcher:o", "wm") == (9, 1)
    assert await endpoint.value("dag:d", "c") == (3, 2)


async def test_tokens_are_checked_and_nothing_is_half_written(endpoint: Endpoint) -> None:
    rows = [dirty("dag:d", "a", 1, 1, 0), dirty("asset_watcher:x", "b", 2, 1, 0)]
    with pytest.raises(AccessDenied) as no_token:
        await endpoint.sink(None).write_batch(rows, PolicyMap(), writer=WRITER)
    assert no_token.value.status == 401
    assert "api_token" in str(no_token.value)
    with pytest.raises(AccessDenied) as wrong:
        await endpoint.sink("not-a-token-0123456789").write_batch(rows, PolicyMap())
    assert wrong.value.status == 401
    # a token for dag: only: one row outside it refuses the whole batch
    with pytest.raises(AccessDenied) as outside:
        await endpoint.sink(DAG_TOKEN).write_batch(rows, PolicyMap(), writer=WRITER)
    assert outside.value.status == 403
    assert "asset_watcher:x" in str(outside.value)
    with pytest.raises(AccessDenied) as read_only:
        await endpoint.sink(RO_TOKEN).write_batch(rows[:1], PolicyMap(), writer=WRITER)
    assert read_only.value.status == 403
    # a bad row anywhere in the batch: 4xx, and no row written
    bad = DirtyRow("dag:d", "c", "{not json", 1, 0, time.time(), "t")
    with pytest.raises(InvalidInput):
        await endpoint.sink().write_batch([rows[0], bad], PolicyMap(), writer=WRITER)
    big = DirtyRow("dag:d", "c", '"' + "x" * 70_000 + '"', 1, 0, time.time(), "t")
    with pytest.raises(ValueTooLarge):
        await endpoint.sink().write_batch([rows[0], big], PolicyMap(), writer=WRITER)
    with pytest.raises(InvalidInput):  # the same key twice
        await endpoint.sink().write_batch([rows[0], rows[0]._replace(version=2)], PolicyMap())
    assert await endpoint.value("dag:d", "a") is None
    assert await endpoint.value("asset_watcher:x", "b") is None
    # the dag token may write its own owners, and read them back
    await endpoint.sink(DAG_TOKEN).write_batch(rows[:1], PolicyMap(), writer=WRITER)
    assert set(await endpoint.sink(DAG_TOKEN).read_many([("dag:d", "a")])) == {("dag:d", "a")}
    with pytest.raises(AccessDenied):
        await endpoint.sink(DAG_TOKEN).read_many([("dag:d", "a"), ("asset_watcher:x", "b")])


async def test_hostile_bodies_get_a_4xx_and_write_nothing(endpoint: Endpoint) -> None:
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=endpoint.app),
                               base_url="http://t", headers={"Authorization":
                                                             f"Bearer {RW_TOKEN}"})
    header = field_header(DirtyRow)
    good = ["dag:d", "k", "1", 1, 0, 1.0, "t"]
    bodies: list[Any] = [
        b"not json", b"[]", {"rows": [good]}, {"fields": header, "rows": "x"},
        {"fields": header, "rows": [good[:-1]]},
        {"fields": header, "rows": [["dag:d", "k", 1, 1, 0, 1.0, "t"]]},  # data not text
        {"fields": header, "rows": [["dag:d", "k", "1", True, 0, 1.0, "t"]]},
        {"fields": header, "rows": [["dag:d", "k", "1", 0, 0, 1.0, "t"]]},
        {"fields": header, "rows": [["", "k", "1", 1, 0, 1.0, "t"]]},
        {"fields": header, "rows": [good], "policies": "maximum"},
        {"fields": header, "rows": [good], "policies": {"*": 3}},
        {"fields": header, "rows": [good], "writer": 5},
        {"fields": {"DirtyRow": [*header["DirtyRow"], "epoch"]}, "rows": [[*good, 1]]},
    ]
    contents = [b if isinstance(b, bytes) else orjson.dumps(b) for b in bodies]
    nan = orjson.dumps({"fields": header, "rows": [["dag:d", "k", "1", 1, 0, None, "t"]]})
    contents.append(nan.replace(b"null", b"NaN"))
    async with client:
        for content in contents:
            r = await client.post("/api/v1/flush", content=content)
            assert 400 <= r.status_code < 500, (content, r.status_code, r.text)
            assert r.json()["error"], r.text
    assert await endpoint.value("dag:d", "k") is None


# -- reads and direct writes -------------------------------------------------------------


async def test_reads_and_direct_writes(endpoint: Endpoint) -> None:
    sink = endpoint.sink()
    assert await sink.read_many([]) == {}
    row = await sink.write_direct("dag:d", "k", "1", updated_at=time.time(), updated_by="t")
    assert row.version == 1
    row = await sink.write_if_version("dag:d", "k", "2", 1, updated_by="t")
    assert row.version == 2
    assert row.data == "2"
    with pytest.raises(VersionConflict) as conflict:
        await sink.write_if_version("dag:d", "k", "3", 1, updated_by="t")
    assert (conflict.value.expected, conflict.value.actual) == (1, 2)
    with pytest.raises(InvalidInput):
        await sink.write_if_version("dag:d", "k", "3", 2**70, updated_by="t")
    await sink.write_direct("dag:d", "k2", "[1]", updated_at=time.time(), updated_by="t")
    found = await sink.read_many([("dag:d", "k"), ("dag:d", "k2"), ("dag:d", "none")])
    assert {k: r.data for k, r in found.items()} == {("dag:d", "k"): "2", ("dag:d", "k2"): "[1]"}
    assert await sink.delete_current("dag:d", "k2", updated_by="t") is True
    assert await sink.delete_current("dag:d", "k2", updated_by="t") is False
    rows = await sink.read_owner("dag:d")
    assert {(r.key, r.data) for r in rows} == {("k", "2"), ("k2", None)}  # the tombstone too


async def test_an_api_url_that_is_not_a_localstate_api_is_a_config_error() -> None:
    async def not_found(request: httpx.Request) -> httpx.Response:
        return httpx.Response(404, text="<html>not here</html>")

    sink = ApiSink("http://elsewhere.test", RW_TOKEN, transport=httpx.MockTransport(not_found))
    with pytest.raises(ConfigError, match="api_url"):
        await sink.read_many([("dag:d", "k")])
    await sink.close()


def test_the_wire_maps_fields_by_name_and_refuses_unknown_ones() -> None:
    row = CentralRow("o", "k", "1", 3, 1.5, "t", "w")
    sent = {"CentralRow": ["key", "owner", "version", "data", "updated_at", "updated_by"]}
    # another order, and a field with a default left out: it takes the default
    [back] = decode_rows(CentralRow, sent, [["k", "o", 3, "1", 1.5, "t"]])
    assert back == row._replace(writer=None)
    body = decode_body(encode_body({"fields": field_header(CentralRow),
                                    "rows": encode_rows([row])}))
    assert decode_rows(CentralRow, body["fields"], body["rows"]) == [row]
    with pytest.raises(WireError, match="epoch"):
        decode_rows(CentralRow, {"CentralRow": [*CentralRow._fields, "epoch"]},
                    [[*row, 7]])
    with pytest.raises(WireError, match="owner"):
        decode_rows(CentralRow, {"CentralRow": ["key", "data", "version", "updated_at",
                                                "updated_by"]}, [["k", "1", 3, 1.5, "t"]])


# -- a store through a real `localstate serve` ---------------------------------------------


@pytest.fixture
def server(central_url: str) -> Iterator[ServeProcess]:
    proc = ServeProcess(central_url)
    proc.start()
    yield proc
    proc.stop()


def api_store(server: ServeProcess, tmp_path: Path, name: str, **options: Any) -> StateStore:
    options.setdefault("flush_interval", 60.0)
    return StateStore(sink="api", api_url=server.url, api_token=RW_TOKEN,
                      triggerer_id=name, cache_path=tmp_path / f"{name}.db", **options)


async def test_a_store_flushes_and_reads_through_the_server(
        server: ServeProcess, central_url: str, tmp_path: Path) -> None:
    async with api_store(server, tmp_path, "a") as a, api_store(server, tmp_path, "b") as b:
        await asyncio.gather(*(a.set("trigger:t", f"k{i}", i) for i in range(1000)))
        report = await a.flush()
        assert report.written == 1000
        assert report.transactions == 1
        assert a.stats().central_transactions == 1
        # b reads a's writes through (misses batched), and central durability waits for them
        assert await b.get("trigger:t", "k999") == 999
        assert await b.get_many("trigger:t", ["k1", "k2", "nope"]) == {"k1": 1, "k2": 2}
        assert await b.load("trigger:t") == 1000
        version = await b.set("trigger:t", "k1", 100, durability="central")
        assert version == 2
        # a's stale write of k1 meets b's at the fence: reject keeps b's, and says so
        await a.set("trigger:t", "k1", -1)
        report = await a.flush()
        assert report.conflicts == 1
        assert await a.get("trigger:t", "k1") == 100
    async with CentralStore.open(central_url) as central:
        rows = await central.read_many([("trigger:t", "k1"), ("trigger:t", "k500")])
    assert rows[("trigger:t", "k1")].data == "100"
    assert rows[("trigger:t", "k500")].data == "500"


async def test_with_the_cache_off_every_call_is_one_request(
        server: ServeProcess, tmp_path: Path) -> None:
    async with api_store(server, tmp_path, "d", enabled=False) as d:
        assert await d.set("dag:x", "c", 1) == 1
        assert await d.compare_and_set("dag:x", "c", 2, expected_version=1) == 2
        with pytest.raises(VersionConflict):
            await d.compare_and_set("dag:x", "c", 3, expected_version=1)
        assert await d.get("dag:x", "c") == 2
        assert await d.delete("dag:x", "c") is True
        assert await d.get("dag:x", "c", default="gone") == "gone"
        assert [r.key async for r in d.items("dag:x")] == []


async def test_a_token_outside_the_owner_is_refused_naming_the_setting(
        server: ServeProcess, tmp_path: Path) -> None:
    async with StateStore(sink="api", api_url=server.url, api_token=DAG_TOKEN,
                          triggerer_id="e", cache_path=tmp_path / "e.db",
                          flush_interval=60.0) as e:
        # a first write reads the key through first: refused, nothing written
        with pytest.raises(AccessDenied, match="api_token") as refused:
            await e.set("asset_watcher:o", "wm", 1)
        assert refused.value.status == 403
        with pytest.raises(AccessDenied):  # a read as well
            await e.get("asset_watcher:o", "wm")
        await e.set("dag:ok", "c", 1, durability="central")  # its own owners go through
        assert await e.read_committed("dag:ok", "c") is not None


def test_sink_api_needs_api_url(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="api_url"):
        asyncio.run(StateStore.open(sink="api", cache_path=tmp_path / "x.db"))
    with pytest.raises(ConfigError, match="api_url"):
        Settings.resolve({"api_url": "ftp://x"})


def test_outcomes_round_trip_plain_writes_compact_the_rest_in_full() -> None:
    rows = [DirtyRow("o", f"k{i}", str(i), i + 2, i + 1, 1.5, "t") for i in range(6)]

    def written(r: DirtyRow, **changes: Any) -> FlushOutcome:
        central = CentralRow(r.owner, r.key, r.data, r.version, r.updated_at, r.updated_by)
        return FlushOutcome(r, "written", central._replace(**changes), False, "reject")

    other = CentralRow("o", "k2", "9", 9, 2.0, "x", "file-x")
    outcomes = [
        written(rows[0]), written(rows[1], version=99),  # both plain: compact
        FlushOutcome(rows[2], "adopted", other, True, "max"),
        FlushOutcome(rows[3], "written", written(rows[3]).central, True, "last_writer_wins",
                     other),
        FlushOutcome(rows[4], "retry", None, True, "reject"),
        written(rows[5], writer="file-a"),  # a central field the row lacks: in full
    ]
    compact, full = encode_outcomes(outcomes, rows)
    assert [c[0] for c in compact] == [0, 1]
    assert len(full) == 4
    body = decode_body(encode_body({"fields": field_header(FlushOutcome, CentralRow),
                                    "written": compact, "outcomes": full}))
    back = decode_outcomes(body["fields"], body["written"], body["outcomes"], rows)
    assert sorted(back, key=lambda o: o.row.key) == outcomes
    assert all(b.row is r for b, r in zip(sorted(back, key=lambda o: o.row.key), rows,
                                          strict=True))
    with pytest.raises(WireError):  # an index outside the request's rows
        decode_outcomes(body["fields"], [[6, 1, "reject"]], [], rows)


async def test_claims_and_the_fleet_table_work_through_the_server(
        server: ServeProcess, central_url: str, tmp_path: Path) -> None:
    # a trigger moved from a to b: b claims its owner through the API; a, now a zombie, has
    # its next flush refused there and learns it lost the owner
    async with api_store(server, tmp_path, "a") as a, api_store(server, tmp_path, "b") as b:
        assert a.can_claim
        assert b.can_claim
        assert await a.claim("trigger:t") == 1
        await a.set("trigger:t", "wm", 10)
        await a.flush()
        assert await b.claim("trigger:t") == 2
        assert await b.get("trigger:t", "wm") == 10  # the claim refreshed the owner's keys
        await b.set("trigger:t", "wm", 11)
        await a.set("trigger:t", "wm", 99)  # the zombie writes on
        await b.flush()
        await a.flush()
        assert a.claims_refused == 1
        with pytest.raises(OwnerLost):
            await a.set("trigger:t", "wm", 100)
        assert await a.get("trigger:t", "wm") == 11  # it took the owner's record
        # a late conditional claim (a trigger that started before b's claim) is refused too
        with pytest.raises(OwnerLost):
            await a.claim("trigger:t", unless_claimed_since=time.time() - 3600)
        # each flush recorded its triggerer in the server's fleet table, in its transaction
        sink = b.sink
        assert isinstance(sink, FleetReporting)
        names = {r.triggerer for r in await sink.read_fleet()}
        assert names == {"a", "b"}
    async with CentralStore.open(central_url) as central:
        row = (await central.read_many([("trigger:t", "wm")]))[("trigger:t", "wm")]
        claims = await central.read_claims(["trigger:t"])
    assert row.data == "11"
    assert claims == {"trigger:t": (2, RW_NAME)}  # the token that claimed, not the request


async def test_a_triggerer_stopped_mid_request_holds_no_lock_in_the_server(
        server: ServeProcess, tmp_path: Path) -> None:
    # the server reads a whole flush request before it opens its transaction: a triggerer
    # frozen while sending one (half a body sent, the rest never) holds no row lock there
    owners = [f"trigger:m{i}" for i in range(30)]
    async with api_store(server, tmp_path, "a") as a, api_store(server, tmp_path, "b") as b:
        for owner in owners:
            assert await a.claim(owner) == 1
            await a.set(owner, "wm", 1)
        await a.flush()
        _reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        try:
            writer.write(
                b"POST /api/v1/flush HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                b"Authorization: Bearer " + RW_TOKEN.encode() + b"\r\n"
                b"Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n"
                + b'{"rows": [' + b" " * 1000)
            await writer.drain()
            started = time.monotonic()
            epochs = await asyncio.wait_for(asyncio.gather(*(b.claim(o) for o in owners)), 30)
            took = time.monotonic() - started
        finally:
            writer.close()
        assert epochs == [2] * len(owners)
        assert took < 5.0, took  # nothing to wait for (a lock would hold them the whole test)
        await b.set(owners[0], "wm", 2)
        await b.flush()
        assert await b.read_committed(owners[0], "wm") is not None


# -- the body limit ---------------------------------------------------------------------------

#: a server that takes 10 rows of values up to 1,000 bytes: its body limit is what 10 such rows
#: can need, max_batch_body(10, 1000) bytes
SMALL_LIMITS = {"api_max_batch_rows": "10", "max_value_bytes": "1000"}


@pytest.fixture
def small_server(central_url: str) -> Iterator[ServeProcess]:
    proc = ServeProcess(central_url, settings=SMALL_LIMITS)
    proc.start()
    yield proc
    proc.stop()


def _flush_head(token: str, *headers: bytes) -> bytes:
    return (b"POST /api/v1/flush HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Authorization: Bearer " + token.encode() + b"\r\n"
            b"Content-Type: application/json\r\n" + b"".join(h + b"\r\n" for h in headers)
            + b"\r\n")


def _json_of(answer: bytes) -> dict[str, Any]:
    status_line, _, rest = answer.partition(b"\r\n")
    assert b" 413 " in status_line, answer[:300]
    body = rest.split(b"\r\n\r\n", 1)[1]
    parsed: dict[str, Any] = orjson.loads(body)
    return parsed


async def test_a_flush_body_over_what_the_row_limit_needs_is_refused_before_it_is_read(
        small_server: ServeProcess, tmp_path: Path) -> None:
    limit = max_batch_body(10, 1000)
    # declared: 413 at the headers, after one part of the 100 the length announces
    answer = await answer_while_sending(
        small_server.port, _flush_head(RW_TOKEN, b"Content-Length: %d" % (100 * 65536)),
        iter([b'{"rows": [' + b" " * 65526] + [b" " * 65536] * 99))
    body = _json_of(answer)
    assert body["error"] == "too_large"
    assert body["detail"] == {"limit": limit, "setting": "api_max_request_bytes"}
    assert f"api_max_request_bytes ({limit} bytes)" in body["message"]
    # chunked (no length): counted as it comes, refused once past the limit, never finished
    chunk = b"%x\r\n%s\r\n" % (16384, b" " * 16384)
    answer = await answer_while_sending(
        small_server.port, _flush_head(RW_TOKEN, b"Transfer-Encoding: chunked"),
        iter([b"a\r\n{\"rows\": [\r\n"] + [chunk] * 100))
    assert _json_of(answer)["detail"]["limit"] == limit
    # the largest batch a client sends this server is within it: ten rows of the largest
    # values (backslashes: each one is two bytes in the body), in one request
    async with api_store(small_server, tmp_path, "a", max_value_bytes=1000) as a:
        big = "\\" * 497  # JSON text of 996 bytes
        for i in range(10):
            await a.set("trigger:big", f"k{i}", big)
        report = await a.flush()
        assert (report.written, report.transactions) == (10, 1)
        assert await a.read_committed("trigger:big", "k9") is not None
