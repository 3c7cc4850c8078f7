"""`LocalStateMount` as Airflow's API server runs it: mounted at /localstate in a parent app
whose lifespan is Airflow's own (it enters the lifespans of mounted FastAPI apps), under a
live uvicorn on loopback. The served app is a real one over a real SQLite central DB.

* nothing opens before the first request; concurrent first requests open it once;
* an opening that fails answers 503 (JSON, nothing leaked) and the next request opens it;
* routes work under the mount, names with an encoded '/' included (the raw-path routing
  honours the mount's root_path);
* the server's shutdown closes what the first request opened.
"""

from __future__ import annotations

import asyncio
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest_asyncio
import uvicorn
from fastapi import FastAPI
from starlette.exceptions import StarletteDeprecationWarning
from starlette.types import ASGIApp

from localstate import Settings
from localstate._sync.central.central_store import CentralStore
from localstate.airflow._mount import LocalStateMount
from localstate.api import create_app
from localstate.errors import CentralUnavailable

with warnings.catch_warnings():  # Airflow's API server imports Starlette's test client
    warnings.simplefilter("ignore", StarletteDeprecationWarning)
    from airflow.api_fastapi.app import lifespan as airflow_lifespan

TOKEN = "mount-test-token-0123456789"


class Opener:
    """Opens the app over a store on `central_url`; fails while `failures` remain."""

    def __init__(self, tmp_path: Path, failures: int = 0) -> None:
        tmp_path.mkdir()
        self.central_url = f"sqlite:///{tmp_path / 'central.db'}"
        self.cache = tmp_path / "cache.db"
        self.failures = failures
        self.opened = 0
        self.closed = 0

    async def __call__(self) -> tuple[ASGIApp, Callable[[], Awaitable[None]]]:
        await asyncio.sleep(0.2)  # an opening takes a while: concurrent requests meet it
        if self.failures:
            self.failures -= 1
            raise CentralUnavailable("central DB test failed to open: connection refused")
        self.opened += 1
        # as `localstate.airflow._serving` does: settings and one central DB, no local store
        central = await CentralStore.open(self.central_url)
        settings = Settings.resolve({"central_url": self.central_url,
                                     "triggerer_id": "mounted",
                                     "api_tokens": f"{TOKEN}:read-write:*"})

        async def close() -> None:
            self.closed += 1
            await central.close()

        return create_app(settings, central=central), close


@pytest_asyncio.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[str, Opener, list[Opener]]]:
    """A parent app with Airflow's lifespan and the mount, on a live uvicorn."""
    openers = [Opener(tmp_path / "a"), Opener(tmp_path / "b", failures=1)]
    parent = FastAPI(lifespan=airflow_lifespan)
    parent.mount("/localstate", LocalStateMount(openers[0]))
    parent.mount("/failing", LocalStateMount(openers[1]))
    server = uvicorn.Server(uvicorn.Config(parent, host="127.0.0.1", port=0,
                                           log_level="warning", lifespan="on"))
    task = asyncio.get_running_loop().create_task(server.serve())
    for _ in range(500):
        if server.started or task.done():
            break
        await asyncio.sleep(0.02)
    assert server.started, "uvicorn did not start"
    port = server.servers[0].sockets[0].getsockname()[1]
    yield f"http://127.0.0.1:{port}", openers[0], openers
    server.should_exit = True
    await task
    for o in openers:  # Airflow's lifespan closed what the requests opened
        assert o.closed == o.opened


async def test_opens_once_at_the_first_requests(served: tuple[str, Opener, list[Opener]]
                                                ) -> None:
    url, opener, _ = served
    assert opener.opened == 0
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        answers = await asyncio.gather(*(client.get("/localstate/api/v1/health")
                                         for _ in range(5)))
    assert [a.json()["status"] for a in answers] == ["ok"] * 5
    assert opener.opened == 1


async def test_a_failed_opening_is_503_then_retried(served: tuple[str, Opener, list[Opener]]
                                                   ) -> None:
    url, _, openers = served
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        r = await client.get("/failing/api/v1/health")
        assert r.status_code == 503
        assert r.json()["error"] == "store_unavailable"
        assert r.headers["retry-after"] == "5"
        r = await client.get("/failing/api/v1/health")
        assert (r.status_code, r.json()["status"]) == (200, "ok")
    assert openers[1].opened == 1


async def test_state_routes_under_the_mount(served: tuple[str, Opener, list[Opener]]) -> None:
    url, _, _ = served
    auth = {"Authorization": f"Bearer {TOKEN}"}
    owner, key = "dag:etl/load", "cursor/"  # '/' inside both names, one at the end
    path = f"/localstate/api/v1/state/{quote(owner, safe='')}/{quote(key, safe='')}"
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        assert (await client.get(path)).status_code == 401
        r = await client.put(path, json={"value": {"offset": 3}}, headers=auth)
        assert (r.status_code, r.json()["owner"], r.json()["key"]) == (200, owner, key), r.text
        r = await client.get(path, headers=auth)
        assert r.json()["value"] == {"offset": 3}
        r = await client.get("/localstate/api/v1/state", headers=auth)
        assert [(i["owner"], i["key"]) for i in r.json()["items"]] == [(owner, key)]
        page = await client.get("/localstate/")
        assert page.status_code == 200
        assert (await client.get("/localstate/ui/app.js")).status_code == 200
