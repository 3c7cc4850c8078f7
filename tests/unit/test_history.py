"""Each owner's history (`localstate._sync.central.history`): written in the flush's (or claim's)
own transaction, one watermark row per key per flush, every event with its outcome and the
triggerer that flushed it, every claim and release with its epoch; bounded per owner; off when
the setting says so. Each test runs on every central backend."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta, timezone

import pytest
from conftest import StoreFactory
from sqlalchemy import func, insert, select

from localstate._core.rows import EventRow
from localstate._sync.central.central_store import CentralStore
from localstate._sync.central.history import HistoryPolicy, HistoryRow, HistoryTrim
from localstate._sync.central.schema import history
from localstate.errors import InvalidInput

OWNER = "trigger:orders"


def central_of(store: object) -> CentralStore:
    central = getattr(store, "central_store", None)
    assert isinstance(central, CentralStore)
    return central


def oldest_first(rows: list[HistoryRow]) -> list[HistoryRow]:
    return sorted(rows, key=lambda r: r.id)


async def test_a_watchers_emits_replay_zombie_and_claims_are_in_its_history(
    open_store: StoreFactory, central_url: str,
) -> None:
    first = await open_store(triggerer_id="first", history_watermark_every=0)
    assert await first.claim(OWNER) == 1
    await first.emit(OWNER, {"n": 1}, watermark=1)
    await first.emit(OWNER, {"n": 2}, watermark=2)
    await first.flush()  # one flush: the watermark coalesced to 2
    second = await open_store(triggerer_id="second", history_watermark_every=0)
    assert await second.claim(OWNER) == 2
    await first.emit(OWNER, {"n": 3}, watermark=3)  # the zombie's: refused
    await first.flush()
    gone = await first.release(OWNER)  # the zombie's trigger leaves it
    assert (gone.recorded, gone.refused) == (True, 0)
    await second.emit(OWNER, {"n": 2}, watermark=2, key="2")  # a replay: duplicate
    await second.emit(OWNER, {"n": 3}, watermark=3)
    await second.flush()
    assert (await second.release(OWNER)).recorded
    async with CentralStore.open(central_url) as central:
        rows = oldest_first(await central.read_history(OWNER))
    seen = [(r.kind, r.key, r.outcome, r.epoch, r.version, r.triggerer) for r in rows
            if r.kind != "watermark"]
    assert seen == [
        ("claim", None, None, 1, None, "first"),
        ("event", "1", "committed", 1, None, "first"),
        ("event", "2", "committed", 1, None, "first"),
        ("claim", None, None, 2, None, "second"),
        ("event", "3", "refused", 1, None, "first"),
        ("release", None, None, 1, None, "first"),
        ("event", "2", "duplicate", 2, None, "second"),
        ("event", "3", "committed", 2, None, "second"),
        ("release", None, None, 2, None, "second"),
    ]
    # a release names the cache file that held the claim, as the claim does
    files = {r.epoch: r.writer for r in rows if r.kind == "claim"}
    assert [(r.epoch, r.writer) for r in rows if r.kind == "release"] == sorted(files.items())
    assert files[1] != files[2]
    marks = [(r.key, r.value, r.triggerer) for r in rows if r.kind == "watermark"]
    # one row per flush that committed it, in order; the zombie's watermark is not there
    assert marks == [("watermark", "2", "first"), ("watermark", "3", "second")]
    versions = [r.version for r in rows if r.kind == "watermark"]
    async with CentralStore.open(central_url) as central:
        current = (await central.read_many([(OWNER, "watermark")]))[(OWNER, "watermark")]
    assert versions[1] == current.version
    assert versions[0] is not None
    assert versions[0] < current.version
    assert all(r.writer for r in rows)
    # the events and watermarks are written in the transaction of the flush that carried them
    watermark_rows = [r for r in rows if r.kind == "watermark"]
    assert watermark_rows[0].id < rows[-1].id


async def test_history_is_paged_newest_first_and_filtered_by_kind(
    open_store: StoreFactory, central_url: str,
) -> None:
    store = await open_store(history_watermark_every=0)
    for n in range(1, 8):
        await store.set(OWNER, "watermark", n)
        await store.flush()
    async with CentralStore.open(central_url) as central:
        page1 = await central.read_history(OWNER, limit=3)
        page2 = await central.read_history(OWNER, limit=3, before=page1[-1].id)
        page3 = await central.read_history(OWNER, limit=3, before=page2[-1].id)
        assert await central.read_history(OWNER, kinds=["claim"]) == []
    values = [r.value for r in page1 + page2 + page3]
    assert values == [str(n) for n in range(7, 0, -1)]


async def test_history_off_writes_none(open_store: StoreFactory, central_url: str) -> None:
    store = await open_store()
    central_of(store).use_history(HistoryPolicy(enabled=False))
    await store.claim(OWNER)
    await store.emit(OWNER, 1, watermark=1)
    await store.flush()
    async with CentralStore.open(central_url) as central:
        assert await central.read_history(OWNER) == []
        assert await central.run_read(select(func.count()).select_from(history), "count") \
            == [(0,)]


async def test_each_owner_stays_within_its_bound_over_many_flushes(
    open_store: StoreFactory, central_url: str,
) -> None:
    store = await open_store()
    central_of(store).use_history(HistoryPolicy(max_rows=20, watermark_every=0))
    owners = [f"trigger:churn-{i}" for i in range(5)]
    for n in range(60):
        for owner in owners:
            await store.set(owner, "watermark", n)
        await store.flush()
        async with CentralStore.open(central_url) as central:
            counts = dict(await central.run_read(
                select(history.c.owner, func.count()).group_by(history.c.owner), "count"))
        # the bound plus the tenth added between two trims
        assert all(c <= 22 for c in counts.values()), (n, counts)
    assert set(counts) == set(owners)
    assert all(c >= 20 for c in counts.values())
    async with CentralStore.open(central_url) as central:
        newest = await central.read_history(owners[0], limit=1)
    assert newest[0].value == "59"  # the newest rows are kept


async def test_trim_history_keeps_the_newest_rows_and_none_past_the_age(
    open_store: StoreFactory, central_url: str,
) -> None:
    store = await open_store(history_watermark_every=0)
    for n in range(30):
        await store.set(OWNER, "watermark", n)
        await store.flush()
    async with CentralStore.open(central_url) as central:
        old = datetime.now(timezone.utc) - timedelta(days=30)
        at = old if central.dialect == "postgresql" else old.replace(tzinfo=None)
        await central.run_write(insert(history).values(
            owner="trigger:gone", kind="claim", at=at, epoch=1, triggerer="t"), "old row")
        assert await central.trim_history(max_rows=10, max_age=7 * 86_400.0) == 21
        rows = await central.read_history(OWNER)
        assert [r.value for r in rows] == [str(n) for n in range(29, 19, -1)]
        assert await central.read_history("trigger:gone") == []


async def test_the_summary_counts_the_last_hour_by_outcome(
    open_store: StoreFactory, central_url: str,
) -> None:
    store = await open_store(triggerer_id="t1")
    await store.claim(OWNER)
    await store.emit(OWNER, 1, watermark=1)
    await store.emit(OWNER, 2, watermark=2)
    await store.flush()
    async with CentralStore.open(central_url) as central:
        await central.record_rejected([EventRow(9, OWNER, "bad", "{}", 0.0, 1)], "w")
        s = await central.history_summary(OWNER)
    assert s.events_last_hour == {"committed": 2, "duplicate": 0, "refused": 0, "rejected": 1}
    assert s.epoch == 1
    assert s.last_event_at is not None
    assert s.last_watermark_at is not None
    assert s.lag is not None
    assert s.lag >= 0
    assert s.since_event is not None
    assert 0 <= s.since_event < 600
    assert s.rows == 5  # claim, watermark, two events, the rejected one


async def test_watermarks_within_the_window_are_coalesced_events_never(
    open_store: StoreFactory, central_url: str,
) -> None:
    """By default (history_watermark_every 10 s) an owner's watermark is recorded at most once
    per window, the latest at the next flush after it; every event is recorded."""
    store = await open_store(history_watermark_every=3600)
    for n in range(1, 4):
        await store.emit(OWNER, n, watermark=n)
        await store.flush()
    await store.set("trigger:other", "watermark", 1)
    await store.flush()
    async with CentralStore.open(central_url) as central:
        rows = oldest_first(await central.read_history(OWNER))
        other = await central.read_history("trigger:other")
        s = await central.history_summary(OWNER)
    assert [(r.kind, r.value or r.outcome) for r in rows] == [
        ("watermark", "1"), ("event", "committed"), ("event", "committed"),
        ("event", "committed")]
    assert [r.value for r in other] == ["1"]  # its first advance: recorded
    # the summary's last advance is the state table's, not the coalesced history's
    record = await store.read_committed(OWNER, "watermark")
    assert record is not None
    assert s.last_watermark_at == pytest.approx(record.updated_at.timestamp(), abs=1e-3)


async def test_a_release_is_recorded_only_for_an_owner_the_store_claimed(
    open_store: StoreFactory, central_url: str,
) -> None:
    store = await open_store(triggerer_id="t1")
    await store.set(OWNER, "watermark", 1)
    report = await store.release(OWNER)  # never claimed here: nothing to hand over
    assert (report.recorded, report.flushed) == (False, 1)
    await store.claim(OWNER)
    assert (await store.release(OWNER)).recorded
    central_of(store).use_history(HistoryPolicy(enabled=False))
    assert not (await store.release(OWNER)).recorded  # history off: no row
    async with CentralStore.open(central_url) as central:
        rows = oldest_first(await central.read_history(OWNER))
    assert [(r.kind, r.epoch, r.triggerer) for r in rows if r.kind != "watermark"] == [
        ("claim", 1, "t1"), ("release", 1, "t1")]


async def test_a_release_not_recorded_within_its_timeout_is_reported_and_goes_on(
    open_store: StoreFactory, central_url: str, caplog: pytest.LogCaptureFixture,
) -> None:
    store = await open_store(triggerer_id="t1")
    await store.claim(OWNER)
    await store.set(OWNER, "watermark", 1)
    await store.flush()
    report = await store.release(OWNER, timeout=0)  # flushed: no time left for the record
    assert (report.recorded, report.dropped, report.kept) == (False, 1, 0)
    assert "the release of owner 'trigger:orders' (claim epoch 1) is not in its history" \
        in caplog.text
    async with CentralStore.open(central_url) as central:
        assert await central.read_history(OWNER, kinds=["release"]) == []


def test_a_bad_bound_is_refused() -> None:
    with pytest.raises(InvalidInput, match="history_max_rows"):
        HistoryPolicy(max_rows=0)
    with pytest.raises(InvalidInput, match="history_max_age"):
        HistoryPolicy(max_age=0)
    with pytest.raises(InvalidInput, match="history_watermark_every"):
        HistoryPolicy(watermark_every=-1)


# -- shown: the REST route and the CLI ------------------------------------------------------

VIEWER = "history-viewer-0123456789"
DAGS_ONLY = "history-dags-only-0123456789"


async def _history_scenario(open_store: StoreFactory) -> None:
    store = await open_store(triggerer_id="t1", history_watermark_every=0)
    await store.claim(OWNER)
    for n in range(1, 6):
        await store.emit(OWNER, n, watermark=n)
        await store.flush()


async def test_the_rest_route_pages_the_history_for_a_reader_only_of_its_owners(
    open_store: StoreFactory, central_url: str,
) -> None:
    import httpx

    from localstate import Settings
    from localstate.api import create_app

    await _history_scenario(open_store)
    server = await open_store(triggerer_id="api-server")
    tokens = Settings.resolve({"api_tokens": f"{VIEWER}:read:trigger:, "
                                             f"{DAGS_ONLY}:read:dag:"}).api_tokens
    app = create_app(server.settings, local=server, tokens=tokens)
    async with app.router.lifespan_context(app), httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
        viewer = {"Authorization": f"Bearer {VIEWER}"}
        r = await client.get("/api/v1/history", params={"owner": OWNER, "limit": 4},
                             headers=viewer)
        assert r.status_code == 200, r.text
        first = r.json()
        assert first["summary"]["events_last_hour"]["committed"] == 5
        assert first["summary"]["epoch"] == 1
        assert len(first["items"]) == 4
        seen = list(first["items"])
        before = first["next_before"]
        while before is not None:
            r = await client.get("/api/v1/history", params={
                "owner": OWNER, "limit": 4, "before": before}, headers=viewer)
            page = r.json()
            assert page["summary"] is None  # on the first page only
            seen += page["items"]
            before = page["next_before"]
        assert len(seen) == 11  # the claim, five events and five watermarks
        ids = [i["id"] for i in seen]
        assert ids == sorted(ids, reverse=True)
        marks = [i["value"] for i in seen if i["kind"] == "watermark"]
        assert marks == [5, 4, 3, 2, 1]
        r = await client.get("/api/v1/history", params={"owner": OWNER, "kind": "claim"},
                             headers=viewer)
        assert [(i["kind"], i["epoch"], i["triggerer"]) for i in r.json()["items"]] == [
            ("claim", 1, "t1")]
        # outside the token's owners: refused, as every read
        r = await client.get("/api/v1/history", params={"owner": OWNER},
                             headers={"Authorization": f"Bearer {DAGS_ONLY}"})
        assert r.status_code == 403
        r = await client.get("/api/v1/history", params={"owner": OWNER})
        assert r.status_code == 401
        r = await client.get("/api/v1/history", params={"owner": ""}, headers=viewer)
        assert r.status_code == 422


async def test_the_cli_prints_the_history_as_a_table_and_as_json(
    open_store: StoreFactory, central_url: str,
) -> None:
    import json
    import subprocess
    import sys

    await _history_scenario(open_store)

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "localstate.cli", "history", OWNER, *args,
                               "--central-url", central_url],
                              capture_output=True, text=True, timeout=120, check=False)

    table = run("--limit", "4")
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert "5 committed, 0 duplicate, 0 refused, 0 rejected" in table.stdout
    assert any(line.startswith("claim epoch") and line.endswith("1") for line in lines)
    body = [line for line in lines if "UTC" in line]
    assert len(body) == 4  # the newest four, oldest first
    assert "v5 = 5" in body[-1] or "committed" in body[-1]
    listed = run("--json", "--kind", "event")
    assert listed.returncode == 0, listed.stderr
    page = json.loads(listed.stdout)
    assert [(i["key"], i["outcome"]) for i in page["items"]] == [
        (str(n), "committed") for n in range(1, 6)]
    assert page["summary"]["events_last_hour"]["committed"] == 5
    bad = run("--limit", "0")
    assert bad.returncode == 2
    # a release is a kind of its own, listed alone with --kind release
    store = await open_store(triggerer_id="t2", history_watermark_every=0)
    await store.claim(OWNER)
    assert (await store.release(OWNER)).recorded
    released = run("--json", "--kind", "release")
    assert released.returncode == 0, released.stderr
    assert [(i["kind"], i["epoch"], i["triggerer"])
            for i in json.loads(released.stdout)["items"]] == [("release", 2, "t2")]


async def test_db_prune_trims_every_owners_history_to_the_settings_bounds(
    open_store: StoreFactory, central_url: str, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from localstate.cli import main

    store = await open_store(history_watermark_every=0)
    for n in range(10):
        for owner in (OWNER, "trigger:other"):
            await store.set(owner, "watermark", n)
        await store.flush()
    monkeypatch.setenv("AIRFLOW__LOCALSTATE__HISTORY_MAX_ROWS", "3")
    assert await asyncio.to_thread(main, ["db", "prune", "--central-url", central_url]) == 0
    assert "14 history rows" in capsys.readouterr().out
    async with CentralStore.open(central_url) as central:
        for owner in (OWNER, "trigger:other"):
            assert [r.value for r in await central.read_history(owner)] == ["9", "8", "7"]


def test_the_trim_count_starts_at_zero_and_is_kept_across_recorded_watermarks() -> None:
    """A trim can come before any watermark was recorded (a claim's flush, say), and a
    recorded watermark does not reset the count: the count was set in `marked`, so a writer's
    first trim failed with AttributeError (the API server answered the claim with a 500)."""
    t = HistoryTrim(HistoryPolicy(max_rows=10))
    t.added(["a"])
    t.done(["a"], aged=False, trimmed=3)
    assert t.trimmed == 3
    t.marked(["a"])
    t.done([], aged=True, trimmed=2)
    assert t.trimmed == 5
