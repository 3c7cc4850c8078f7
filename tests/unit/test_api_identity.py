"""The server decides who wrote: ``updated_by`` and a claim's claimant come from the
authenticated caller when it has an identity (an Airflow user, a token bound to one), a PUT's
from its token's name, the writer id is bound to the caller; every write leaves one audit line
naming the caller, the route, owners and rows."""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from collections.abc import AsyncIterator

import httpx
import pytest
import pytest_asyncio
from api_paths import path
from conftest import StoreFactory
from test_api import client_for

from localstate import Settings
from localstate._core.conflicts import PolicyMap
from localstate._core.rows import DirtyRow, EventRow
from localstate._sync.central.central_store import CentralStore
from localstate._sync.sinks.api_sink import ApiSink
from localstate.api import create_app

OPS = "ops-token-0123456789abcdef"
TRIGGERER = "trig-token-0123456789abcdef"
TOKENS = json.dumps([
    {"token": OPS, "role": "read-write", "owners": ["*"], "name": "ops"},
    {"token": TRIGGERER, "role": "read-write", "owners": ["trigger:"], "name": "triggerer-a",
     "identity": "triggerer-a.example.com"},
])


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest_asyncio.fixture
async def served(open_store: StoreFactory, central_url: str
                 ) -> AsyncIterator[tuple[httpx.AsyncClient, CentralStore, httpx.ASGITransport]]:
    store = await open_store(triggerer_id="api-server")
    central = await CentralStore.open(central_url)
    app = create_app(store.settings, local=store,
                     tokens=Settings.resolve({"api_tokens": TOKENS}).api_tokens)
    try:
        async with client_for(app) as client:
            yield client, central, httpx.ASGITransport(app=app)
    finally:
        await central.close()


async def test_no_request_chooses_who_wrote(
        served: tuple[httpx.AsyncClient, CentralStore, httpx.ASGITransport],
        caplog: pytest.LogCaptureFixture) -> None:
    client, central, transport = served
    caplog.set_level(logging.INFO, logger="localstate.api.audit")
    # /write says updated_by 'evil': the row says the identity bound to the token
    r = await client.post("/api/v1/write", headers=bearer(TRIGGERER), json={
        "op": "direct", "owner": "trigger:w", "key": "wm", "data": "1", "updated_at": time.time(),
        "updated_by": "evil"})
    assert r.status_code == 200, r.text
    assert "evil" not in r.text
    # a PUT: the token's name too (not the serving process's id)
    r = await client.put(path("dag:a", "cursor"), json={"value": 2}, headers=bearer(OPS))
    assert r.json()["updated_by"] == "ops"
    # a flush of a token bound to a triggerer: its rows and its claims say that triggerer
    sink = ApiSink("http://localstate.test", TRIGGERER, transport=transport)
    try:
        rows = [DirtyRow("trigger:t", f"k{i}", str(i), 1, 0, time.time(), "attacker-form")
                for i in range(3)]
        outcomes = await sink.write_batch(rows, PolicyMap("reject"), writer="forged-file")
        assert [o.resolution for o in outcomes] == ["written"] * 3
    finally:
        await sink.close()
    r = await client.post("/api/v1/claim", headers=bearer(TRIGGERER),
                          json={"owner": "trigger:t", "claimant": "evil"})
    assert r.status_code == 200, r.text
    found = await central.read_many([("trigger:w", "wm"), ("dag:a", "cursor"),
                                     ("trigger:t", "k0")])
    assert {k: row.updated_by for k, row in found.items()} == {
        ("trigger:w", "wm"): "triggerer-a.example.com", ("dag:a", "cursor"): "ops",
        ("trigger:t", "k0"): "triggerer-a.example.com"}
    assert found[("trigger:t", "k0")].writer not in (None, "forged-file")
    assert await central.read_claims(["trigger:t"]) == {
        "trigger:t": (1, "triggerer-a.example.com")}
    # one audit line per write: principal, route, owners, rows; never a secret
    lines = [r.getMessage() for r in caplog.records if r.name == "localstate.api.audit"]
    assert len(lines) == 4, lines
    expected = [("'triggerer-a'", "POST /api/v1/write", "1 row(s) of owners ['trigger:w']"),
                ("'ops'", "PUT /api/v1/state", "1 row(s) of owners ['dag:a']"),
                ("'triggerer-a'", "POST /api/v1/flush", "3 row(s) of owners ['trigger:t']"),
                ("'triggerer-a'", "POST /api/v1/claim", "1 row(s) of owners ['trigger:t']")]
    for line, parts in zip(lines, expected, strict=True):
        assert all(part in line for part in parts), (line, parts)
    assert not any(OPS in line or TRIGGERER in line for line in caplog.messages)


async def test_a_token_without_an_identity_records_its_name_not_the_requests(
        served: tuple[httpx.AsyncClient, CentralStore, httpx.ASGITransport],
        caplog: pytest.LogCaptureFixture) -> None:
    """A token with no bound identity (one a fleet may share) is recorded by its name on
    every route; the name the request gives itself is only a note in the audit line."""
    client, central, transport = served
    caplog.set_level(logging.INFO, logger="localstate.api.audit")
    r = await client.post("/api/v1/write", headers=bearer(OPS), json={
        "op": "direct", "owner": "dag:u", "key": "w", "data": "1", "updated_at": time.time(),
        "updated_by": "triggerer-a.example.com"})  # another triggerer's identity
    assert r.status_code == 200, r.text
    sink = ApiSink("http://localstate.test", OPS, transport=transport)
    try:
        rows = [DirtyRow("dag:u", f"k{i}", str(i), 1, 0, time.time(), "evil") for i in range(3)]
        assert [o.resolution for o in await sink.write_batch(rows, PolicyMap("reject"))] == [
            "written"] * 3
        assert await sink.claim("dag:u", claimant="evil") == 1
        assert await sink.delete_current("dag:u", "k0", updated_by="evil")
    finally:
        await sink.close()
    found = await central.read_many([("dag:u", "w"), ("dag:u", "k1"), ("dag:u", "k0")])
    assert {row.updated_by for row in found.values()} == {"ops"}
    assert await central.read_claims(["dag:u"]) == {"dag:u": (1, "ops")}
    lines = [r.getMessage() for r in caplog.records if r.name == "localstate.api.audit"]
    assert len(lines) == 4, lines
    assert all(line.startswith("write by 'ops' (unbound)") for line in lines), lines
    assert "request named 'triggerer-a.example.com'" in lines[0]
    assert all("request named 'evil'" in line for line in lines[1:]), lines


async def test_the_history_names_the_caller_for_its_events_claims_and_releases(
        served: tuple[httpx.AsyncClient, CentralStore, httpx.ASGITransport],
        caplog: pytest.LogCaptureFixture) -> None:
    """An event a flush carries and a release are recorded in the owner's history as the
    caller's (its bound identity, else its token's name), whatever triggerer the request
    names; the release with the epoch the request gives and the caller's writer id."""
    client, central, transport = served
    caplog.set_level(logging.INFO, logger="localstate.api.audit")
    for token, owner, who in ((TRIGGERER, "trigger:h", "triggerer-a.example.com"),
                              (OPS, "dag:h", "ops")):
        sink = ApiSink("http://localstate.test", token, transport=transport)
        try:
            epoch = await sink.claim(owner, claimant="evil", writer="file-1")
            _, statuses = await sink.write_with_events(
                [], [EventRow(1, owner, "e1", "{}", time.time(), epoch)], PolicyMap("reject"),
                writer="file-1", triggerer="evil")
            assert statuses == ["committed"]
            assert await sink.record_release(owner, epoch=epoch, claimant="evil",
                                             writer="file-1")
        finally:
            await sink.close()
        rows = sorted(await central.read_history(owner), key=lambda r: r.id)
        assert [(r.kind, r.epoch, r.triggerer) for r in rows] == [
            ("claim", 1, who), ("event", 1, who), ("release", 1, who)]
        assert len({r.writer for r in rows}) == 1
        assert rows[0].writer not in (None, "file-1")
    r = await client.post("/api/v1/release", headers=bearer(TRIGGERER),
                          json={"owner": "trigger:h", "claimant": "x", "epoch": 0})
    assert (r.status_code, r.json()["error"]) == (422, "invalid_input")
    r = await client.post("/api/v1/release", headers=bearer(TRIGGERER),
                          json={"owner": "dag:h", "claimant": "x", "epoch": 1})
    assert r.status_code == 403  # outside its owners: nothing recorded
    assert len(await central.read_history("dag:h", kinds=["release"])) == 1
    lines = [r.getMessage() for r in caplog.records if r.name == "localstate.api.audit"]
    assert sum("POST /api/v1/release" in line for line in lines) == 2, lines


def test_a_token_may_be_bound_to_an_identity() -> None:
    [ops, trig] = Settings.resolve({"api_tokens": TOKENS}).api_tokens
    assert (ops.identity, trig.identity) == ("", "triggerer-a.example.com")
    with pytest.raises(Exception, match="identity"):
        Settings.resolve({"api_tokens": json.dumps([{
            "token": OPS, "role": "read", "owners": ["*"], "identity": "a\nb"}])})


# -- what each caller sees -----------------------------------------------------------------------

READER = "reader-token-0123456789abcdef"
TENANT = "tenant-token-0123456789abcdef"


async def test_narrow_tokens_see_no_db_location_and_no_other_tenants_triggerers(
        open_store: StoreFactory, central_url: str) -> None:
    store = await open_store(triggerer_id="api-server")
    await store.set("dag:v", "wm", 1)
    await store.flush()  # the fleet table holds api-server now
    tokens = [
        *json.loads(TOKENS),
        {"token": READER, "role": "read", "owners": ["*"], "name": "reader"},
        {"token": TENANT, "role": "read-write", "owners": ["tenant_a:"], "name": "tenant-a"}]
    app = create_app(store.settings, local=store,
                     tokens=Settings.resolve({"api_tokens": json.dumps(tokens)}).api_tokens)
    where = central_url.rsplit("/", 1)[-1]
    async with client_for(app) as client:
        admin = (await client.get("/api/v1/status", headers=bearer(OPS))).json()
        assert where in admin["central_url"]
        for token in (READER, TENANT, TRIGGERER):
            seen = await client.get("/api/v1/status", headers=bearer(token))
            assert seen.status_code == 200
            assert where not in seen.text
            assert seen.json()["central_url"].startswith("(hidden")
        [member] = (await client.get("/api/v1/fleet", headers=bearer(OPS))).json()["triggerers"]
        assert (member["triggerer"], member["pid"]) == ("api-server", os.getpid())
        [member] = (await client.get("/api/v1/fleet", headers=bearer(READER))).json()[
            "triggerers"]
        assert (member["triggerer"], member["host"], member["pid"]) == ("api-server", None,
                                                                        None)
        # a tenant's token: not the shared server's triggerer, nor any other
        tenant = (await client.get("/api/v1/fleet", headers=bearer(TENANT))).json()
        assert tenant["triggerers"] == []
        # the sink's read of the fleet table (a write budget's): the rates, no one's name,
        # host or pid but an admin's
        for token, named in ((OPS, True), (READER, False), (TENANT, False), (TRIGGERER, False)):
            r = await client.post("/api/v1/read", headers=bearer(token), json={"fleet": True})
            assert r.status_code == 200, r.text
            [row] = r.json()["rows"]
            fields = r.json()["fields"]
            fields = fields[next(iter(fields))] if isinstance(fields, dict) else fields
            got = dict(zip(fields, row, strict=True))
            # by field: the process id's digits can turn up inside a time or a rate in the
            # text (a search of the text for them failed once so)
            assert (got["triggerer"], got["host"], got["pid"]) == (
                ("api-server", socket.gethostname(), os.getpid()) if named else ("", "", 0))
            assert got["rows_per_s"] >= 0.0


async def test_a_flush_over_the_row_bound_is_413_and_writes_nothing(
        open_store: StoreFactory, central_url: str) -> None:
    store = await open_store(triggerer_id="api-server")
    settings = Settings.resolve({"central_url": central_url, "api_max_batch_rows": 50,
                                 "api_tokens": TOKENS})
    async with client_for(create_app(settings, local=store)) as client:
        fields = ["owner", "key", "data", "version", "base_version", "updated_at",
                  "updated_by", "epoch"]
        rows = [["dag:b", f"k{i}", "1", 1, 0, time.time(), "t", 0] for i in range(51)]
        r = await client.post("/api/v1/flush", headers=bearer(OPS),
                              json={"fields": {"DirtyRow": fields}, "rows": rows, "writer": "w"})
        assert (r.status_code, r.json()["error"]) == (413, "too_many_rows")
        r = await client.post("/api/v1/flush", headers=bearer(OPS),
                              json={"fields": {"DirtyRow": fields}, "rows": rows[:50],
                                    "writer": "w"})
        assert r.status_code == 200, r.text
    async with CentralStore.open(central_url) as central:
        assert len(await central.read_owner("dag:b")) == 50
