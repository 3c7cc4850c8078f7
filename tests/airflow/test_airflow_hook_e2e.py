"""`LocalStateHook` in a real DAG run: the ``localstate`` connection type end to end.

On the suite's PostgreSQL, real Airflow 3.3 processes: ``airflow db migrate``, the API server
with localstate's plugin, the dag processor and the scheduler with the LocalExecutor. The
connections come from the environment, as an operator gives them:

* ``AIRFLOW_CONN_LOCALSTATE_DEFAULT``: the plugin's URL and the DAG's own token (read-write,
  owners ``dag:localstate_hook_e2e/`` and the watcher it reads, ``asset_watcher:orders``);
* ``AIRFLOW_CONN_LOCALSTATE_OTHER``: another DAG's token (``dag:some_other_dag/`` only).

A watcher's watermark is written beforehand under ``asset_watcher:orders`` with the
triggerers' machine token, as a triggerer with ``sink = api`` writes it. The DAG's tasks
(`DAG`): a ``@task`` reads the watermark and writes its own ``dag:`` state with the blocking
calls, the async twins, a compare-and-set and `StateVariable` (``sink = api`` with no
``api_url``: the same connection), and tries the other DAG's token (403); an
operator subclass writes through the hook in ``execute``. Then the test reads that state
through the REST API the UI page uses (as an Airflow user) and through ``localstate get`` /
``ls``; ``airflow providers hooks`` lists the connection type; Airflow's Connections form
shows its two fields in Chromium.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from urllib.parse import quote

import asyncpg
import httpx
import pytest
import pytest_asyncio
from airflow_api_server import MACHINE_TOKEN, ApiServer, api_server, migrate, new_airflow
from airflow_harness import AIRFLOW, Deployment, fast_loops, stop, wait_for

from localstate._testing.postgres_server import PostgresServer

pytestmark = pytest.mark.postgres

DAG_ID = "localstate_hook_e2e"
DAG_TOKEN = "dag-hook-e2e-token-0123456789abcdef"
OTHER_TOKEN = "dag-other-token-0123456789abcdef"
WATERMARK = 4242

DAG = f'''
import asyncio
import os

from airflow.sdk import DAG, BaseOperator, task

from localstate.airflow.hook import LocalStateHook
from localstate.blocking import StateVariable
from localstate.errors import AccessDenied, VersionConflict


@task
def load(ti=None):
    hook = LocalStateHook()  # localstate_default
    owner = LocalStateHook.task_owner(ti.dag_id, ti.task_id)
    seen = hook.get("asset_watcher:orders", "watermark", default=-1)
    rec = hook.record(owner, "cursor")
    written = hook.compare_and_set(owner, "cursor", seen,
                                   expected_version=rec.version if rec else 0)
    try:  # the same version again: someone else's write would look like this
        hook.compare_and_set(owner, "cursor", seen + 1, expected_version=0)
        conflict = "none"
    except VersionConflict as exc:
        conflict = f"expected {{exc.expected}}, found {{exc.actual}}"
    try:
        LocalStateHook("localstate_other").set(owner, "cursor", -1)
        refused = "not refused"
    except AccessDenied as exc:
        refused = f"{{exc.status}} {{exc}}"

    async def twins():
        seen_async = await hook.aget("asset_watcher:orders", "watermark")
        await hook.aset(owner, "async_seen", seen_async)
        return [r.key async for r in hook.alist(owner)]

    keys = asyncio.run(twins())
    # the short path: the workers' [localstate] says sink = api and names no api_url, so
    # StateVariable goes through the same connection
    os.environ["AIRFLOW__LOCALSTATE__SINK"] = "api"
    os.environ["AIRFLOW__LOCALSTATE__ENABLED"] = "false"
    StateVariable.set("short_path", seen, owner=owner)
    hook.set(owner, "report", {{"version": written.version, "conflict": conflict,
                               "refused": refused, "keys": keys}})


class StampOperator(BaseOperator):
    def execute(self, context):
        hook = LocalStateHook(localstate_conn_id="localstate_default")
        owner = LocalStateHook.task_owner(self.dag_id, self.task_id)
        hook.set(owner, "stamp", {{"run_id": context["run_id"]}})
        hook.set(owner, "gone", 1)
        assert hook.delete(owner, "gone") is True
        assert hook.get(owner, "gone", default="absent") == "absent"


with DAG("{DAG_ID}", schedule=None, catchup=False):
    load() >> StampOperator(task_id="stamp")
'''


def _connection(token: str, url: str) -> str:
    return json.dumps({"conn_type": "localstate", "host": f"{url}/localstate",
                       "password": token})


@pytest.fixture(scope="module")
def deployment(pg_server: PostgresServer, tmp_path_factory: pytest.TempPathFactory
               ) -> Deployment:
    tmp = tmp_path_factory.mktemp("airflow-hook")
    dags = tmp / "dags"
    dags.mkdir()
    (dags / "localstate_hook_e2e.py").write_text(DAG)
    d = new_airflow(pg_server, tmp, extra_tokens=[
        {"token": DAG_TOKEN, "role": "read-write", "name": f"dag-{DAG_ID}",
         "owners": [f"dag:{DAG_ID}/", "asset_watcher:orders"]},
        {"token": OTHER_TOKEN, "role": "read-write", "name": "dag-some_other_dag",
         "owners": ["dag:some_other_dag/"]},
    ])
    url = d.env["AIRFLOW__API__BASE_URL"]
    d.env.update({
        **fast_loops(dags, executor="LocalExecutor"),
        "AIRFLOW_CONN_LOCALSTATE_DEFAULT": _connection(DAG_TOKEN, url),
        "AIRFLOW_CONN_LOCALSTATE_OTHER": _connection(OTHER_TOKEN, url),
    })
    migrate(d)
    return d


@pytest.fixture(scope="module")
def server(deployment: Deployment) -> Iterator[ApiServer]:
    with api_server(deployment) as s:
        yield s


@pytest_asyncio.fixture
async def db(deployment: Deployment) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(deployment.airflow_dsn)
    try:
        yield conn
    finally:
        await conn.close()


def _state(owner: str, key: str) -> str:
    return f"/localstate/api/v1/state/{quote(owner, safe='')}/{quote(key, safe='')}"


async def _run_the_dag(d: Deployment, db: asyncpg.Connection) -> str:
    """Parse, trigger and run the DAG to its end; its final state."""
    procs = [d.start("dag-processor", "dag-processor"),
             d.start("scheduler", "scheduler", "--skip-serve-logs")]
    try:
        async def parsed() -> bool:
            return bool(await db.fetchval(
                "SELECT count(*) FROM dag WHERE dag_id = $1", DAG_ID))

        await wait_for("the DAG to be parsed", parsed, d, 240)
        await d.run("dags", "trigger", DAG_ID, timeout=240)

        async def finished() -> str | None:
            state = await db.fetchval("SELECT state FROM dag_run WHERE dag_id = $1", DAG_ID)
            return state if state in ("success", "failed") else None

        return str(await wait_for("the DAG run to finish", finished, d, 420))
    finally:
        for proc in procs:
            stop(proc)


@pytest.fixture(scope="module")
def run_state(deployment: Deployment, server: ApiServer) -> str:
    """The watcher's watermark written beforehand (machine token), then one DAG run."""
    r = httpx.put(server.url + _state("asset_watcher:orders", "watermark"),
                  json={"value": WATERMARK},
                  headers={"Authorization": f"Bearer {MACHINE_TOKEN}"}, timeout=60)
    assert r.status_code == 200, r.text

    async def run() -> str:
        db = await asyncpg.connect(deployment.airflow_dsn)
        try:
            return await _run_the_dag(deployment, db)
        finally:
            await db.close()

    return asyncio.run(run())


def test_the_tasks_read_the_watermark_and_write_their_own_state(
        run_state: str, server: ApiServer, deployment: Deployment) -> None:
    assert run_state == "success", deployment.tail()
    admin = {"Authorization": f"Bearer {server.login('admin')}"}
    with httpx.Client(base_url=server.url, headers=admin, timeout=60) as client:
        # what the UI page lists: the DAG's owners, through the plugin's REST API
        r = client.get("/localstate/api/v1/state", params={"owner_prefix": f"dag:{DAG_ID}/"})
        assert r.status_code == 200, r.text
        items = {(i["owner"], i["key"]): i for i in r.json()["items"]}
        load, stamp = f"dag:{DAG_ID}/load", f"dag:{DAG_ID}/stamp"
        assert sorted(items) == sorted([(load, "async_seen"), (load, "cursor"),
                                        (load, "report"), (load, "short_path"),
                                        (stamp, "stamp")])
        assert items[(load, "short_path")]["value"] == WATERMARK
        assert items[(load, "cursor")]["value"] == WATERMARK
        assert items[(load, "cursor")]["version"] == 1
        assert items[(load, "async_seen")]["value"] == WATERMARK
        # written as the DAG's token, whatever the request said
        assert items[(load, "cursor")]["updated_by"] == f"dag-{DAG_ID}"
        report = items[(load, "report")]["value"]
        assert report["version"] == 1
        assert report["conflict"] == "expected 0, found 1"
        assert sorted(report["keys"]) == ["async_seen", "cursor"]
        # the other DAG's token: 403, naming the prefix it lacks
        assert report["refused"].startswith("403 "), report
        assert f"lacks the prefix 'dag:{DAG_ID}/'" in report["refused"], report
        assert items[(stamp, "stamp")]["value"]["run_id"].startswith("manual__")


def test_the_cli_shows_the_tasks_state(run_state: str, server: ApiServer,
                                       deployment: Deployment) -> None:
    assert run_state == "success", deployment.tail()
    env = {**deployment.env, "AIRFLOW__LOCALSTATE__SINK": "api",
           "AIRFLOW__LOCALSTATE__API_URL": f"{server.url}/localstate",
           "AIRFLOW__LOCALSTATE__API_TOKEN": DAG_TOKEN}
    cli = [sys.executable, "-m", "localstate.cli"]
    got = subprocess.run([*cli, "get", f"dag:{DAG_ID}/load", "cursor"], env=env,
                         capture_output=True, text=True, timeout=120, check=False)
    assert got.returncode == 0, got.stdout + got.stderr
    assert str(WATERMARK) in got.stdout
    listed = subprocess.run([*cli, "ls", "--owner", f"dag:{DAG_ID}/"], env=env, capture_output=True,
                            text=True, timeout=120, check=False)
    assert listed.returncode == 0, listed.stdout + listed.stderr
    for key in ("cursor", "report", "async_seen", "short_path", "stamp"):
        assert key in listed.stdout, listed.stdout


def test_airflow_lists_the_connection_type(deployment: Deployment) -> None:
    done = subprocess.run([str(AIRFLOW), "providers", "hooks", "--output", "json"],
                          env=deployment.env, capture_output=True, timeout=300, check=True)
    hooks = {h["connection_type"]: h for h in json.loads(done.stdout)}
    assert "localstate" in hooks, done.stdout.decode()[-2000:]
    assert hooks["localstate"]["class"] == "localstate.airflow.hook.LocalStateHook"
    assert hooks["localstate"]["package_name"] == "localstate"
    assert hooks["localstate"]["conn_id_attribute_name"] == "localstate_conn_id"
    # `airflow connections` takes the type and lists the connection with it
    add = subprocess.run(
        [str(AIRFLOW), "connections", "add", "localstate_cli", "--conn-type", "localstate",
         "--conn-host", "http://airflow-api-server:8080/localstate", "--conn-password",
         DAG_TOKEN], env=deployment.env, capture_output=True, text=True, timeout=300,
        check=False)
    assert add.returncode == 0, add.stdout + add.stderr
    listed = subprocess.run([str(AIRFLOW), "connections", "list", "--output", "json"],
                            env=deployment.env, capture_output=True, text=True, timeout=300,
                            check=True)
    assert {"conn_id": "localstate_cli", "conn_type": "localstate"} in json.loads(listed.stdout)
    got = subprocess.run([str(AIRFLOW), "connections", "get", "localstate_cli", "--output",
                          "json"], env=deployment.env, capture_output=True, text=True,
                         timeout=300, check=True)
    (stored,) = json.loads(got.stdout)
    assert (stored["conn_type"], stored["host"], stored["password"]) == (
        "localstate", "http://airflow-api-server:8080/localstate", DAG_TOKEN)


async def test_the_connections_form_shows_url_and_token_in_chromium(
        server: ApiServer, tmp_path: Path) -> None:
    """Admin → Connections → Add, type ``localstate``: the API URL and Token fields show, the
    fields it does not use do not."""
    from browser import ARGS, CHROMIUM, log_in_to_airflow
    from playwright.async_api import async_playwright, expect

    admin = {"Authorization": f"Bearer {server.login('admin')}"}
    async with httpx.AsyncClient(base_url=server.url, headers=admin, timeout=60) as client:
        r = await client.get("/ui/connections/hook_meta")
        assert r.status_code == 200, r.text
        meta = {m["connection_type"]: m for m in r.json()}
        assert meta["localstate"]["standard_fields"] is not None, meta["localstate"]

    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            page = await browser.new_page(viewport={"width": 1400, "height": 1000})
            await log_in_to_airflow(page, server.url)
            await page.goto(server.url + "/connections", timeout=120_000)
            await page.get_by_role("button", name="Add Connection").click(timeout=120_000)
            form = page.get_by_role("dialog")
            # Airflow's searchable select: type the type's name into it, take the match
            await expect(form.get_by_text("Select Connection Type")).to_be_visible()
            await form.get_by_role("combobox").first.fill("localstate")
            await page.get_by_role("option", name="localstate", exact=True).click()
            # the section of the connection's own fields: opened if it is closed
            standard = form.get_by_role("button", name="Standard Fields")
            if await standard.get_attribute("aria-expanded") != "true":
                await standard.click()
            await expect(standard).to_have_attribute("aria-expanded", "true")
            await expect(form.get_by_text("API URL", exact=True)).to_be_visible(timeout=60_000)
            await expect(form.get_by_text("Token", exact=True)).to_be_visible()
            for hidden in ("Login", "Port", "Schema"):
                await expect(form.get_by_text(hidden, exact=True)).to_have_count(0)
            await expect(form.get_by_placeholder(
                "http://airflow-api-server:8080/localstate")).to_be_visible()
            shot = tmp_path / "localstate-connection-form.png"
            await page.screenshot(path=str(shot), full_page=True)
        finally:
            await browser.close()
    print(f"screenshot: {shot}")
