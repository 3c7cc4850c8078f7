"""The deployment guide (docs/deploy.md), followed step by step with real Airflow 3.3 processes.

Its two ``airflow.cfg`` blocks are used as written: the API server's (``api_tokens``) and the
triggerer's (``sink = api``, ``api_url``, ``api_token``, ``conflict_policy``, ``cache_dir``,
``triggerer_id``), each process reading its own file through ``AIRFLOW_CONFIG``. Only what
names this machine's hosts and folders is overridden through the environment, as the guide
says one may: the metadata DB, the API server's address in ``api_url``, and ``cache_dir``.

Then the guide's steps: ``airflow db migrate``; ``airflow api-server``; the dag processor and
the scheduler (with the guide's example DAG, whose trigger module ships in the package);
``airflow triggerer``; and the guide's checks: ``airflow plugins``, ``airflow providers list``,
the health route, ``localstate config``. Done when the watcher's watermark, moved by rows
added to its table, is read back through the API server with the guide's read token.
"""

from __future__ import annotations

import asyncio
import configparser
import dataclasses
import json
import re
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import asyncpg
import httpx
import pytest
from airflow_api_server import api_server, free_port, migrate
from airflow_harness import (
    AIRFLOW,
    ROOT,
    Deployment,
    fast_loops,
    new_deployment,
    stop,
    wait_for,
    within,
)

from localstate._testing.postgres_server import PostgresServer

pytestmark = pytest.mark.postgres

GUIDE = ROOT / "docs" / "deploy.md"
DAG_FILES = [ROOT / "localstate" / "examples" / name
             for name in ("new_rows_dag.py", "new_rows_events_dag.py")]
OWNER = "asset_watcher:new_orders"
#: the exactly-once example's asset: one event per row
EVENTS_ASSET = "order_rows"
BOUND = 300.0


def _guide_configs() -> tuple[str, str]:
    """The guide's API-server and triggerer airflow.cfg blocks, as written."""
    blocks = re.findall(r"^```ini\n(.*?)^```$", GUIDE.read_text(), re.S | re.M)
    server = [b for b in blocks if "\napi_tokens = " in b]
    triggerer = [b for b in blocks if "\nsink = api\n" in b]
    assert len(server) == 1
    assert len(triggerer) == 1
    return server[0], triggerer[0]


def _tokens(server_cfg: str) -> tuple[str, str]:
    """The guide's read-write and read tokens."""
    cfg = configparser.ConfigParser(interpolation=None)
    cfg.read_string(server_cfg)
    entries = [e.strip().split(":", 2) for e in cfg["localstate"]["api_tokens"].split(",")]
    by_role = {role: token for token, role, _ in entries}
    return by_role["read-write"], by_role["read"]


@pytest.fixture
def deployment(pg_server: PostgresServer, tmp_path: Path) -> Deployment:
    dags = tmp_path / "dags"
    dags.mkdir()
    for dag_file in DAG_FILES:
        shutil.copy(dag_file, dags / dag_file.name)
    source = tmp_path / "orders.db"
    with sqlite3.connect(source) as db:
        db.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, amount INTEGER)")
    port = free_port()
    return new_deployment(pg_server, tmp_path, env={
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__API__HOST": "127.0.0.1",
        "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{port}",
        "AIRFLOW__API__WORKERS": "1",
        "AIRFLOW__API_AUTH__JWT_SECRET": "localstate-tests-jwt-secret-0123456789abcdef",
        **fast_loops(dags),
        "AIRFLOW__TRIGGERER__JOB_HEARTBEAT_SEC": "1",
        "LOCALSTATE_EXAMPLE_DSN": f"sqlite:///{source}",
        "LOCALSTATE_EXAMPLE_ACK_DELAY": "1",
    })


def _side(d: Deployment, cfg_text: str, name: str, **env: str) -> Deployment:
    """`d` for one side of the guide: its airflow.cfg through AIRFLOW_CONFIG."""
    path = d.home / f"{name}.cfg"
    path.write_text(cfg_text)
    return dataclasses.replace(d, env={**d.env, "AIRFLOW_CONFIG": str(path), **env})


def _airflow(d: Deployment, *args: str) -> str:
    done = subprocess.run([str(AIRFLOW), *args], env=d.env, capture_output=True, text=True,
                          timeout=180, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


def _localstate_config(d: Deployment) -> str:
    done = subprocess.run([sys.executable, "-m", "localstate.cli", "config"], env=d.env,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


async def test_the_deployment_guide_brings_up_a_working_watcher(
        deployment: Deployment, tmp_path: Path) -> None:
    await within(BOUND, _follow_the_guide(deployment, tmp_path), deployment)


async def _follow_the_guide(d: Deployment, tmp_path: Path) -> None:
    server_cfg, triggerer_cfg = _guide_configs()
    _, read_token = _tokens(server_cfg)
    server = _side(d, server_cfg, "api-server")
    url = d.env["AIRFLOW__API__BASE_URL"]
    cache_dir = tmp_path / "localstate-cache"
    triggerer = _side(d, triggerer_cfg, "triggerer",
                      AIRFLOW__LOCALSTATE__API_URL=f"{url}/localstate",
                      AIRFLOW__LOCALSTATE__CACHE_DIR=str(cache_dir))

    # 5. migrate and start
    await asyncio.to_thread(migrate, server)
    with api_server(server) as api:
        procs = [triggerer.start("triggerer", "triggerer"),
                 server.start("dag-processor", "dag-processor"),
                 server.start("scheduler", "scheduler", "--skip-serve-logs")]
        try:
            # 6. the guide's checks
            plugins = json.loads(await asyncio.to_thread(_airflow, server, "plugins", "-o",
                                                         "json"))
            assert "localstate" in [p["name"] for p in plugins]  # (providers add their own)
            providers = json.loads(await asyncio.to_thread(_airflow, server, "providers",
                                                           "list", "-o", "json"))
            assert "localstate" in [p["package_name"] for p in providers]
            async with httpx.AsyncClient(base_url=api.url, timeout=30) as client:
                health = (await client.get("/localstate/api/v1/health")).json()
                assert health["status"] == "ok"
                assert health["auth_required"] is True
            shown = await asyncio.to_thread(_localstate_config, triggerer)
            assert re.search(r"^sink\b.*\bapi\b", shown, re.M), shown
            assert "triggerer-0" in shown
            assert read_token not in shown  # the secret is never shown

            # the watcher runs: rows in its table move its watermark, which the triggerer
            # flushes through the API server (sink = api) to the metadata DB
            with sqlite3.connect(tmp_path / "orders.db") as db:
                db.executemany("INSERT INTO orders (amount) VALUES (?)",
                               [(1,) for _ in range(250)])

            async def watermark() -> int:
                async with httpx.AsyncClient(
                        base_url=api.url, timeout=30,
                        headers={"Authorization": f"Bearer {read_token}"}) as client:
                    r = await client.get(f"/localstate/api/v1/state/{OWNER}/watermark")
                if r.status_code == 404:
                    return 0
                assert r.status_code == 200, r.text
                return int(r.json()["value"])

            async def caught_up() -> bool:
                return await watermark() == 250

            await wait_for("the watermark of 250 rows through the API server", caught_up, d,
                           BOUND)

            # the exactly-once example: one asset event per row, each once
            async def row_events() -> list[int]:
                db = await asyncpg.connect(d.airflow_dsn)
                try:
                    rows = await db.fetch(
                        "SELECT e.extra FROM asset_event e JOIN asset a ON a.id = e.asset_id "
                        "WHERE a.name = $1 ORDER BY e.id", EVENTS_ASSET)
                finally:
                    await db.close()
                extras = [json.loads(r["extra"]) if isinstance(r["extra"], str) else r["extra"]
                          for r in rows]
                return [int(extra["payload"]["id"]) for extra in extras]

            async def all_rows_evented() -> bool:
                return len(await row_events()) >= 250

            await wait_for("an asset event per row", all_rows_evented, d, BOUND)
            assert await row_events() == list(range(1, 251))
            # the triggerer's cache is where the guide put it, named after its triggerer_id
            assert (cache_dir / "triggerer-0.db").is_file()
        finally:
            for proc in procs:
                stop(proc)
