"""A watcher's history with real Airflow 3.3 processes: ``airflow api-server`` with the plugin,
two triggerers with ``sink = api`` on PostgreSQL, an emitting watcher whose triggerer is
SIGKILLed, stopped as a zombie while the other triggerer takes it over (then resumed: its
trigger leaves it, a release), and, last, SIGKILLed right after a flush of its committed
centrally but before the answer reached it (the answer held back on its way by a proxy), then
restarted: its cache file's outbox sends those events again (tests/support/events_chaos.py,
tests/support/answer_proxy.py). Read back through ``localstate history`` (the CLI, through the
API) and the state page inside Airflow (Chromium, a Viewer's login, every page of the timeline):

* every fed item's event is there exactly once as ``committed``; each event of the lost
  answer exactly once more as ``duplicate``; every other event row (a zombie's ``refused``)
  is of an item also committed; each event names the triggerer that flushed it;
* the watermark advances in order (values and versions never go back);
* every claim, with its epoch rising, by the triggerers that ran it, at least one takeover;
  the zombie's release at the epoch it had claimed, by the triggerer that claimed it;
* the page shows the same rows, outcomes and triggerers as the CLI.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from airflow_api_server import MACHINE_TOKEN, USERS
from airflow_harness import Deployment
from browser import ARGS, CHROMIUM
from events_chaos import Schedule, run
from playwright.async_api import async_playwright, expect

from localstate._testing.postgres_server import PostgresServer

pytestmark = pytest.mark.postgres

OWNER = "asset_watcher:emit_0"


def _history_cli(d: Deployment) -> dict[str, object]:
    """``localstate history OWNER --json`` as an operator runs it where the triggerers
    flush (``sink = api``)."""
    env = {**os.environ, "AIRFLOW_HOME": str(d.home),
           "AIRFLOW__LOCALSTATE__SINK": "api",
           "AIRFLOW__LOCALSTATE__API_URL": f"{d.env['AIRFLOW__API__BASE_URL']}/localstate",
           "AIRFLOW__LOCALSTATE__API_TOKEN": MACHINE_TOKEN}
    done = subprocess.run([sys.executable, "-m", "localstate.cli", "history", OWNER, "--json",
                           "--limit", "5000"], env=env, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    table = subprocess.run([sys.executable, "-m", "localstate.cli", "history", OWNER,
                            "--limit", "20"], env=env, capture_output=True, text=True,
                           timeout=120, check=False)
    assert table.returncode == 0, table.stderr
    print(table.stdout)
    assert "events last hour" in table.stdout
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def _viewer_jwt(d: Deployment) -> str:
    import httpx

    with httpx.Client(base_url=d.env["AIRFLOW__API__BASE_URL"], timeout=60) as client:
        r = client.post("/auth/token", json={"username": "viewer",
                                             "password": USERS["viewer"][1]})
    assert r.status_code == 201, r.text
    return str(r.json()["access_token"])


def test_a_watchers_kills_replays_and_takeover_show_in_its_history(
        pg_server: PostgresServer, tmp_path: Path) -> None:
    seen: dict[str, object] = {}

    async def inspect(d: Deployment, fed: int) -> None:
        page_of = await asyncio.to_thread(_history_cli, d)
        seen["fed"] = fed
        seen["cli"] = page_of
        jwt = await asyncio.to_thread(_viewer_jwt, d)
        url = d.env["AIRFLOW__API__BASE_URL"]
        async with async_playwright() as pw:
            browser = await pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            try:
                page = await browser.new_page(viewport={"width": 1280, "height": 1400})
                await page.goto(f"{url}/localstate/?token={jwt}&history={OWNER}")
                await expect(page.locator("#watcher")).to_have_attribute(
                    "data-loaded", OWNER, timeout=60_000)
                seen["page_events"] = await page.locator("#w-events").inner_text()
                seen["page_epoch"] = await page.locator("#w-epoch").inner_text()
                # every page of the timeline, as an operator pages back with "Older"
                more = page.locator("#w-more")
                while await more.is_visible():
                    shown = await page.locator("#w-rows tr").count()
                    await more.click()
                    await expect(page.locator("#w-rows tr")).not_to_have_count(
                        shown, timeout=60_000)
                seen["page_rows"] = await page.locator("#w-rows tr").evaluate_all(
                    """rows => rows.map(r => ({
                        id: Number(r.dataset.id),
                        kind: r.dataset.kind, outcome: r.dataset.outcome || null,
                        key: r.querySelector("td.key").textContent,
                        epoch: r.querySelector("td.epoch").textContent,
                        triggerer: r.querySelector("td.triggerer").textContent,
                        what: r.querySelector("td.what").textContent}))""")
                assert await page.locator("#rows button.edit").count() == 0  # a Viewer
                await page.screenshot(path=str(tmp_path / "history-in-airflow.png"),
                                      full_page=True)
            finally:
                await browser.close()

    s = Schedule(kills=2, zombies=1, api_restarts=0, replays=1, zombie_of="emit_0",
                 gap=(2.0, 4.0), health_threshold=6.0, watchers=1, rate=4.0)
    o = asyncio.run(run(pg_server, tmp_path, s, env={
        "AIRFLOW__LOCALSTATE__HISTORY_WATERMARK_EVERY": "0",
        # the whole run's rows (its bounds are measured in benches/bench_history.py)
        "AIRFLOW__LOCALSTATE__HISTORY_MAX_ROWS": "1000000"}, inspect=inspect))
    print("\n" + o.table() + "\n" + "\n".join(o.log))
    assert (o.emit.missing, o.emit.duplicates) == (0, 0), o.table()
    assert "cli" in seen, "the run ended before the watcher had every event"
    fed = int(seen["fed"])  # type: ignore[call-overload]
    cli = seen["cli"]
    assert isinstance(cli, dict)
    items = cli["items"]  # oldest first
    events = [i for i in items if i["kind"] == "event"]
    committed = Counter(i["key"] for i in events if i["outcome"] == "committed")
    assert committed == Counter(str(n) for n in range(1, fed + 1)), (
        sorted(set(map(str, range(1, fed + 1))) ^ set(committed)))
    others = [i for i in events if i["outcome"] != "committed"]
    assert {i["outcome"] for i in others} <= {"duplicate", "refused"}
    assert all(i["key"] in committed for i in others)
    # the lost answer's events: the server found each committed when they came again, and
    # the history has each once as a duplicate
    replayed = {key for (owner, key) in o.replayed if owner == OWNER}
    assert o.replays == 1, o.table()
    assert replayed, o.table()
    assert set(o.replayed.values()) == {"duplicate"}, o.replayed
    duplicates = Counter(i["key"] for i in events if i["outcome"] == "duplicate")
    assert {k: duplicates[k] for k in replayed} == dict.fromkeys(replayed, 1), duplicates
    # each event names the triggerer that flushed it
    assert {i["triggerer"] for i in events} <= {"triggerer-a", "triggerer-b"}
    assert all(i["triggerer"] for i in events)
    assert all(i["asset_event"] is not None for i in events if i["outcome"] == "committed")
    marks = [i for i in items if i["kind"] == "watermark"]
    assert marks
    values = [int(i["value"]) for i in marks]
    assert values == sorted(values)
    assert values[-1] == fed
    versions = [int(i["version"]) for i in marks]
    assert versions == sorted(versions)
    claims = [i for i in items if i["kind"] == "claim"]
    epochs = [int(i["epoch"]) for i in claims]
    assert len(claims) >= 2
    assert epochs == sorted(epochs)
    assert len(set(epochs)) == len(epochs)
    assert {i["triggerer"] for i in claims} == {"triggerer-a", "triggerer-b"}
    # the zombie's trigger left it once it resumed: a release at the epoch it had claimed,
    # by the triggerer that claimed it, after that claim
    claimed_by = {int(i["epoch"]): (i["triggerer"], items.index(i)) for i in claims}
    releases = [i for i in items if i["kind"] == "release"]
    assert releases, "no release recorded"
    for r in releases:
        by, at = claimed_by[int(r["epoch"])]
        assert (r["triggerer"], items.index(r) > at) == (by, True), (r, by)
    assert o.takeovers >= 1, o.table()
    summary = cli["summary"]
    assert isinstance(summary, dict)
    by_outcome = summary["events_last_hour"]
    print(f"history of {OWNER}: {fed} items, {len(events)} event rows {dict(by_outcome)}, "
          f"{len(marks)} watermark advances, claims {epochs}, releases "
          f"{[int(r['epoch']) for r in releases]}, {len(replayed)} events replayed")
    # the page shows the counts and the newest claim's epoch: the CLI's, or later ones (a
    # zombie's refused event, a handover, after the CLI read)
    shown_counts = {k: int(n) for n, k in (part.split() for part in
                                           str(seen["page_events"]).split(" · "))}
    assert set(shown_counts) == {"committed", "duplicate", "refused", "rejected"}
    assert shown_counts["committed"] == by_outcome["committed"] == fed
    assert all(shown_counts[k] >= by_outcome[k] for k in shown_counts), (shown_counts,
                                                                          by_outcome)
    assert int(str(seen["page_epoch"])) >= epochs[-1]
    # the page's timeline, every page of it, is the CLI's, newest first (up to the CLI's
    # newest row: the triggerers run on, and a handover may add rows in between)
    page_rows = seen["page_rows"]
    assert isinstance(page_rows, list)
    newest_id = max(int(i["id"]) for i in items)
    page_rows = [r for r in page_rows if r["id"] <= newest_id]
    assert [(r["id"], r["kind"], r["key"], r["outcome"], r["epoch"], r["triggerer"])
            for r in page_rows] == [
        (i["id"], i["kind"], i["key"] or "", i["outcome"],
         "" if i["epoch"] is None else str(i["epoch"]), i["triggerer"] or "")
        for i in reversed(items)]
    shown = Counter((r["key"], r["outcome"]) for r in page_rows if r["kind"] == "event")
    assert all(shown[(k, "duplicate")] == 1 for k in replayed)
    assert sum(1 for r in page_rows if r["kind"] == "release") == len(releases)
    assert all(r["what"] == "released" for r in page_rows if r["kind"] == "release")
