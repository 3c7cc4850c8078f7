"""A watcher's history with real Airflow 3.3 processes: ``airflow api-server`` with the plugin,
two triggerers with ``sink = api`` on PostgreSQL, an emitting watcher whose triggerer is
SIGKILLed (its cache file's outbox replayed on restart) and stopped as a zombie while the other
triggerer takes it over (tests/support/events_chaos.py). Read back through ``localstate
history`` (the CLI, through the API) and the state page inside Airflow (Chromium, a Viewer's login):

* every fed item's event is there exactly once as ``committed``; every other event row
  (a replay's ``duplicate``, a zombie's ``refused``) is of an item also committed;
* the watermark advances in order (values and versions never go back);
* every claim, with its epoch rising, by the triggerers that ran it, at least one takeover.
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
                rows = page.locator("#w-rows tr[data-kind=event]")
                seen["page_outcomes"] = [await rows.nth(i).get_attribute("data-outcome")
                                         for i in range(await rows.count())]
                seen["page_keys"] = [await rows.nth(i).locator("td.key").inner_text()
                                     for i in range(await rows.count())]
                assert await page.locator("#rows button.edit").count() == 0  # a Viewer
                await page.screenshot(path=str(tmp_path / "history-in-airflow.png"),
                                      full_page=True)
            finally:
                await browser.close()

    s = Schedule(kills=2, zombies=1, api_restarts=0, gap=(2.0, 4.0), health_threshold=6.0,
                 watchers=1, rate=4.0)
    o = asyncio.run(run(pg_server, tmp_path, s, env={
        "AIRFLOW__LOCALSTATE__HISTORY_WATERMARK_EVERY": "0"}, inspect=inspect))
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
    summary = cli["summary"]
    assert isinstance(summary, dict)
    by_outcome = summary["events_last_hour"]
    print(f"history of {OWNER}: {fed} items, {len(events)} event rows {dict(by_outcome)}, "
          f"{len(marks)} watermark advances, claims {epochs}")
    # the page shows the same counts and the newest claim's epoch
    assert seen["page_events"] == " · ".join(
        f"{by_outcome[k]} {k}" for k in ("committed", "duplicate", "refused", "rejected"))
    assert seen["page_epoch"] == str(epochs[-1])
    newest = list(reversed(events))[:len(seen["page_keys"])]  # type: ignore[arg-type]
    assert seen["page_keys"] == [i["key"] for i in newest]
    assert seen["page_outcomes"] == [i["outcome"] for i in newest]
