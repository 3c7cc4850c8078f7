"""The web UI end to end: a live uvicorn on loopback, Debian's Chromium driven by Playwright.

Never `playwright install`: the test launches the system browser at /usr/bin/chromium (the CI
script installs Debian's package when it is absent).
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator
from pathlib import Path

import orjson
import pytest_asyncio
import uvicorn
from browser import ARGS, CHROMIUM
from conftest import StoreFactory
from playwright.async_api import Page, Route, async_playwright, expect

from localstate import Settings
from localstate._core.conflicts import PolicyMap
from localstate._core.rows import DirtyRow
from localstate._sync.central.central_store import CentralStore
from localstate._sync.central.fleet import FleetStatus
from localstate.api import create_app

TOKEN = "ui-browser-token-0123456789"
#: a Viewer's: reads every owner, writes none
READ_TOKEN = "ui-browser-viewer-0123456789"


@pytest_asyncio.fixture
async def live_url(open_store: StoreFactory) -> AsyncIterator[str]:
    """The app over a serving store, on a free loopback port, in this test's event loop."""
    store = await open_store(triggerer_id="ui-api")
    tokens = Settings.resolve(
        {"api_tokens": f"{TOKEN}:read-write:*, {READ_TOKEN}:read:*"}).api_tokens
    config = uvicorn.Config(create_app(store.settings, local=store, tokens=tokens),
                            host="127.0.0.1", port=0, log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    task = asyncio.get_running_loop().create_task(server.serve())
    for _ in range(500):
        if server.started or task.done():
            break
        await asyncio.sleep(0.02)
    assert server.started, "uvicorn did not start"
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task


def row(page: Page, owner: str, key: str) -> object:
    return page.locator(f'#rows tr[data-owner="{owner}"][data-key="{key}"]')


async def test_list_filter_edit_and_conflict_in_chromium(
    live_url: str, open_store: StoreFactory, central_url: str, tmp_path: Path
) -> None:
    triggerer = await open_store(triggerer_id="triggerer-1")
    await triggerer.set("asset_watcher:orders", "watermark", 41)
    await triggerer.set("asset_watcher:users", "watermark", 7)
    await triggerer.set("dag:etl/load", "cursor", {"offset": 10})
    await triggerer.flush()

    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            page = await browser.new_page(viewport={"width": 1280, "height": 800})
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            await page.goto(live_url + "/")

            # tokens are configured: the page asks for one, then lists
            await expect(page.locator("#token-form")).to_be_visible()
            await expect(page.locator("#message")).to_contain_text("needs a token")
            await page.fill("#token", TOKEN)
            await page.click("#token-form button[type=submit]")
            rows = page.locator("#rows tr")
            await expect(rows).to_have_count(3)
            assert await page.evaluate("sessionStorage.getItem('localstate.token')") == TOKEN
            orders = page.locator('#rows tr[data-owner="asset_watcher:orders"]')
            await expect(orders.locator("td.value")).to_have_text("41")
            await expect(orders.locator("td.updated-by")).to_have_text("triggerer-1")
            await expect(orders.locator("td.flush-state")).to_have_text("flushed")
            await expect(page.locator('#rows tr[data-owner="dag:etl/load"] td.value')
                         ).to_have_text('{"offset":10}')

            # the header shows the fleet's flush health and refreshes by itself
            await expect(page.locator("#st-triggerers")).to_have_text(
                "1 (1 flushing · 0 idle · 0 stalled)")
            await expect(page.locator("#st-updated")).to_have_attribute(
                "data-polls", re.compile(r"^([3-9]|\d\d+)$"), timeout=20_000)
            await expect(page.locator("#st-backlog")).to_have_text("0")
            await expect(page.locator("#st-last-flush")).to_contain_text("ago")
            await expect(page.locator("#st-server")).to_contain_text("served by ui-api")
            await expect(page.locator("#me")).to_contain_text("may edit")

            # filter by owner prefix
            await page.fill("#owner-filter", "asset_watcher:")
            await page.click("#filter-apply")
            await expect(rows).to_have_count(2)
            owners = await page.locator("#rows td.owner").all_text_contents()
            assert owners == ["asset_watcher:orders", "asset_watcher:users"]

            # edit a value: confirm, sent with expected_version, the version moves
            await orders.locator("button.edit").click()
            await expect(page.locator("#editor")).to_be_visible()
            await expect(page.locator("#edit-version")).to_have_text("1")
            await page.fill("#edit-value", "42")
            await page.click("#edit-save")
            question = page.locator("#edit-question")
            await expect(question).to_contain_text("asset_watcher:orders / watermark")
            await expect(question).to_contain_text("version 1")
            await page.click("#edit-back")  # not confirmed: nothing is written
            await expect(page.locator("#edit-error")).to_have_text("not saved")
            await expect(orders.locator("td.version")).to_have_text("1")
            await page.click("#edit-save")
            await page.click("#edit-confirm-save")
            await expect(orders.locator("td.version")).to_have_text("2")
            await expect(orders.locator("td.value")).to_have_text("42")
            # the page writes with the token: its name, not the serving process, is who wrote
            await expect(orders.locator("td.updated-by")).to_have_text("token 1")
            await expect(page.locator("#message")).to_contain_text("version 1 → 2")

            # a stale edit: the triggerer wrote meanwhile, so nothing changes and the UI says so
            await triggerer.set("asset_watcher:users", "watermark", 8)
            await triggerer.flush()
            users = page.locator('#rows tr[data-owner="asset_watcher:users"]')
            await users.locator("button.edit").click()
            await page.fill("#edit-value", "99")
            await page.click("#edit-save")
            await page.click("#edit-confirm-save")
            await expect(page.locator("#edit-error")).to_contain_text(
                "changed meanwhile (now at version 2)")
            await expect(users.locator("td.value")).to_have_text("8")
            await expect(page.locator("#edit-version")).to_have_text("2")
            conflict_shot = tmp_path / "localstate-ui-conflict.png"
            await page.screenshot(path=str(conflict_shot), full_page=True)
            await page.click("#edit-cancel")
            await expect(page.locator("#editor")).to_be_hidden()
            await page.click("#filter-clear")
            await expect(rows).to_have_count(3)
            shot = tmp_path / "localstate-ui.png"
            await page.screenshot(path=str(shot), full_page=True)
            assert errors == []
        finally:
            await browser.close()

    for path in (shot, conflict_shot):
        print(f"screenshot: {path}")
        assert path.stat().st_size > 10_000
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    central = await CentralStore.open(central_url)
    try:
        got = await central.read_many([("asset_watcher:orders", "watermark"),
                                       ("asset_watcher:users", "watermark")])
    finally:
        await central.close()
    orders_row = got[("asset_watcher:orders", "watermark")]
    users_row = got[("asset_watcher:users", "watermark")]
    assert orders_row.data is not None
    assert users_row.data is not None
    assert (orjson.loads(orders_row.data), orders_row.version) == (42, 2)
    assert (orjson.loads(users_row.data), users_row.version) == (8, 2)


async def test_the_token_in_the_served_url_logs_the_page_in(
    live_url: str, open_store: StoreFactory
) -> None:
    """`localstate serve` prints its URL with ?token=...: opening it lists at once, and the
    token leaves the address bar."""
    triggerer = await open_store(triggerer_id="triggerer-1")
    await triggerer.set("dag:a", "k", 1)
    await triggerer.flush()
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            page = await browser.new_page()
            await page.goto(f"{live_url}/?token={TOKEN}")
            await expect(page.locator("#rows tr")).to_have_count(1)
            assert page.url == live_url + "/"
            assert await page.evaluate("sessionStorage.getItem('localstate.token')") == TOKEN
        finally:
            await browser.close()


async def test_a_listing_answered_late_never_replaces_a_newer_filters(
    live_url: str, open_store: StoreFactory
) -> None:
    """The page's first listing (every owner) may answer after a filter applied meanwhile:
    the filter's rows stand, the late answer is dropped (in CI, on a loaded machine, the
    Airflow UI test saw the 11 rows of every owner under a filter matching 2)."""
    triggerer = await open_store(triggerer_id="triggerer-1")
    for owner in ("asset_watcher:orders", "asset_watcher:users", "dag:a", "dag:b", "dag:c"):
        await triggerer.set(owner, "watermark", 1)
    await triggerer.flush()
    release = asyncio.Event()
    held: list[str] = []

    async def hold_the_unfiltered_listing(route: Route) -> None:
        if "owner_prefix" not in route.request.url:
            held.append(route.request.url)
            await release.wait()
        await route.continue_()

    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            page = await browser.new_page()
            await page.route(re.compile(r".*/api/v1/state\?.*"), hold_the_unfiltered_listing)
            await page.goto(f"{live_url}/?token={TOKEN}")
            for _ in range(500):
                if held:
                    break
                await asyncio.sleep(0.02)
            assert held, "the page's first listing was never requested"
            await page.fill("#owner-filter", "asset_watcher:")
            await page.click("#filter-apply")
            rows = page.locator("#rows tr")
            await expect(rows).to_have_count(2)
            async with page.expect_response(lambda r: r.url == held[0]):
                release.set()
            await page.wait_for_timeout(500)  # time for the late answer to be handled
            await expect(rows).to_have_count(2)
            owners = await page.locator("#rows td.owner").all_text_contents()
            assert owners == ["asset_watcher:orders", "asset_watcher:users"]
        finally:
            release.set()
            await browser.close()


async def test_the_fleet_view_shows_lag_and_backlog_and_tells_idle_from_stalled(
    live_url: str, open_store: StoreFactory, central_url: str
) -> None:
    """Three triggerers in the fleet table: one that just flushed, and two whose last flush
    is ten minutes old (rows written as their flushes would have, with a 1 s interval): one
    left 17 keys waiting (stalled), one left none (idle: nothing to write since)."""
    triggerer = await open_store(triggerer_id="triggerer-live")
    await triggerer.set("dag:a", "k", 1)
    await triggerer.flush()
    central = await CentralStore.open(central_url)
    try:
        at = time.time() - 600.0
        central.note_fleet(FleetStatus("triggerer-stuck", "far-host", 4242, at, 17, at - 2.5,
                                       3.5, 1.0))
        await central.write_batch([DirtyRow("dag:b", "k", "1", 1, 0, at, "triggerer-stuck")],
                                  PolicyMap())
        central.note_fleet(FleetStatus("triggerer-idle", "far-host", 4343, at, 0, None,
                                       0.0, 1.0))
        await central.write_batch([DirtyRow("dag:c", "k", "1", 1, 0, at, "triggerer-idle")],
                                  PolicyMap())
    finally:
        await central.close()
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            page = await browser.new_page(viewport={"width": 1280, "height": 800})
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            await page.goto(f"{live_url}/?token={TOKEN}")
            fleet = page.locator("#fleet-rows tr")
            await expect(fleet).to_have_count(3)
            live = page.locator('#fleet-rows tr[data-triggerer="triggerer-live"]')
            stuck = page.locator('#fleet-rows tr[data-triggerer="triggerer-stuck"]')
            idle = page.locator('#fleet-rows tr[data-triggerer="triggerer-idle"]')
            # its flush carried its one key: nothing is waiting
            await expect(live.locator("td.backlog")).to_have_text("0")
            await expect(live.locator(".badge")).to_have_text("flushing")
            await expect(idle.locator(".badge")).to_have_text("idle")
            await expect(idle).not_to_have_class(re.compile(r"\bstalled\b"))
            await expect(stuck).to_have_class(re.compile(r"\bstalled\b"))
            await expect(stuck.locator(".badge.stalled")).to_have_text("stalled")
            await expect(stuck.locator("td.host")).to_have_text("far-host:4242")
            await expect(stuck.locator("td.backlog")).to_have_text("17")
            await expect(stuck.locator("td.lag")).to_have_text("2.5 s")
            await expect(stuck.locator("td.since")).to_have_text("10 min ago")
            await expect(page.locator("#fleet-summary")).to_contain_text(
                "3 triggerers")
            await expect(page.locator("#fleet-summary")).to_contain_text("1 stalled · 1 idle")
            # the header sums the fleet: 17 keys waiting, one stalled
            await expect(page.locator("#st-backlog")).to_have_text("17")
            await expect(page.locator("#st-stalled")).to_have_text("1")
            await expect(page.locator("#st-triggerers")).to_have_text(
                "3 (1 flushing · 1 idle · 1 stalled)")
            assert not errors, errors
        finally:
            await browser.close()


async def test_the_watcher_view_shows_events_with_outcomes_watermarks_and_claims(
    live_url: str, open_store: StoreFactory, tmp_path: Path,
) -> None:
    """A watcher that emits, is taken over while its old triggerer goes on (a zombie) and
    replays an event: a Viewer opens its history from the owner's row and sees each event
    once with its outcome, its watermark advances in order and both claims with epochs."""
    owner = "trigger:watched"
    first = await open_store(triggerer_id="triggerer-a", history_watermark_every=0)
    assert await first.claim(owner) == 1
    await first.emit(owner, {"n": 1}, watermark=1)
    await first.flush()
    await first.emit(owner, {"n": 2}, watermark=2)
    await first.flush()
    second = await open_store(triggerer_id="triggerer-b", history_watermark_every=0)
    assert await second.claim(owner) == 2
    await first.emit(owner, {"n": 3}, watermark=3)  # the zombie's
    await first.flush()
    await second.emit(owner, {"n": 2}, watermark=2, key="2")  # a replay
    await second.emit(owner, {"n": 3}, watermark=3)
    await second.flush()

    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            page = await browser.new_page(viewport={"width": 1280, "height": 1000})
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            await page.goto(f"{live_url}/?token={READ_TOKEN}")
            state_row = page.locator(f'#rows tr[data-owner="{owner}"]')
            await expect(state_row).to_have_count(1)
            await expect(state_row.locator("button.edit")).to_have_count(0)  # a Viewer
            await state_row.locator("button.history").click()
            watcher = page.locator("#watcher")
            await expect(watcher).to_have_attribute("data-loaded", owner)
            events = page.locator("#w-rows tr[data-kind=event]")
            await expect(events).to_have_count(5)
            outcomes = [await events.nth(i).get_attribute("data-outcome") for i in range(5)]
            keys = [await events.nth(i).locator("td.key").inner_text() for i in range(5)]
            # newest first
            assert list(zip(keys, outcomes, strict=True)) == [
                ("3", "committed"), ("2", "duplicate"), ("3", "refused"),
                ("2", "committed"), ("1", "committed")]
            claims = page.locator("#w-rows tr[data-kind=claim]")
            await expect(claims).to_have_count(2)
            assert [await claims.nth(i).locator("td.epoch").inner_text() for i in range(2)] \
                == ["2", "1"]
            assert [await claims.nth(i).locator("td.triggerer").inner_text()
                    for i in range(2)] == ["triggerer-b", "triggerer-a"]
            marks = page.locator("#w-marks li")
            await expect(marks).to_have_count(3)
            texts = [await marks.nth(i).inner_text() for i in range(3)]
            assert [t.rsplit(": ", 1)[1] for t in texts] == ["1", "2", "3"]  # in order
            versions = [int(await marks.nth(i).get_attribute("data-version") or 0)
                        for i in range(3)]
            assert versions == sorted(versions)
            assert len(set(versions)) == 3
            await expect(page.locator("#w-events")).to_have_text(
                "3 committed · 1 duplicate · 1 refused · 0 rejected")
            await expect(page.locator("#w-epoch")).to_have_text("2")
            # a link to share: the view opens from the address
            assert f"history={owner.replace(':', '%3A')}" in page.url
            shot = tmp_path / "localstate-ui-watcher.png"
            await page.screenshot(path=str(shot), full_page=True)
            reopened = await browser.new_page()
            await reopened.goto(f"{live_url}/?token={READ_TOKEN}&history={owner}")
            await expect(reopened.locator("#w-rows tr[data-kind=event]")).to_have_count(5)
            assert errors == []
        finally:
            await browser.close()
    print(f"screenshot: {shot}")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
