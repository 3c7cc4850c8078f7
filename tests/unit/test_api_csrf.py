"""Cross-site request forgery: no write from another site's page, over HTTP (the real app).

A browser attaches its cookies (Airflow's ``_token`` login) to any request, whoever's page makes
it. Every unsafe route is tried with each way a page on another origin (or a form) can send it:
nothing is written and each answer is 403 ``csrf``. A write with a bearer token, and the page's
own script (its Origin, its header, JSON), still go through.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import pytest_asyncio
from api_paths import path
from conftest import StoreFactory
from csrf_attacks import (
    ATTACKS,
    BASE,
    COOKIE,
    OWNER,
    PROOF,
    ROUTE_IDS,
    ROUTES,
    attack_body,
)
from test_api import client_for

from localstate import Settings
from localstate._sync.central.central_store import CentralStore
from localstate.api import create_app
from localstate.api._csrf import origin_of


@pytest.fixture
def backend() -> str:
    """The guard runs before any DB: one backend is enough."""
    return "sqlite"


TOKEN = "csrf-test-token-0123456789abcdef"


@pytest_asyncio.fixture
async def open_api(open_store: StoreFactory, central_url: str
                   ) -> AsyncIterator[tuple[httpx.AsyncClient, CentralStore]]:
    """The API with no token (`api_open`): only the CSRF guard stands between a page and it."""
    store = await open_store(triggerer_id="api-server")
    central = await CentralStore.open(central_url)
    try:
        async with client_for(create_app(store.settings, local=store, tokens=())) as client:
            yield client, central
    finally:
        await central.close()


async def _rows(central: CentralStore) -> list[Any]:
    return await central.read_owner(OWNER)


@pytest.mark.parametrize(("method", "url", "body"), ROUTES, ids=ROUTE_IDS)
@pytest.mark.parametrize(("attack", "headers", "form"), ATTACKS, ids=[a[0] for a in ATTACKS])
async def test_every_unsafe_route_refuses_a_forged_browser_write(
        open_api: tuple[httpx.AsyncClient, CentralStore], method: str, url: str,
        body: dict[str, Any] | None, attack: str, headers: dict[str, str], form: str) -> None:
    client, central = open_api
    sent = dict(headers)
    content = attack_body(body, form)
    if content is None and method != "DELETE":
        sent.pop("Content-Type", None)
    r = await client.request(method, url, content=content, headers=sent)
    assert r.status_code == 403, (attack, r.text)
    assert r.json()["error"] == "csrf"
    assert await _rows(central) == []
    assert (await central.read_fleet()) == []


@pytest.mark.parametrize(("method", "url", "body"), ROUTES[:2] + ROUTES[4:5], ids=ROUTE_IDS[:2]
                         + ROUTE_IDS[4:5])
async def test_the_pages_own_script_still_writes(
        open_api: tuple[httpx.AsyncClient, CentralStore], method: str, url: str,
        body: dict[str, Any] | None) -> None:
    client, _central = open_api
    if method == "DELETE":  # something to delete
        await client.put(path(OWNER, "wm"), json={"value": 0})
    page = {**COOKIE, **PROOF, "Origin": BASE}
    r = await client.request(method, url, json=body, headers=page)
    assert r.status_code in (200, 204), r.text
    # a Referer of the same origin stands for a missing Origin
    if method == "PUT":
        r = await client.request(method, url, json=body,
                                 headers={**COOKIE, **PROOF, "Referer": f"{BASE}/index.html"})
        assert r.status_code == 200, r.text


async def test_scripts_without_a_browser_and_bearer_tokens_are_not_asked(
        open_store: StoreFactory, central_url: str) -> None:
    store = await open_store(triggerer_id="api-server")
    tokens = Settings.resolve({"api_tokens": f"{TOKEN}:read-write:*"}).api_tokens
    async with client_for(create_app(store.settings, local=store, tokens=tokens)) as client:
        bearer = {"Authorization": f"Bearer {TOKEN}"}
        # a bearer token: a browser never attaches one on its own, whatever the Origin
        r = await client.put(path(OWNER, "a"), json={"value": 1},
                             headers={**bearer, "Origin": "https://evil.example"})
        assert r.status_code == 200, r.text
        r = await client.put(path(OWNER, "b"), json={"value": 1}, headers=bearer)
        assert r.status_code == 200, r.text
        # no token, no browser: the token check answers (401), not the CSRF guard
        r = await client.put(path(OWNER, "c"), json={"value": 1})
        assert r.status_code == 401


async def test_a_trusted_origin_may_write(open_store: StoreFactory) -> None:
    store = await open_store(triggerer_id="api-server")
    settings = Settings.resolve({"api_trusted_origins": "https://airflow.example.com",
                                 "central_url": store.settings.central_url})
    async with client_for(create_app(settings, local=store, tokens=())) as client:
        page = {**COOKIE, **PROOF}
        r = await client.put(path(OWNER, "a"), json={"value": 1},
                             headers={**page, "Origin": "https://airflow.example.com"})
        assert r.status_code == 200, r.text
        r = await client.put(path(OWNER, "a"), json={"value": 2},
                             headers={**page, "Origin": "https://airflow.example.com.evil.io"})
        assert r.status_code == 403


def test_origins_compare_with_their_default_ports() -> None:
    assert origin_of("http://Host") == origin_of("http://host:80") == "http://host:80"
    assert origin_of("https://host/x?y") == "https://host:443"
    assert origin_of("host:8080") == "http://host:8080"
    assert origin_of("null") is None
    assert origin_of("javascript:alert(1)") is None
    assert origin_of("http://[::1]:99") == "http://[::1]:99"


def test_the_setting_takes_origins_only() -> None:
    assert Settings.resolve({"api_trusted_origins": "https://a.example, http://b:8080"}
                            ).api_trusted_origins == ("https://a.example", "http://b:8080")
    with pytest.raises(Exception, match="not an origin"):
        Settings.resolve({"api_trusted_origins": "https://a.example/path"})
