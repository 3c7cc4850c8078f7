"""localstate inside a real Airflow 3.3: the plugin, its auth, ``airflow db migrate``, and the
asset_state_store mirror, against real ``airflow`` processes on the suite's PostgreSQL.

One deployment for the module (migrating and starting an API server takes a minute on these
machines): a fresh metadata DB migrated by ``airflow db migrate``, and ``airflow api-server``
with localstate's plugin, SimpleAuthManager users of three roles, and a machine token.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from urllib.parse import quote

import asyncpg
import httpx
import orjson
import pytest
import pytest_asyncio
from airflow_api_server import (
    MACHINE_PREFIX,
    MACHINE_TOKEN,
    ApiServer,
    api_server,
    migrate,
    new_airflow,
)
from airflow_harness import AIRFLOW, Deployment

from localstate.airflow.migrations import revision_id
from localstate.airflow.serving import central_url_of
from localstate.sync.asset_mirror import AssetMirror
from localstate.sync.central_store import CentralStore
from localstate.sync.conflicts import PolicyMap
from localstate.sync.rows import DirtyRow
from localstate.sync.schema import LATEST_VERSION, MIGRATIONS
from localstate.testing.postgres_server import PostgresServer

pytestmark = pytest.mark.postgres

ASSET = "orders"
OWNER = f"asset_watcher:{ASSET}"


@pytest.fixture(scope="module")
def migrated(pg_server: PostgresServer, tmp_path_factory: pytest.TempPathFactory
             ) -> tuple[Deployment, str]:
    """A fresh metadata DB after one ``airflow db migrate``, and that command's output."""
    d = new_airflow(pg_server, tmp_path_factory.mktemp("airflow-plugin"))
    return d, migrate(d)


@pytest.fixture(scope="module")
def server(migrated: tuple[Deployment, str]) -> Iterator[ApiServer]:
    with api_server(migrated[0]) as s:
        yield s


@pytest_asyncio.fixture
async def db(migrated: tuple[Deployment, str]) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(migrated[0].airflow_dsn)
    try:
        yield conn
    finally:
        await conn.close()


def state_path(owner: str, key: str) -> str:
    return f"/localstate/api/v1/state/{quote(owner, safe='')}/{quote(key, safe='')}"


async def central_value(db: asyncpg.Connection, owner: str, key: str) -> tuple[object, int]:
    row = await db.fetchrow("SELECT value, version FROM localstate_state_variable "
                            "WHERE owner = $1 AND key = $2", owner, key)
    return (None, 0) if row is None else (json.loads(row["value"]), int(row["version"]))


# -- the plugin ------------------------------------------------------------------------------


def test_airflow_plugins_lists_it(migrated: tuple[Deployment, str]) -> None:
    d = migrated[0]
    done = subprocess.run([str(AIRFLOW), "plugins", "--output", "json"], env=d.env,
                          capture_output=True, timeout=300, check=True)
    plugins = {p["name"]: p for p in json.loads(done.stdout)}
    assert "localstate" in plugins, done.stdout.decode()[-2000:]
    ours = plugins["localstate"]
    assert [a["url_prefix"] for a in ours["fastapi_apps"]] == ["/localstate"]
    assert [(v["url_route"], v["destination"]) for v in ours["external_views"]] == [
        ("localstate", "nav")]


async def test_health_is_localstates_json_through_the_api_server(server: ApiServer) -> None:
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        r = await client.get("/localstate/api/v1/health")
        # Airflow's UI answers 200 with its own page for any unknown path: the JSON is ours
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("application/json")
        body = r.json()
        assert body["status"] == "ok"
        assert body["auth_required"] is True
        assert "version" in body
        unknown = await client.get("/localstate-nowhere/api/v1/health")
        assert not unknown.headers["content-type"].startswith("application/json")
        page = await client.get("/localstate/")
        assert page.status_code == 200
        assert '<script src="ui/app.js">' in page.text
        assert "frame-ancestors 'self'" in page.headers["content-security-policy"]


# -- who may read and write --------------------------------------------------------------------


async def test_anonymous_gets_401_and_changes_nothing(server: ApiServer,
                                                      db: asyncpg.Connection) -> None:
    owner, key = "dag:anon/test", "cursor"
    admin = {"Authorization": f"Bearer {server.login('admin')}"}
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        r = await client.put(state_path(owner, key), json={"value": 1}, headers=admin)
        assert r.status_code == 200, r.text
        for method, extra in (("GET", {}), ("PUT", {"json": {"value": 2}}), ("DELETE", {})):
            r = await client.request(method, state_path(owner, key), **extra)  # type: ignore[arg-type]
            assert r.status_code == 401, (method, r.text)
            assert r.json()["error"] == "unauthorized"
        r = await client.get("/localstate/api/v1/state")
        assert r.status_code == 401
        # a bearer that is neither a localstate token nor an Airflow JWT: 401 as well
        r = await client.put(state_path(owner, key), json={"value": 3},
                             headers={"Authorization": "Bearer not-a-token"})
        assert r.status_code == 401
    assert await central_value(db, owner, key) == (1, 1)


async def test_a_viewer_reads_and_gets_403_on_a_write(server: ApiServer,
                                                      db: asyncpg.Connection) -> None:
    owner, key = "dag:viewer/test", "cursor"
    admin = {"Authorization": f"Bearer {server.login('admin')}"}
    viewer = {"Authorization": f"Bearer {server.login('viewer')}"}
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        assert (await client.put(state_path(owner, key), json={"value": 10},
                                 headers=admin)).status_code == 200
        r = await client.get(state_path(owner, key), headers=viewer)
        assert (r.status_code, r.json()["value"]) == (200, 10)
        r = await client.get("/localstate/api/v1/state", params={"owner_prefix": owner},
                             headers=viewer)
        assert [i["key"] for i in r.json()["items"]] == [key]
        for method, extra in (("PUT", {"json": {"value": 11, "expected_version": 1}}),
                              ("DELETE", {})):
            r = await client.request(method, state_path(owner, key), headers=viewer,
                                     **extra)  # type: ignore[arg-type]
            assert r.status_code == 403, (method, r.text)
            assert "viewer" in r.json()["message"]
    assert await central_value(db, owner, key) == (10, 1)


async def test_an_op_writes_with_a_version_check(server: ApiServer,
                                                 db: asyncpg.Connection) -> None:
    owner, key = "dag:op/test", "cursor"
    op = {"Authorization": f"Bearer {server.login('op')}"}
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        r = await client.put(state_path(owner, key), json={"value": 1, "expected_version": 0},
                             headers=op)
        assert (r.status_code, r.json()["version"]) == (200, 1), r.text
        r = await client.put(state_path(owner, key), json={"value": 2, "expected_version": 0},
                             headers=op)
        assert (r.status_code, r.json()["error"]) == (409, "version_conflict")
        r = await client.put(state_path(owner, key), json={"value": 2, "expected_version": 1},
                             headers=op)
        assert (r.status_code, r.json()["updated_by"]) == (200, r.json()["updated_by"])
        assert r.json()["updated_by"].startswith("api-server@")
    assert await central_value(db, owner, key) == (2, 2)


async def test_a_machine_token_works_within_its_owners(server: ApiServer,
                                                       db: asyncpg.Connection) -> None:
    machine = {"Authorization": f"Bearer {MACHINE_TOKEN}"}
    owner = f"{MACHINE_PREFIX}machine"
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        r = await client.put(state_path(owner, "watermark"), json={"value": 5}, headers=machine)
        assert r.status_code == 200, r.text
        r = await client.get(state_path(owner, "watermark"), headers=machine)
        assert r.json()["value"] == 5
        r = await client.put(state_path("dag:other", "k"), json={"value": 1}, headers=machine)
        assert r.status_code == 403
    assert await central_value(db, owner, "watermark") == (5, 1)
    assert await central_value(db, "dag:other", "k") == (None, 0)


# -- airflow db migrate --------------------------------------------------------------------------


Snapshot = tuple[tuple[tuple[object, ...], ...], tuple[str, ...], tuple[tuple[str, str], ...],
                 tuple[str, ...]]


async def _schema_snapshot(db: asyncpg.Connection) -> Snapshot:
    rows = await db.fetch("SELECT version, description, applied_at FROM localstate_schema "
                          "ORDER BY version")
    heads = await db.fetch("SELECT version_num FROM localstate_alembic_version")
    columns = await db.fetch(
        "SELECT column_name, data_type FROM information_schema.columns "
        "WHERE table_name = 'localstate_state_variable' ORDER BY column_name")
    options = await db.fetchval("SELECT reloptions FROM pg_class "
                                "WHERE relname = 'localstate_state_variable'")
    return (tuple(tuple(r) for r in rows), tuple(str(h[0]) for h in heads),
            tuple((str(c[0]), str(c[1])) for c in columns), tuple(options or ()))


async def test_airflow_db_migrate_creates_the_tables_and_twice_changes_nothing(
        migrated: tuple[Deployment, str], db: asyncpg.Connection) -> None:
    d, _ = migrated
    first = await _schema_snapshot(db)
    versions, heads, columns, options = first
    assert [v[0] for v in versions] == [m.version for m in MIGRATIONS]
    assert heads == (revision_id(LATEST_VERSION),)
    assert ("writer", "character varying") in columns
    assert "fillfactor=50" in options  # the steps' own DDL ran, not a create_all
    migrate(d)
    assert await _schema_snapshot(db) == first


async def test_a_db_upgraded_by_localstate_is_current_for_airflow(
        pg_server: PostgresServer, tmp_path: Path) -> None:
    """`localstate db upgrade` first (a triggerer opened a store), then `airflow db migrate`:
    Airflow's revisions find every step applied, change nothing, and record the head."""
    d = new_airflow(pg_server, tmp_path)
    central = await CentralStore.open(central_url_of(d.env[
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]))
    await central.close()
    conn = await asyncpg.connect(d.airflow_dsn)
    try:
        before = await conn.fetch("SELECT * FROM localstate_schema ORDER BY version")
        migrate(d)
        after = await conn.fetch("SELECT * FROM localstate_schema ORDER BY version")
        heads = await conn.fetch("SELECT version_num FROM localstate_alembic_version")
    finally:
        await conn.close()
    assert [tuple(r) for r in after] == [tuple(r) for r in before]
    assert [h[0] for h in heads] == [revision_id(LATEST_VERSION)]


# -- the asset_state_store mirror ---------------------------------------------------------------


async def _active_asset(db: asyncpg.Connection, name: str) -> int:
    """An asset Airflow considers active (what the scheduler makes of a DAG's asset)."""
    asset_id = await db.fetchval(
        "INSERT INTO asset (name, uri, \"group\", extra, created_at, updated_at) "
        "VALUES ($1, $2, 'asset', '{}', now(), now()) RETURNING id", name, f"test://{name}")
    await db.execute("INSERT INTO asset_active (name, uri) VALUES ($1, $2)", name,
                     f"test://{name}")
    return int(asset_id)


async def test_a_flush_mirrors_asset_watermarks_into_asset_state_store(
        migrated: tuple[Deployment, str], server: ApiServer, db: asyncpg.Connection) -> None:
    d = migrated[0]
    asset_id = await _active_asset(db, ASSET)
    central = await CentralStore.open(central_url_of(d.env[
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]))
    central.asset_mirror = AssetMirror("auto")
    admin = {"Authorization": f"Bearer {server.login('admin')}"}
    policies = PolicyMap("reject")
    try:
        await central.write_batch([
            DirtyRow(OWNER, "watermark", "41", 1, 0, 1.0e9, "triggerer-1"),
            DirtyRow(OWNER, "cursor", '{"page": 3}', 1, 0, 1.0e9, "triggerer-1"),
            DirtyRow("asset_watcher:no-such-asset", "watermark", "1", 1, 0, 1.0e9, "t"),
            DirtyRow("dag:etl/load", "watermark", "7", 1, 0, 1.0e9, "triggerer-1"),
        ], policies, writer="w1")

        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            # Airflow's own reader of the asset's state (its REST API, as its UI shows it)
            r = await client.get(f"/api/v2/assets/{asset_id}/state-store/watermark",
                                 headers=admin)
            assert r.status_code == 200, r.text
            assert r.json()["value"] == 41
            assert r.json()["last_updated_by"]["kind"] == "watcher"
            r = await client.get(f"/api/v2/assets/{asset_id}/state-store/cursor", headers=admin)
            assert r.json()["value"] == {"page": 3}

            # the next flush moves it; a stale write of another writer keeps the central record
            await central.write_batch([
                DirtyRow(OWNER, "watermark", "42", 2, 1, 1.0e9 + 1, "triggerer-1")],
                policies, writer="w1")
            outcomes = await central.write_batch([
                DirtyRow(OWNER, "watermark", "40", 2, 1, 1.0e9 + 2, "triggerer-2")],
                policies, writer="w2")
            assert outcomes[0].resolution == "adopted"
            r = await client.get(f"/api/v2/assets/{asset_id}/state-store/watermark",
                                 headers=admin)
            assert r.json()["value"] == 42

            # a deletion deletes Airflow's row
            await central.write_batch([
                DirtyRow(OWNER, "cursor", None, 2, 1, 1.0e9 + 3, "triggerer-1")],
                policies, writer="w1")
            r = await client.get(f"/api/v2/assets/{asset_id}/state-store/cursor", headers=admin)
            assert r.status_code == 404
    finally:
        await central.close()
    stored = await db.fetch("SELECT a.name, s.key, s.value FROM asset_state_store s "
                            "JOIN asset a ON a.id = s.asset_id ORDER BY a.name, s.key")
    assert [tuple(r) for r in stored] == [(ASSET, "watermark", "42")]
    assert orjson.loads(stored[0]["value"]) == 42


# -- the state page inside Airflow's UI, in headless Chromium -----------------------------------


async def test_the_state_page_in_airflows_ui_in_chromium(
        server: ApiServer, db: asyncpg.Connection, tmp_path: Path) -> None:
    """Log in through SimpleAuthManager, open Browse → State variables, see the table, edit a
    value with its version check (and meet a conflict when a triggerer wrote meanwhile)."""
    from playwright.async_api import async_playwright, expect
    from test_ui_browser import ARGS, CHROMIUM

    owner = f"{MACHINE_PREFIX}ui"
    machine = {"Authorization": f"Bearer {MACHINE_TOKEN}"}
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        for key, value in (("watermark", 41), ("cursor", 7)):
            r = await client.put(state_path(owner, key), json={"value": value},
                                 headers=machine)
            assert r.status_code == 200, r.text

        async with async_playwright() as pw:
            browser = await pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            try:
                page = await browser.new_page(viewport={"width": 1400, "height": 900})
                errors: list[str] = []
                page.on("pageerror", lambda exc: errors.append(str(exc)))
                await page.goto(server.url + "/", timeout=120_000)
                # SimpleAuthManager's login page
                await page.locator("input[name=username]").fill("admin")
                await page.locator("input[name=password]").fill("admin-pw")
                await page.get_by_role("button", name="Sign in").click()
                # Airflow's navigation: Browse, then our entry
                await page.get_by_role("button", name="Browse").click(timeout=120_000)
                await page.get_by_role("menuitem", name="State variables").click()
                # Airflow's route of the view (it appends the framed page's own path)
                await expect(page).to_have_url(re.compile(
                    re.escape(f"{server.url}/plugin/localstate") + r"(/localstate/)?$"))
                frame = page.frame_locator("iframe")
                await frame.locator("#owner-filter").fill(owner)
                await frame.locator("#filter-apply").click()
                rows = frame.locator("#rows tr")
                await expect(rows).to_have_count(2, timeout=60_000)
                await expect(frame.locator("#token-form")).to_be_hidden()  # the session is enough
                wm = frame.locator(f'#rows tr[data-owner="{owner}"][data-key="watermark"]')
                await expect(wm.locator("td.value")).to_have_text("41")

                # edit with the version check: confirmed in the page, written at version 2
                await wm.locator("button.edit").click()
                await expect(frame.locator("#edit-version")).to_have_text("1")
                await frame.locator("#edit-value").fill("42")
                await frame.locator("#edit-save").click()
                await expect(frame.locator("#edit-question")).to_contain_text("version 1")
                await frame.locator("#edit-confirm-save").click()
                await expect(wm.locator("td.version")).to_have_text("2")
                await expect(wm.locator("td.value")).to_have_text("42")
                await expect(wm.locator("td.updated-by")).to_contain_text("api-server@")

                # a triggerer writes meanwhile: the stale edit changes nothing, the page says so
                r = await client.put(state_path(owner, "cursor"), json={"value": 8},
                                     headers=machine)
                assert r.json()["version"] == 2
                cursor = frame.locator(f'#rows tr[data-owner="{owner}"][data-key="cursor"]')
                await cursor.locator("button.edit").click()
                await frame.locator("#edit-value").fill("99")
                await frame.locator("#edit-save").click()
                await frame.locator("#edit-confirm-save").click()
                await expect(frame.locator("#edit-error")).to_contain_text(
                    "changed meanwhile (now at version 2)")
                await expect(cursor.locator("td.value")).to_have_text("8")
                shot = tmp_path / "localstate-in-airflow.png"
                await page.screenshot(path=str(shot), full_page=True)
                assert errors == []
            finally:
                await browser.close()
    print(f"screenshot: {shot}")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert await central_value(db, owner, "watermark") == (42, 2)
    assert await central_value(db, owner, "cursor") == (8, 2)
