"""Per-triggerer credentials: one key in ``api_tokens`` (``"per_triggerer": true``), and each
triggerer's credential derived from it and its triggerer_id, bound to that id. A credential
writes as its own triggerer only, never flushes an owner another triggerer claimed, and the
key itself is no token; `localstate credential` makes the credential, mode 0600."""

from __future__ import annotations

import contextlib
import json
import stat
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import pytest_asyncio
from api_paths import path
from conftest import StoreFactory

from localstate import Settings
from localstate._core.conflicts import PolicyMap
from localstate._core.rows import DirtyRow
from localstate._core.triggerer_credential import credential_triggerer, derive
from localstate._sync.central.central_store import CentralStore
from localstate._sync.sinks.api_sink import ApiSink
from localstate.api import create_app
from localstate.cli import main
from localstate.errors import AccessDenied, ConfigError

KEY = "per-triggerer-key-0123456789abcdef"
NEW_KEY = "per-triggerer-key-rotated-0123456789"
TOKENS = [{"token": KEY, "role": "read-write", "owners": ["trigger:", "asset_watcher:"],
           "name": "triggerers", "per_triggerer": True}]


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@contextlib.asynccontextmanager
async def serving(open_store: StoreFactory, tokens: list[dict[str, object]],
                  name: str = "api-server",
                  ) -> AsyncIterator[tuple[httpx.AsyncClient, httpx.ASGITransport]]:
    store = await open_store(triggerer_id=name)
    app = create_app(store.settings, local=store,
                     tokens=Settings.resolve({"api_tokens": json.dumps(tokens)}).api_tokens)
    transport = httpx.ASGITransport(app=app)
    async with app.router.lifespan_context(app), httpx.AsyncClient(
            transport=transport, base_url="http://localstate.test") as client:
        yield client, transport


@pytest_asyncio.fixture
async def central(central_url: str) -> AsyncIterator[CentralStore]:
    c = await CentralStore.open(central_url)
    try:
        yield c
    finally:
        await c.close()


def test_a_credential_names_its_triggerer_and_depends_on_the_key() -> None:
    a = derive(KEY, "airflow-triggerer-0")
    assert a.startswith("lst1.airflow-triggerer-0.")
    assert credential_triggerer(a) == "airflow-triggerer-0"
    assert derive(KEY, "airflow-triggerer-0") == a
    assert derive(NEW_KEY, "airflow-triggerer-0") != a
    assert derive(KEY, "airflow-triggerer-1") != a
    assert credential_triggerer("lst1.x") is None
    assert credential_triggerer(KEY) is None
    with pytest.raises(ValueError, match="triggerer id"):
        derive(KEY, "../etc")


def test_a_per_triggerer_entry_takes_no_identity() -> None:
    with pytest.raises(ConfigError, match="drop its identity"):
        Settings.resolve({"api_tokens": json.dumps([{**TOKENS[0], "identity": "x"}])})
    with pytest.raises(ConfigError, match="per_triggerer must be true or false"):
        Settings.resolve({"api_tokens": json.dumps([{**TOKENS[0], "per_triggerer": "yes"}])})


async def test_a_credential_writes_as_its_triggerer_and_the_key_is_no_token(
        open_store: StoreFactory, central: CentralStore) -> None:
    a, b = derive(KEY, "triggerer-a"), derive(KEY, "triggerer-b")
    async with serving(open_store, TOKENS) as (client, transport):
        # the key itself, a credential of another key, a credential with its mac altered
        for wrong in (KEY, derive(NEW_KEY, "triggerer-a"), a[:-2] + ("AA" if a[-2:] != "AA"
                                                                      else "BB")):
            r = await client.get(path("trigger:t", "k"), headers=bearer(wrong))
            assert r.status_code == 401, (wrong, r.text)
        # a's rows say triggerer-a whatever they name; outside its owners: 403
        r = await client.post("/api/v1/write", headers=bearer(a), json={
            "op": "direct", "owner": "trigger:own", "key": "wm", "data": "1",
            "updated_at": time.time(), "updated_by": "triggerer-b"})
        assert r.status_code == 200, r.text
        r = await client.put(path("dag:x", "k"), json={"value": 1}, headers=bearer(a))
        assert r.status_code == 403
        # b claims an owner: recorded as b, whatever claimant the request names
        r = await client.post("/api/v1/claim", headers=bearer(b),
                              json={"owner": "trigger:b-owned", "claimant": "triggerer-a"})
        assert r.status_code == 200, r.text
        epoch = r.json()["epoch"]
        # a flushing b's owner at b's epoch (or above it): 403, nothing written
        sink = ApiSink("http://localstate.test", a, transport=transport)
        try:
            for forged in (epoch, epoch + 5):
                with pytest.raises(AccessDenied, match="triggerer-b"):
                    await sink.write_batch(
                        [DirtyRow("trigger:b-owned", "wm", "666", 1, 0, time.time(), "x", forged)],
                        PolicyMap("reject"), writer="a-file")
        finally:
            await sink.close()
        # b flushing its own owner at its epoch: written
        sink = ApiSink("http://localstate.test", b, transport=transport)
        try:
            outcomes = await sink.write_batch(
                [DirtyRow("trigger:b-owned", "wm", "7", 1, 0, time.time(), "x", epoch)],
                PolicyMap("reject"), writer="b-file")
            assert [o.resolution for o in outcomes] == ["written"]
        finally:
            await sink.close()
    [own] = await central.read_owner("trigger:own")
    assert own.updated_by == "triggerer-a"
    [record] = await central.read_owner("trigger:b-owned")
    assert (record.data, record.updated_by) == ("7", "triggerer-b")
    assert (await central.read_claims(["trigger:b-owned"])) == {
        "trigger:b-owned": (epoch, "triggerer-b")}


async def test_rotation_takes_both_keys_then_the_new_one_only(
        open_store: StoreFactory) -> None:
    old, new = derive(KEY, "triggerer-a"), derive(NEW_KEY, "triggerer-a")
    both = [*TOKENS, {**TOKENS[0], "token": NEW_KEY}]
    async with serving(open_store, both) as (client, _):
        for credential in (old, new):
            r = await client.get(path("trigger:t", "k"), headers=bearer(credential))
            assert r.status_code == 404, r.text  # let in: the key has no value
    async with serving(open_store, [{**TOKENS[0], "token": NEW_KEY}], "rotated") as (client, _):
        assert (await client.get(path("trigger:t", "k"),
                                 headers=bearer(old))).status_code == 401
        assert (await client.get(path("trigger:t", "k"),
                                 headers=bearer(new))).status_code == 404


def test_the_cli_writes_the_credential_of_its_triggerer_id_privately(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    key_file = tmp_path / "key"
    key_file.write_text(KEY + "\n")
    out = tmp_path / "run" / "api-token"
    out.parent.mkdir()
    monkeypatch.setenv("AIRFLOW__LOCALSTATE__TRIGGERER_ID", "airflow-triggerer-1")
    assert main(["credential", "--key-file", str(key_file), "--out", str(out)]) == 0
    assert out.read_text() == derive(KEY, "airflow-triggerer-1") + "\n"
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    capsys.readouterr()
    assert main(["credential", "--key-file", str(key_file), "--triggerer-id", "t-2"]) == 0
    assert capsys.readouterr().out.strip() == derive(KEY, "t-2")
    key_file.write_text("short\n")
    assert main(["credential", "--key-file", str(key_file)]) != 0
    assert "at least 16" in capsys.readouterr().err
