"""A key whose version reached 2^63 - 1 (the largest its BIGINT column holds; only a row
written outside localstate gets there): every write and deletion of it is a typed
`VersionExhausted` (REST 409 ``version_exhausted``, raised again by the REST client and by
``sink = api``), never a driver error or a 502, and nothing is written; other keys are
untouched. On each central backend, through the central store, the REST API and the sink."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import httpx
import pytest
import pytest_asyncio
from api_paths import path
from conftest import StoreFactory
from sqlalchemy import update
from test_api import client_for

from localstate._core.model import MAX_VERSION
from localstate._core.protocol import error_for
from localstate._core.rows import CentralRow
from localstate._sync.central.central_store import CentralStore
from localstate._sync.central.schema import state_variable
from localstate._sync.sinks.api_sink import ApiSink
from localstate.api import create_app
from localstate.errors import VersionExhausted

OWNER = "dag:ceiling"


async def _at_ceiling(central: CentralStore, key: str, data: str | None) -> CentralRow:
    """`key` of OWNER holding `data` (None: a tombstone) at version 2^63 - 1."""
    await central.write_direct(OWNER, key, "1", updated_at=time.time(), updated_by="seed")
    t = state_variable.c
    await central.run_write(update(state_variable).where(t.owner == OWNER, t.key == key)
                            .values(version=MAX_VERSION, value=data), "seed the ceiling")
    row = (await central.read_many([(OWNER, key)]))[(OWNER, key)]
    assert (row.version, row.data) == (MAX_VERSION, data)
    return row


@pytest_asyncio.fixture
async def central(central_url: str) -> AsyncIterator[CentralStore]:
    async with CentralStore.open(central_url) as c:
        yield c


async def test_the_central_store_refuses_every_write_at_the_ceiling(
        central: CentralStore) -> None:
    before = await _at_ceiling(central, "full", "41")
    await _at_ceiling(central, "deleted", None)
    attempts = {
        "direct": central.write_direct(OWNER, "full", "42", updated_at=time.time(),
                                       updated_by="t"),
        "if_version": central.write_if_version(OWNER, "full", "42", MAX_VERSION,
                                               updated_by="t"),
        "delete": central.delete_current(OWNER, "full", updated_by="t"),
        "direct on a tombstone": central.write_direct(OWNER, "deleted", "1",
                                                      updated_at=time.time(), updated_by="t"),
        "if absent, on a tombstone": central.write_if_version(OWNER, "deleted", "1", 0,
                                                              updated_by="t"),
    }
    for name, attempt in attempts.items():
        with pytest.raises(VersionExhausted, match=r"2\^63 - 1.*new key") as got:
            await attempt
        assert got.value.owner == OWNER, name
        assert got.value.key == ("deleted" if "tombstone" in name else "full"), name
    assert (await central.read_many([(OWNER, "full")]))[(OWNER, "full")] == before
    # another key writes as ever: the ceiling is this key's alone
    assert (await central.write_direct(OWNER, "other", "1", updated_at=time.time(),
                                       updated_by="t")).version == 1


async def test_the_api_answers_409_version_exhausted_and_the_clients_raise_it(
        open_store: StoreFactory, central: CentralStore) -> None:
    before = await _at_ceiling(central, "full", "41")
    store = await open_store(triggerer_id="api-server")
    app = create_app(store.settings, local=store)
    async with client_for(app) as client:
        answers = [
            await client.put(path(OWNER, "full"), json={"value": 42}),
            await client.put(path(OWNER, "full"),
                             json={"value": 42, "expected_version": MAX_VERSION}),
            await client.delete(path(OWNER, "full")),
            await client.delete(path(OWNER, "full") + f"?expected_version={MAX_VERSION}"),
            *[await client.post("/api/v1/write", json={
                "owner": OWNER, "key": "full", "data": "42", "updated_at": time.time(),
                "updated_by": "t", **extra}) for extra in (
                {"op": "direct"}, {"op": "if_version", "expected_version": MAX_VERSION},
                {"op": "delete_current"})],
        ]
        for r in answers:
            assert r.status_code == 409, (r.request.method, r.request.url, r.text)
            body = r.json()
            assert body["error"] == "version_exhausted"
            assert body["detail"] == {"owner": OWNER, "key": "full"}
            assert "new key" in body["message"]  # what to do next
            assert "bigint" not in r.text.lower()
            assert "out of range" not in r.text
            raised = error_for(r)
            assert isinstance(raised, VersionExhausted)
            assert (raised.owner, raised.key) == (OWNER, "full")
        # sink = api: the triggerer's cache-off writes raise it too (not a retried 502)
        sink = ApiSink("http://localstate.test", None,
                       transport=httpx.ASGITransport(app=app))
        try:
            with pytest.raises(VersionExhausted):
                await sink.write_direct(OWNER, "full", "42", updated_at=time.time(),
                                        updated_by="t")
            with pytest.raises(VersionExhausted):
                await sink.delete_current(OWNER, "full", updated_by="t")
        finally:
            await sink.close()
    assert (await central.read_many([(OWNER, "full")]))[(OWNER, "full")] == before


@pytest.mark.parametrize("durability", ["local", "central"])
async def test_a_store_refuses_to_write_past_the_ceiling_and_stays_usable(
        open_store: StoreFactory, central: CentralStore, durability: str) -> None:
    """The store's own writes stop one below the ceiling (the largest version a flush may
    carry): a set or delete of the key is `VersionExhausted` at once (not a cache writer
    that cannot commit it), and the store goes on with every other key."""
    before = await _at_ceiling(central, "full", "41")
    store = await open_store(durability=durability)
    assert await store.get(OWNER, "full") == 41
    with pytest.raises(VersionExhausted, match="new key"):
        await store.set(OWNER, "full", 42)
    with pytest.raises(VersionExhausted):
        await store.delete(OWNER, "full")
    await store.set(OWNER, "other", 1)
    await store.flush()
    assert await store.get(OWNER, "full") == 41
    found = await central.read_many([(OWNER, "full"), (OWNER, "other")])
    assert found[(OWNER, "full")] == before
    assert found[(OWNER, "other")].data == "1"
