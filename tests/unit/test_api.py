"""The REST API through the real app (httpx's ASGI transport), on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import pytest_asyncio
from api_paths import path
from conftest import StoreFactory, collations
from fastapi import FastAPI

from localstate import Settings, StateStore
from localstate._core.protocol import encode_body, encode_rows, field_header
from localstate._core.rows import DirtyRow
from localstate._sync.central.central_store import CentralStore
from localstate._sync.central.engine import make_engine
from localstate.api import create_app
from localstate.api._context import RateMeter

RW_ALL = "rw-all-0123456789abcdef"
RW_DAG = "rw-dag-0123456789abcdef"
RO_ALL = "ro-all-0123456789abcdef"
RO_ASSET = "ro-asset-0123456789abcdef"
TOKENS = (f"{RW_ALL}:read-write:*, {RW_DAG}:read-write:dag:, {RO_ALL}:read:*, "
          f"{RO_ASSET}:read:asset_watcher:")


def auth(token: str = RW_ALL) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@dataclass
class Api:
    client: httpx.AsyncClient
    store: StateStore
    central: CentralStore
    open_store: StoreFactory


@asynccontextmanager
async def client_for(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    """A client of `app`, with the app's lifespan run around it as an ASGI server runs it."""
    async with app.router.lifespan_context(app), httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://localstate.test"
    ) as client:
        yield client


@pytest_asyncio.fixture
async def api(open_store: StoreFactory, central_url: str) -> AsyncIterator[Api]:
    store = await open_store(triggerer_id="api-server")
    tokens = Settings.resolve({"api_tokens": TOKENS}).api_tokens
    central = await CentralStore.open(central_url)
    try:
        async with client_for(create_app(store.settings, local=store, tokens=tokens)) as client:
            yield Api(client, store, central, open_store)
    finally:
        await central.close()


async def central_value(api: Api, owner: str, key: str) -> tuple[Any, int] | None:
    """(value, version) as the central DB holds it, read apart from the app."""
    import orjson

    row = (await api.central.read_many([(owner, key)])).get((owner, key))
    if row is None or row.data is None:
        return None
    return orjson.loads(row.data), row.version


# -- one state variable ----------------------------------------------------------------


NAMES = [
    ("dag:etl/load", "cursor"),  # ':' and '/' in the owner
    ("asset_watcher:orders", "part/2 of 5"),  # '/' and spaces in the key
    ("trigger:a.b.C:9f%3A", "100% €"),  # '%' itself, non-ASCII
    ("..", "."),  # dot segments, which only encoding keeps from being resolved away
]


@pytest.mark.parametrize(("owner", "key"), NAMES)
async def test_put_get_delete_round_trip_with_names_that_need_encoding(
    api: Api, owner: str, key: str
) -> None:
    url = path(owner, key).replace(".", "%2E")
    r = await api.client.put(url, json={"value": {"offset": 10}}, headers=auth())
    assert r.status_code == 200, r.text
    body = r.json()
    assert (body["owner"], body["key"], body["value"], body["version"]) == (
        owner, key, {"offset": 10}, 1)
    assert body["updated_by"] == "token 1"  # the caller's token, named by the server
    assert body["flush_state"] == "flushed"
    # durability central: the central DB holds it when the PUT answers
    assert await central_value(api, owner, key) == ({"offset": 10}, 1)

    r = await api.client.get(url, headers=auth())
    assert r.status_code == 200
    assert r.json()["value"] == {"offset": 10}

    r = await api.client.delete(url, headers=auth())
    assert r.status_code == 204
    assert await central_value(api, owner, key) is None
    r = await api.client.get(url, headers=auth())
    assert r.status_code == 404
    assert r.json()["error"] == "not_found"
    r = await api.client.delete(url, headers=auth())
    assert r.status_code == 404


async def test_a_colon_may_travel_unencoded(api: Api) -> None:
    r = await api.client.put("/api/v1/state/asset_watcher:x/watermark", json={"value": 3},
                             headers=auth())
    assert r.status_code == 200
    assert await central_value(api, "asset_watcher:x", "watermark") == (3, 1)


async def test_expected_version_writes_only_over_that_version(api: Api) -> None:
    url = path("dag:d/t", "watermark")
    r = await api.client.put(url, json={"value": 1, "expected_version": 0}, headers=auth())
    assert r.status_code == 200
    assert r.json()["version"] == 1
    r = await api.client.put(url, json={"value": 2, "expected_version": 0}, headers=auth())
    assert r.status_code == 409
    body = r.json()
    assert body["error"] == "version_conflict"
    assert body["detail"] == {"expected_version": 0, "actual_version": 1}
    r = await api.client.put(url, json={"value": 2, "expected_version": 7}, headers=auth())
    assert r.status_code == 409
    assert await central_value(api, "dag:d/t", "watermark") == (1, 1)  # nothing changed
    r = await api.client.put(url, json={"value": 2, "expected_version": 1}, headers=auth())
    assert r.status_code == 200
    assert r.json()["version"] == 2
    assert await central_value(api, "dag:d/t", "watermark") == (2, 2)


async def test_delete_with_expected_version(api: Api) -> None:
    url = path("dag:d/t", "k")
    await api.client.put(url, json={"value": "a"}, headers=auth())
    r = await api.client.delete(url, params={"expected_version": 5}, headers=auth())
    assert r.status_code == 409
    assert r.json()["detail"]["actual_version"] == 1
    assert await central_value(api, "dag:d/t", "k") == ("a", 1)
    r = await api.client.delete(url, params={"expected_version": 1}, headers=auth())
    assert r.status_code == 204
    assert await central_value(api, "dag:d/t", "k") is None


async def test_writes_see_what_triggerers_flushed_since(api: Api) -> None:
    """The API's expected_version is checked against the central version, not a stale copy."""
    url = path("asset_watcher:orders", "watermark")
    await api.client.put(url, json={"value": 1}, headers=auth())  # the API store holds v1
    triggerer = await api.open_store(triggerer_id="triggerer-a")
    assert await triggerer.get("asset_watcher:orders", "watermark") == 1
    await triggerer.set("asset_watcher:orders", "watermark", 2)
    await triggerer.flush()  # central v2, which the API store has not seen
    r = await api.client.get(url, headers=auth())
    assert r.json()["version"] == 2
    r = await api.client.put(url, json={"value": 40, "expected_version": 2}, headers=auth())
    assert r.status_code == 200, r.text
    assert r.json()["version"] == 3
    # the triggerer, still at v2, writes on: its flush meets the operator's fix, and under
    # the default reject policy it adopts it
    await triggerer.set("asset_watcher:orders", "watermark", 3)
    await triggerer.flush()
    assert await triggerer.get("asset_watcher:orders", "watermark") == 40
    assert await central_value(api, "asset_watcher:orders", "watermark") == (40, 3)


async def test_a_direct_mode_store_serves_conditional_writes_too(
    open_store: StoreFactory, central_url: str
) -> None:
    store = await open_store(triggerer_id="api-direct", enabled=False)
    async with client_for(create_app(store.settings, local=store, tokens=())) as client:
        url = path("dag:x", "k")
        r = await client.put(url, json={"value": 1, "expected_version": 0})
        assert r.status_code == 200
        r = await client.put(url, json={"value": 2, "expected_version": 0})
        assert r.status_code == 409
        r = await client.put(url, json={"value": 2, "expected_version": 1})
        assert (r.status_code, r.json()["version"], r.json()["value"]) == (200, 2, 2)
        r = await client.delete(url, params={"expected_version": 1})
        assert r.status_code == 409
        r = await client.delete(url, params={"expected_version": 2})
        assert r.status_code == 204
        assert (await client.get(url)).status_code == 404


# -- listing -----------------------------------------------------------------------------


async def seed(api: Api, names: list[tuple[str, str]]) -> None:
    writer = await api.open_store(triggerer_id="seeder")
    for n, (owner, key) in enumerate(names):
        await writer.set(owner, key, n)
    await writer.flush()


#: byte-wise order (sorted() on str) is the listing's on every backend, whatever the database's
#: collation: upper case before lower, punctuation by its code
SEEDED = sorted([
    ("asset_watcher:a", "watermark"), ("asset_watcher:b", "watermark"),
    ("asset_watcher:b", "cursor"), ("asset_watcherX", "k"), ("dag:etl/load", "cursor"),
    ("dag:etl/load", "offset"), ("dag:x_y", "k"), ("dag:x%y", "k"), ("dag:x\\y", "k"),
    ("dag:X", "K"), ("dag:X", "k"), ("Asset_watcher:c", "k"), ("trigger:t", "k"),
])


async def list_all(api: Api, token: str = RW_ALL, **params: Any) -> list[tuple[str, str]]:
    seen: list[tuple[str, str]] = []
    cursor: str | None = None
    pages = 0
    while True:
        query = dict(params)
        if cursor is not None:
            query["cursor"] = cursor
        r = await api.client.get("/api/v1/state", params=query, headers=auth(token))
        assert r.status_code == 200, r.text
        body = r.json()
        seen.extend((i["owner"], i["key"]) for i in body["items"])
        cursor = body["next_cursor"]
        pages += 1
        assert pages < 50
        if cursor is None:
            return seen


@collations
@pytest.mark.parametrize("limit", [1, 2, 4, 100])
async def test_list_pages_through_everything_in_order(api: Api, limit: int) -> None:
    await seed(api, SEEDED)
    assert await list_all(api, limit=limit) == SEEDED


async def test_list_pages_are_the_size_asked(api: Api) -> None:
    await seed(api, SEEDED)
    r = await api.client.get("/api/v1/state", params={"limit": 4}, headers=auth())
    body = r.json()
    assert len(body["items"]) == 4
    assert body["next_cursor"]
    r = await api.client.get("/api/v1/state", params={"limit": len(SEEDED)}, headers=auth())
    assert len(r.json()["items"]) == len(SEEDED)
    assert r.json()["next_cursor"] is None


#: owner_prefix -> what it lists: '_', '%' and '\\' are literal, not LIKE wildcards; case counts
PREFIX_CASES = [
    ("asset_watcher:", [k for k in SEEDED if k[0].startswith("asset_watcher:")]),
    ("dag:x_", [("dag:x_y", "k")]), ("dag:x%", [("dag:x%y", "k")]),
    ("dag:x\\", [("dag:x\\y", "k")]), ("%", []), ("_", []), ("\\", []),
    ("Asset", [("Asset_watcher:c", "k")]), ("dag:X", [("dag:X", "K"), ("dag:X", "k")]),
    ("dag:x", [("dag:x%y", "k"), ("dag:x\\y", "k"), ("dag:x_y", "k")]), ("nothing", []),
]


@collations
async def test_list_filters_by_owner_prefix(api: Api) -> None:
    await seed(api, SEEDED)
    for prefix, expected in PREFIX_CASES:
        assert await list_all(api, owner_prefix=prefix, limit=2) == expected, prefix


@collations
async def test_list_shows_the_serving_stores_unflushed_writes_only_when_asked(api: Api) -> None:
    await seed(api, SEEDED)
    store = api.store
    await store.set("dag:etl/load", "cursor", "local", durability="local")  # over central
    await store.set("dag:new", "k", "only here", durability="local")  # not in central yet
    await store.delete("trigger:t", "k", durability="local")  # a local tombstone

    async def listed(**params: Any) -> dict[tuple[str, str], Any]:
        items = {}
        cursor = None
        while True:
            r = await api.client.get("/api/v1/state", headers=auth(), params={
                "limit": 2, **params, **({"cursor": cursor} if cursor else {})})
            body = r.json()
            items.update({(i["owner"], i["key"]): i for i in body["items"]})
            cursor = body["next_cursor"]
            if cursor is None:
                return items

    items = await listed(pending="true")
    assert items[("dag:etl/load", "cursor")]["value"] == "local"
    assert items[("dag:etl/load", "cursor")]["flush_state"] == "dirty"
    assert items[("dag:etl/load", "cursor")]["version"] == 2
    assert items[("dag:new", "k")]["flush_state"] == "dirty"
    assert ("trigger:t", "k") not in items
    assert items[("dag:etl/load", "offset")]["flush_state"] == "flushed"
    assert len(items) == len(SEEDED) + 1 - 1
    r = await api.client.get(path("dag:new", "k"), params={"pending": "true"}, headers=auth())
    assert (r.status_code, r.json()["flush_state"]) == (200, "dirty")
    r = await api.client.get(path("trigger:t", "k"), params={"pending": "true"}, headers=auth())
    assert r.status_code == 404
    # a plain read shows what the central DB committed: none of the pending writes
    items = await listed()
    assert items[("dag:etl/load", "cursor")]["value"] == SEEDED.index(("dag:etl/load", "cursor"))
    assert {i["flush_state"] for i in items.values()} == {"flushed"}
    assert ("dag:new", "k") not in items
    assert ("trigger:t", "k") in items
    assert (await api.client.get(path("dag:new", "k"), headers=auth())).status_code == 404
    await store.flush()
    r = await api.client.get(path("dag:new", "k"), headers=auth())
    assert r.json()["flush_state"] == "flushed"
    assert await central_value(api, "dag:new", "k") == ("only here", 1)


async def test_a_conflicted_key_says_so_when_asked(api: Api) -> None:
    store = api.store
    await store.set("dag:c", "k", 1, durability="central")
    other = await api.open_store(triggerer_id="other")
    assert await other.get("dag:c", "k") == 1
    await other.set("dag:c", "k", 2)
    await other.flush()
    await store.set("dag:c", "k", 3, durability="local")  # based on v1: a conflict
    await store.flush()
    r = await api.client.get(path("dag:c", "k"), params={"pending": "true"}, headers=auth())
    assert r.json()["flush_state"] == "conflict"
    assert r.json()["value"] == 2  # reject: the central record won
    r = await api.client.get("/api/v1/state", params={"owner_prefix": "dag:c", "pending": "1"},
                             headers=auth())
    assert [i["flush_state"] for i in r.json()["items"]] == ["conflict"]


# -- #18: what a REST read and write guarantee ---------------------------------------------


async def test_a_pending_central_put_is_not_visible_to_a_plain_get(api: Api) -> None:
    """#18 mechanism 5: a read shows no write still pending (it may yet be refused)."""
    url = path("dag:p", "k")
    assert (await api.client.put(url, json={"value": "committed"}, headers=auth())
            ).status_code == 200
    # the serving store holds a write the central DB lacks (a `central` set not yet
    # acknowledged looks the same in memory: dirty, at the next version)
    await api.store.load("dag:p")
    await api.store.set("dag:p", "k", "pending", durability="local")
    r = await api.client.get(url, headers=auth())
    assert (r.json()["value"], r.json()["version"], r.json()["flush_state"]) == (
        "committed", 1, "flushed")
    r = await api.client.get("/api/v1/state", params={"owner_prefix": "dag:p"}, headers=auth())
    assert [(i["value"], i["version"]) for i in r.json()["items"]] == [("committed", 1)]
    # and a compare-and-set is compared with the committed version, not the pending one
    r = await api.client.put(url, json={"value": "cas", "expected_version": 1}, headers=auth())
    assert (r.status_code, r.json()["value"], r.json()["version"]) == (200, "cas", 2), r.text


async def test_a_server_whose_flush_lost_a_conflict_serves_the_central_record(api: Api) -> None:
    """#18 mechanism 4: a conflicted entry of the serving store is no read's answer."""
    store = api.store
    await store.set("dag:c", "k", 1, durability="central")
    other = await api.open_store(triggerer_id="other")
    assert await other.get("dag:c", "k") == 1
    await other.set("dag:c", "k", 2)
    await other.flush()
    await store.set("dag:c", "k", 3, durability="local")  # based on v1: loses at the flush
    await store.flush()
    await other.set("dag:c", "k", 4)
    await other.flush()  # central v3, which the serving store has not seen
    r = await api.client.get(path("dag:c", "k"), headers=auth())
    assert (r.json()["value"], r.json()["version"], r.json()["flush_state"]) == (
        4, 3, "flushed")
    r = await api.client.get("/api/v1/state", params={"owner_prefix": "dag:c"}, headers=auth())
    assert [(i["value"], i["version"]) for i in r.json()["items"]] == [(4, 3)]


class HeldCall:
    """An ordering hook: the first call of `obj.name` waits for `release` (later calls pass),
    before the call itself or, with `after=True`, holding the result it got.

    `entered` is set when that call is held; a route that never makes the call is not held.
    """

    def __init__(self, monkeypatch: pytest.MonkeyPatch, obj: object, name: str, *,
                 after: bool = False) -> None:
        self.entered = asyncio.Event()
        self.release = asyncio.Event()
        original = getattr(obj, name)

        async def hold() -> None:
            if not self.entered.is_set():
                self.entered.set()
                await self.release.wait()

        async def held(*args: Any, **kwargs: Any) -> Any:
            if not after:
                await hold()
            result = await original(*args, **kwargs)
            if after:
                await hold()
            return result

        monkeypatch.setattr(obj, name, held)

    async def until_entered_or(self, task: asyncio.Task[Any]) -> None:
        """Wait until the call is held, or `task` ended without making it."""
        entered = asyncio.create_task(self.entered.wait())
        await asyncio.wait([entered, task], return_when=asyncio.FIRST_COMPLETED)
        entered.cancel()


@pytest_asyncio.fixture
async def api_direct_reads(open_store: StoreFactory, central_url: str,
                           monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Api]:
    """`api` with a serving store that reads the central DB on its own loop (no sink thread),
    so a hook on its reads runs on the test's loop."""
    store = await open_store(triggerer_id="api-server", central_thread=False)
    central = await CentralStore.open(central_url)
    try:
        async with client_for(create_app(store.settings, local=store, tokens=())) as client:
            yield Api(client, store, central, open_store)
    finally:
        await central.close()


async def test_two_compare_and_sets_on_one_version_have_exactly_one_winner(
    api_direct_reads: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """#18 mechanism 1 through REST: the first PUT is held after any read of the owner it
    makes; the second PUT, with the same expected_version, runs meanwhile. Exactly one is
    answered 200, with its own value and version, and the central DB holds it."""
    api = api_direct_reads
    url = path("dag:race", "k")
    assert (await api.client.put(url, json={"value": "v1"})).status_code == 200
    sink = api.store.central_store
    assert sink is not None
    hook = HeldCall(monkeypatch, sink, "read_owner", after=True)
    first = asyncio.create_task(api.client.put(url, json={"value": "a", "expected_version": 1}))
    await hook.until_entered_or(first)
    second = await api.client.put(url, json={"value": "b", "expected_version": 1})
    hook.release.set()
    answers = {"a": await first, "b": second}
    assert sorted(r.status_code for r in answers.values()) == [200, 409], {
        v: (r.status_code, r.text) for v, r in answers.items()}
    value, won = next((v, r.json()) for v, r in answers.items() if r.status_code == 200)
    assert (won["value"], won["version"]) == (value, 2)
    assert await central_value(api, "dag:race", "k") == (value, 2)


async def test_a_put_answers_its_own_write(api_direct_reads: Api,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """#18 mechanism 3: a write of another request lands right after this PUT's write; the
    answer is still this PUT's own value and version."""
    api = api_direct_reads
    url = path("dag:own", "k")
    assert (await api.client.put(url, json={"value": "v1"})).status_code == 200
    hook = HeldCall(monkeypatch, api.store, "record")  # what a read after the write calls
    first = asyncio.create_task(api.client.put(url, json={"value": "mine"}))
    await hook.until_entered_or(first)
    other = await api.client.put(url, json={"value": "theirs"})
    hook.release.set()
    mine = await first
    assert (mine.status_code, mine.json()["value"]) == (200, "mine"), mine.text
    assert (other.status_code, other.json()["value"]) == (200, "theirs")
    assert sorted([mine.json()["version"], other.json()["version"]]) == [2, 3]
    assert await central_value(api, "dag:own", "k") == (
        "theirs" if other.json()["version"] == 3 else "mine", 3)


# -- bad input ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("params", "error"),
    [({"limit": 0}, "validation_error"), ({"limit": 1001}, "validation_error"),
     ({"limit": "many"}, "validation_error"), ({"cursor": "not-a-cursor"}, "invalid_cursor"),
     ({"cursor": "WyJvbmx5LW9uZSJd"}, "invalid_cursor"),  # base64 of ["only-one"]
     ({"owner_prefix": "x\x01"}, "invalid_name"), ({"owner_prefix": "o" * 251},
                                                  "validation_error")],
)
async def test_bad_list_queries_are_4xx_naming_the_problem(api: Api, params: dict[str, Any],
                                                           error: str) -> None:
    r = await api.client.get("/api/v1/state", params=params, headers=auth())
    assert 400 <= r.status_code < 500
    body = r.json()
    assert body["error"] == error
    assert body["message"]


@pytest.mark.parametrize(
    ("raw_path", "status", "error"),
    [("/api/v1/state/a%01b/k", 422, "invalid_name"),
     (f"/api/v1/state/{'o' * 251}/k", 422, "invalid_name"),
     ("/api/v1/state/a/b/c", 404, "not_found"),  # a '/' in a name must be %2F
     ("/api/v1/state/a%2Fb", 404, "not_found"),
     ("/api/v1/state//k", 422, "invalid_name"),
     ("/api/v1/state/%FF/k", 400, "bad_request")],
)
async def test_bad_names_in_the_path(api: Api, raw_path: str, status: int, error: str) -> None:
    for method in ("GET", "PUT", "DELETE"):
        r = await api.client.request(method, raw_path, headers=auth(),
                                     json={"value": 1} if method == "PUT" else None)
        assert (r.status_code, r.json()["error"]) == (status, error), (method, r.text)


#: control characters a name may not hold, from each class: C0 (newline, tab, NUL, escape),
#: DEL, C1 (NEL)
CONTROLS = ["\n", "\t", "\x00", "\x1b", "\x7f", "\x85"]


def _refused_for(r: httpx.Response, char: str) -> None:
    """The typed 422 that names the bad character."""
    assert (r.status_code, r.json()["error"]) == (422, "invalid_name"), r.text
    assert repr(char) in r.json()["message"], r.text
    assert "control characters" in r.json()["message"]


@pytest.mark.parametrize("char", CONTROLS)
async def test_a_control_character_in_a_name_is_the_same_422_on_every_route(
        api: Api, char: str) -> None:
    good = "dag:x"
    for owner, key in ((f"dag{char}x", "k"), (good, f"k{char}"), (good, f"{char}k"),
                       (good, f"k{char}k")):
        for method in ("GET", "PUT", "DELETE"):
            r = await api.client.request(method, path(owner, key), headers=auth(),
                                         json={"value": 1} if method == "PUT" else None)
            _refused_for(r, char)
    bad = f"dag:x{char}y"
    _refused_for(await api.client.get("/api/v1/state", params={"owner_prefix": bad},
                                      headers=auth()), char)
    row = DirtyRow(bad, "k", "1", 1, 0, 1.0, "w")
    bodies: dict[str, list[dict[str, Any]]] = {
        "/api/v1/write": [{"op": "direct", "owner": o, "key": k, "data": "1",
                           "updated_at": 1.0, "updated_by": "w"}
                          for o, k in ((bad, "k"), (good, bad))],
        "/api/v1/claim": [{"owner": bad, "claimant": "c"}],
        "/api/v1/release": [{"owner": bad, "claimant": "c", "epoch": 1}],
        "/api/v1/read": [{"owner": bad}, {"keys": [[bad, "k"]]}, {"keys": [[good, bad]]}],
        "/api/v1/flush": [{"fields": field_header(DirtyRow), "rows": encode_rows([r])}
                          for r in (row, row._replace(owner=good, key=bad))],
    }
    for route, each in bodies.items():
        for body in each:
            r = await api.client.post(route, content=encode_body(body), headers={
                **auth(), "Content-Type": "application/json"})
            _refused_for(r, char)
    assert await central_value(api, good, "k") is None


@pytest.mark.parametrize(
    ("content", "error"),
    [(b"{nope", "validation_error"), (b"[1, 2]", "validation_error"),
     (b"{}", "validation_error"),  # no value
     (b'{"value": 1, "expectedVersion": 3}', "validation_error"),  # a typo is refused
     (b'{"value": 1, "expected_version": "3"}', "validation_error"),
     (b'{"value": 1, "expected_version": true}', "validation_error"),
     (b'{"value": 1, "expected_version": -1}', "validation_error"),
     (b'{"value": NaN}', "invalid_value"), (b'{"value": [1, Infinity]}', "invalid_value"),
     (b'{"value": 123456789012345678901234567890}', "invalid_value")],
)
async def test_bad_bodies_are_422_and_change_nothing(api: Api, content: bytes,
                                                     error: str) -> None:
    r = await api.client.put(path("dag:x", "k"), content=content, headers={
        **auth(), "Content-Type": "application/json"})
    assert r.status_code == 422, r.text
    assert r.json()["error"] == error
    assert r.json()["message"]
    assert await central_value(api, "dag:x", "k") is None


async def test_a_value_over_the_limit_is_413(open_store: StoreFactory) -> None:
    store = await open_store(triggerer_id="small", max_value_bytes=100)
    async with client_for(create_app(store.settings, local=store, tokens=())) as client:
        r = await client.put(path("dag:x", "k"), json={"value": "x" * 200})
        assert r.status_code == 413
        assert r.json()["error"] == "value_too_large"
        assert r.json()["detail"]["limit"] == 100
        # a body far over any value the store takes is refused before it is read
        r = await client.put(path("dag:x", "k"), content=b"x" * 200_000,
                             headers={"Content-Type": "application/json"})
        assert (r.status_code, r.json()["error"]) == (413, "too_large")

        async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: counted as it comes
            for _ in range(20):
                yield b" " * 10_000

        r = await client.put(path("dag:x", "k"), content=chunks(),
                             headers={"Content-Type": "application/json"})
        assert r.status_code == 413
        assert (await client.get(path("dag:x", "k"))).status_code == 404


async def test_an_unreachable_central_db_is_503(open_store: StoreFactory,
                                                caplog: pytest.LogCaptureFixture) -> None:
    store = await open_store(triggerer_id="api-server")
    gone = CentralStore(make_engine("postgresql://nobody@127.0.0.1:1/none"))
    try:
        app = create_app(store.settings, local=store, tokens=(), central=gone)
        async with client_for(app) as client:
            r = await client.get("/api/v1/state")
            assert r.status_code == 503
            assert r.json()["error"] == "central_unavailable"
            assert r.headers["Retry-After"]
            r = await client.get(path("dag:x", "k"))
            assert (r.status_code, r.json()["error"]) == (503, "central_unavailable")
            # no DB location or driver text in the body: the log has them, under its id
            for leak in ("nobody", "127.0.0.1", "postgresql", "none", "refused", "asyncpg"):
                assert leak not in r.text.lower(), r.text
            rid = r.json()["detail"]["request_id"]
            assert rid in r.json()["message"]
            assert any(rid in m and "nobody" in m for m in caplog.messages)
    finally:
        await gone.close()


# -- authentication and authorization ---------------------------------------------------


@pytest.mark.parametrize("headers", [
    {}, {"Authorization": "Bearer wrong-token-0123456789"}, {"Authorization": f"Basic {RW_ALL}"},
    {"Authorization": "Bearer"}, {"Authorization": f"Bearer {RW_ALL}x"},
    {"Authorization": f"Bearer {RW_ALL[:-1]}"},
])
@pytest.mark.parametrize(("method", "route"), [
    ("GET", "/api/v1/state"), ("GET", "/api/v1/status"), ("GET", "/api/v1/fleet"),
    ("GET", path("dag:x", "k")), ("PUT", path("dag:x", "k")), ("DELETE", path("dag:x", "k")),
])
async def test_no_token_or_a_wrong_one_is_401(api: Api, headers: dict[str, str], method: str,
                                              route: str) -> None:
    await api.store.set("dag:x", "k", "before", durability="central")
    r = await api.client.request(method, route, headers=headers,
                                 json={"value": "after"} if method == "PUT" else None)
    assert r.status_code == 401
    assert r.headers["WWW-Authenticate"] == "Bearer"
    assert r.json()["error"] == "unauthorized"
    assert RW_ALL not in r.text
    assert await central_value(api, "dag:x", "k") == ("before", 1)


@pytest.mark.parametrize(("token", "method", "owner"), [
    (RO_ALL, "PUT", "dag:x"), (RO_ALL, "DELETE", "dag:x"),  # read-only writing
    (RO_ASSET, "PUT", "asset_watcher:a"),
    (RW_DAG, "PUT", "asset_watcher:a"), (RW_DAG, "DELETE", "asset_watcher:a"),  # outside
    (RW_DAG, "GET", "asset_watcher:a"), (RO_ASSET, "GET", "dag:x"),
    (RW_DAG, "PUT", "da"),  # a prefix of the token's prefix is still outside it
])
async def test_outside_the_tokens_role_or_owners_is_403_and_changes_nothing(
    api: Api, token: str, method: str, owner: str
) -> None:
    await api.store.set(owner, "k", "before", durability="central")
    r = await api.client.request(method, path(owner, "k"), headers=auth(token),
                                 json={"value": "after"} if method == "PUT" else None)
    assert r.status_code == 403, r.text
    assert r.json()["error"] == "forbidden"
    assert token not in r.text
    assert await central_value(api, owner, "k") == ("before", 1)


@pytest.mark.parametrize(("token", "method", "owner"), [
    (RW_ALL, "PUT", "asset_watcher:a"), (RW_DAG, "PUT", "dag:etl/load"),
    (RW_DAG, "DELETE", "dag:x"), (RO_ALL, "GET", "dag:x"), (RO_ASSET, "GET", "asset_watcher:a"),
])
async def test_within_the_tokens_role_and_owners_is_allowed(api: Api, token: str, method: str,
                                                            owner: str) -> None:
    await api.store.set(owner, "k", "before", durability="central")
    r = await api.client.request(method, path(owner, "k"), headers=auth(token),
                                 json={"value": "after"} if method == "PUT" else None)
    assert r.status_code in (200, 204), r.text
    expected = {"PUT": ("after", 2), "DELETE": None, "GET": ("before", 1)}[method]
    assert await central_value(api, owner, "k") == expected


@collations
async def test_a_prefix_limited_token_lists_only_its_owners(api: Api) -> None:
    await seed(api, SEEDED)
    mine = [k for k in SEEDED if k[0].startswith("asset_watcher:")]
    assert await list_all(api, RO_ASSET, limit=2) == mine
    assert await list_all(api, RO_ASSET, owner_prefix="asset_watcher:b") == [
        k for k in SEEDED if k[0] == "asset_watcher:b"]
    assert await list_all(api, RO_ASSET, owner_prefix="asset") == mine
    r = await api.client.get("/api/v1/state", params={"owner_prefix": "dag:"},
                             headers=auth(RO_ASSET))
    assert r.status_code == 403
    assert r.json()["error"] == "forbidden"


async def test_health_and_openapi_need_no_token(api: Api) -> None:
    r = await api.client.get("/api/v1/health")
    assert r.status_code == 200
    assert r.json()["status"] == "ok"
    assert r.json()["auth_required"] is True
    r = await api.client.get("/api/v1/openapi.json")
    assert r.status_code == 200
    doc = r.json()
    assert set(doc["paths"]) == {"/api/v1/state", "/api/v1/state/{owner}/{key}",
                                 "/api/v1/status", "/api/v1/fleet", "/api/v1/health",
                                 "/api/v1/me", "/api/v1/history",
                                 # the batched endpoints of sink = api
                                 "/api/v1/flush", "/api/v1/read", "/api/v1/write",
                                 "/api/v1/claim", "/api/v1/release"}
    assert set(doc["paths"]["/api/v1/state/{owner}/{key}"]) == {"get", "put", "delete"}
    assert doc["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    assert "expected_version" in doc["components"]["schemas"]["PutBody"]["properties"]


async def test_without_tokens_configured_the_api_is_open(open_store: StoreFactory) -> None:
    store = await open_store(triggerer_id="open")
    # the store's settings: no tokens
    async with client_for(create_app(store.settings, local=store)) as client:
        r = await client.put(path("dag:x", "k"), json={"value": 1})
        assert r.status_code == 200
        assert (await client.get("/api/v1/health")).json()["auth_required"] is False


# -- status, health, UI ------------------------------------------------------------------


async def test_status_reports_the_serving_store(api: Api) -> None:
    await api.store.set("dag:s", "a", 1, durability="local")
    await api.store.set("dag:s", "b", 2, durability="local")
    r = await api.client.get("/api/v1/status", headers=auth(RO_ASSET))
    assert r.status_code == 200
    s = r.json()
    assert s["triggerer_id"] == "api-server"
    assert s["cache_enabled"] is True
    assert (s["cache_turning_off"], s["cache_turning_off_s"]) == (False, 0.0)
    assert s["dirty_keys"] == 2
    assert s["flush_lag_s"] > 0
    assert s["last_flush_at"] is None
    assert s["sets"] == 2
    assert "password" not in s["central_url"]
    await api.store.flush()
    s = (await api.client.get("/api/v1/status", headers=auth())).json()
    assert (s["dirty_keys"], s["flush_lag_s"], s["flushes"]) == (0, 0.0, 1)
    assert s["last_flush_at"] is not None
    assert s["central_rows"] == 2
    assert s["flush_lag_p99_s"] is not None
    assert s["throughput"] is not None
    assert s["throughput"]["sets_per_s"] >= 0


def test_rate_meter_measures_over_its_window() -> None:
    now = [100.0]
    meter = RateMeter(window=10.0, clock=lambda: now[0])
    assert meter.sample(0, 0) is None
    now[0] = 102.0
    t = meter.sample(20, 100)
    assert t is not None
    assert (t.window_s, t.sets_per_s, t.central_rows_per_s) == (2.0, 10.0, 50.0)
    for _ in range(30):  # samples older than the window are dropped
        now[0] += 1.0
        meter.sample(20, 100)
    t = meter.sample(20, 100)
    assert t is not None
    assert t.sets_per_s == 0.0
    assert t.window_s <= 11.0


async def test_an_app_whose_lifespan_never_ran_says_so(open_store: StoreFactory) -> None:
    store = await open_store(triggerer_id="no-lifespan")
    app = create_app(store.settings, local=store)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://localstate.test") as client:
        r = await client.get("/api/v1/state")
        assert (r.status_code, r.json()["error"]) == (503, "store_unavailable")
        assert "lifespan" in r.json()["message"]


async def test_manage_store_opens_and_closes_the_store(tmp_path: Any, central_url: str
                                                       ) -> None:
    store = StateStore(cache_path=tmp_path / "managed.db", central_url=central_url,
                       triggerer_id="managed")
    app = create_app(store.settings, local=store, manage_local=True)
    async with client_for(app) as client:
        r = await client.put(path("dag:m", "k"), json={"value": 1})
        assert r.status_code == 200
        assert not store.closed
    assert store.closed


async def test_health_says_closed_when_the_store_is(open_store: StoreFactory) -> None:
    store = await open_store(triggerer_id="closing")
    async with client_for(create_app(store.settings, local=store)) as client:
        assert (await client.get("/api/v1/health")).status_code == 200
        await store.close()
        r = await client.get("/api/v1/health")
        assert (r.status_code, r.json()["status"]) == (503, "closed")
        r = await client.put(path("dag:x", "k"), json={"value": 1})
        assert (r.status_code, r.json()["error"]) == (503, "store_unavailable")


async def test_the_ui_page_and_its_assets(api: Api) -> None:
    r = await api.client.get("/")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/html")
    assert "script-src 'self'" in r.headers["content-security-policy"]
    assert '<script src="ui/app.js">' in r.text  # relative: the page also works mounted
    assert "frame-ancestors 'self'" in r.headers["content-security-policy"]
    js = await api.client.get("/ui/app.js")
    assert js.status_code == 200
    assert "expected_version" in js.text
    assert "innerHTML" not in js.text  # values go in as text only
    assert (await api.client.get("/ui/style.css")).status_code == 200


async def test_me_says_what_the_caller_may_do(api: Api) -> None:
    """The page draws Edit controls only for a caller /api/v1/me says may write."""
    r = await api.client.get("/api/v1/me", headers=auth(RW_DAG))
    assert r.status_code == 200, r.text
    assert (r.json()["can_write"], r.json()["owners"]) == (True, ["dag:"])
    r = await api.client.get("/api/v1/me", headers=auth(RO_ASSET))
    assert (r.json()["can_write"], r.json()["owners"]) == (False, ["asset_watcher:"])
    assert (await api.client.get("/api/v1/me")).status_code == 401


async def test_a_server_of_settings_alone_serves_and_says_what_it_committed(
        central_url: str, tmp_path: Any) -> None:
    """The Airflow plugin's shape: settings and the app's own central store, no local store.
    Writes go to the central DB as the server's triggerer id (the open API names no caller),
    /status shows what it committed, ?pending=true has nothing to overlay, and once the
    lifespan ends the server says it is closed."""
    settings = Settings.resolve({"central_url": central_url, "triggerer_id": "api@host",
                                 "cache_path": str(tmp_path / "never.db")})
    app = create_app(settings)
    async with client_for(app) as client:
        r = await client.put(path("dag:s", "k"), json={"value": {"n": 1}})
        assert (r.status_code, r.json()["updated_by"]) == (200, "api@host")
        r = await client.get(path("dag:s", "k"), params={"pending": "true"})
        assert (r.json()["value"], r.json()["flush_state"]) == ({"n": 1}, "flushed")
        status = (await client.get("/api/v1/status")).json()
        assert (status["triggerer_id"], status["cache_enabled"], status["dirty_keys"]) == (
            "api@host", False, 0)
        assert (status["central_transactions"], status["central_rows"]) == (1, 1)
        assert (await client.get("/api/v1/health")).json()["status"] == "ok"
    assert not (tmp_path / "never.db").exists()  # no local store was opened
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://localstate.test") as client:
        r = await client.get("/api/v1/health")
        assert (r.status_code, r.json()["status"]) == (503, "closed")
        r = await client.put(path("dag:s", "k"), json={"value": 2})
        assert (r.status_code, r.json()["error"]) == (503, "store_unavailable")
