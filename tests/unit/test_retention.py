"""Central retention (`localstate db prune`): what goes, what stays, in small batches, on every
backend; the tombstone horizon; bad input."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest
from conftest import StoreFactory

from localstate._core.retention_rules import RetentionRule, parse_age, parse_retention
from localstate._sync.central.central_store import CentralStore
from localstate._sync.central.retention import prune
from localstate.cli import EXIT_USAGE, main
from localstate.errors import ConfigError, InvalidInput

DAY = 86_400.0
NOW = time.time()


async def seed(url: str) -> None:
    """Rows of known ages (days before NOW): values and tombstones, three owner families."""
    central = await CentralStore.open(url)
    try:
        rows = [
            ("trigger:a", "old1", "1", 10), ("trigger:a", "old2", "2", 8),
            ("trigger:a", "new", "3", 1), ("trigger:b", "old", "4", 20),
            ("trigger:b", "tomb-young", None, 10), ("trigger:b", "tomb-old", None, 40),
            ("asset_watcher:x", "old", "5", 100), ("asset_watcher:x", "tomb-old", None, 100),
            ("dag:etl/load", "old", "6", 9), ("dag:etl/load", "tomb-old", None, 35),
        ]
        for owner, key, data, days in rows:
            await central.write_direct(owner, key, data, updated_at=NOW - days * DAY,
                                       updated_by="seed")
    finally:
        await central.close()


async def remaining(url: str) -> set[tuple[str, str]]:
    central = await CentralStore.open(url)
    try:
        rows = await central.list_rows(include_deleted=True, limit=1000)
    finally:
        await central.close()
    return {(r.owner, r.key) for r in rows}


async def run_prune(url: str, **options: object) -> dict[str, int]:
    central = await CentralStore.open(url)
    try:
        report = await prune(central, now=NOW, **options)  # type: ignore[arg-type]
    finally:
        await central.close()
    return {"rows": report.rows, "tombstones": report.tombstones, "batches": report.batches}


async def test_dry_run_counts_then_small_batches_delete(central_url: str) -> None:
    await seed(central_url)
    before = await remaining(central_url)
    # older than 7 days; tombstones past the 30-day horizon
    dry = await run_prune(central_url, older_than=7 * DAY, dry_run=True, batch_size=2)
    assert dry == {"rows": 5, "tombstones": 3, "batches": 0}
    assert await remaining(central_url) == before  # a dry run deletes nothing
    done = await run_prune(central_url, older_than=7 * DAY, batch_size=2)
    assert (done["rows"], done["tombstones"]) == (5, 3)
    assert done["batches"] >= 4  # 8 rows, at most 2 per transaction
    assert await remaining(central_url) == {
        ("trigger:a", "new"), ("trigger:b", "tomb-young")}
    assert await run_prune(central_url, older_than=7 * DAY) == {
        "rows": 0, "tombstones": 0, "batches": 0}


async def test_owner_prefix_and_retention_rules(central_url: str) -> None:
    await seed(central_url)
    report = await run_prune(central_url, older_than=7 * DAY, owner_prefix="trigger:")
    assert (report["rows"], report["tombstones"]) == (3, 1)
    left = await remaining(central_url)
    assert ("asset_watcher:x", "old") in left
    assert ("dag:etl/load", "old") in left
    # the rules win over --older-than: watchers never, dags after 30 days only
    report = await run_prune(central_url, older_than=1 * DAY,
                             retention="asset_watcher:*=never, dag:*=30d")
    assert (report["rows"], report["tombstones"]) == (0, 1)  # dag's 35-day tombstone
    left = await remaining(central_url)
    assert {("asset_watcher:x", "old"), ("asset_watcher:x", "tomb-old"),
            ("dag:etl/load", "old")} <= left
    # no --older-than and no rule: values stay, tombstones past the horizon go (the watcher's)
    report = await run_prune(central_url)
    assert (report["rows"], report["tombstones"]) == (0, 1)
    assert ("asset_watcher:x", "old") in await remaining(central_url)


async def test_a_late_writer_meets_the_tombstone_within_the_horizon(
        open_store: StoreFactory, central_url: str) -> None:
    zombie = await open_store()
    k = ("trigger:t", "watermark")
    await zombie.set(*k, 1)
    await zombie.flush()
    other = await open_store()
    assert await other.delete(*k)
    await other.flush()
    # ten days on, with rows pruned after a day: the tombstone is within its 30-day horizon
    central = await CentralStore.open(central_url)
    try:
        report = await prune(central, older_than=DAY, now=time.time() + 10 * DAY)
        assert (report.rows, report.tombstones) == (0, 0)
        # the zombie's write, based on the version the deletion replaced, is a conflict
        await zombie.set(*k, 2)
        await zombie.flush()
        assert zombie.stats().conflicts == 1
        row = (await central.read_many([k]))[k]
        assert row.data is None  # the deletion stands
        # past the horizon it goes
        report = await prune(central, older_than=DAY, now=time.time() + 31 * DAY)
        assert (report.rows, report.tombstones) == (0, 1)
        assert k not in await central.read_many([k])
    finally:
        await central.close()


async def test_bad_input_gets_typed_errors(tmp_path: Path) -> None:
    for bad in ("7", "7x", "-1d", "0d", "d", "", "seven days"):
        with pytest.raises(InvalidInput, match=r"age|zero"):
            parse_age(bad)
    assert parse_age("never") is None
    assert parse_age(" 36h ") == 36 * 3600
    with pytest.raises(InvalidInput, match="owner-glob=age"):
        parse_retention("trigger:*")
    with pytest.raises(InvalidInput, match="owner-glob=age"):
        parse_retention("=7d")
    with pytest.raises(InvalidInput):
        parse_retention([("trigger:*", 7)])  # type: ignore[list-item]
    assert parse_retention("trigger:*=7d, asset_watcher:*=never") == (
        RetentionRule("trigger:*", 7 * DAY), RetentionRule("asset_watcher:*", None))
    central = await CentralStore.open(f"sqlite:///{tmp_path / 'c.db'}")
    try:
        with pytest.raises(InvalidInput, match="horizon"):
            await prune(central, older_than=DAY, tombstone_horizon=3600)
        with pytest.raises(InvalidInput, match="older_than"):
            await prune(central, older_than=-1)
        with pytest.raises(InvalidInput, match="batch_size"):
            await prune(central, batch_size=0)
    finally:
        await central.close()
    from localstate._core.config import Settings

    with pytest.raises(ConfigError, match="retention"):
        Settings.resolve({"retention": "trigger:*=soon"})


def test_cli_prune(central_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    asyncio.run(seed(central_url))
    before = asyncio.run(remaining(central_url))
    assert main(["db", "prune", "--older-than", "7d", "--dry-run", "--json",
                 "--central-url", central_url]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["rows"], out["tombstones"], out["dry_run"]) == (5, 3, True)
    assert asyncio.run(remaining(central_url)) == before
    assert main(["db", "prune", "--older-than", "7d", "--owner-prefix", "trigger:",
                 "--batch-size", "1", "--central-url", central_url]) == 0
    assert "deleted 3 rows, 1 tombstones, 0 event keys and 0 history rows" in (
        capsys.readouterr().out)
    assert main(["db", "prune", "--older-than", "7x", "--central-url", central_url]
                ) == EXIT_USAGE
    assert "--older-than" in capsys.readouterr().err
    assert main(["db", "prune", "--tombstone-horizon", "1h", "--central-url", central_url]
                ) == EXIT_USAGE
    assert "horizon" in capsys.readouterr().err


async def test_event_keys_go_once_old_and_behind_a_later_write_of_their_owner(
    central_url: str,
) -> None:
    """An emitted event's de-duplication row (`localstate._sync.central.fenced_write`): pruned when
    older than the event horizon and its owner's state was written after it (the watermark moved
    past it); kept otherwise, and for owners a ``never`` rule keeps."""
    from sqlalchemy import select, update

    from localstate._core.conflicts import PolicyMap
    from localstate._core.rows import EventRow
    from localstate._sync.central.schema import event

    central = await CentralStore.open(central_url)
    try:
        old = [("trigger:a", "1"), ("trigger:a", "2"), ("trigger:b", "1"), ("trigger:c", "1"),
               ("asset_watcher:x", "1"), ("trigger:a", "sqs/m-1")]
        await central.write_with_events(
            [], [EventRow(i, o, k, "1", NOW) for i, (o, k) in enumerate(old, 1)],
            PolicyMap("reject"), writer="w")
        e = event.c
        ten_days_ago = datetime_of(central, NOW - 10 * DAY)
        await central.run_write(update(event).values(committed_at=ten_days_ago), "backdate")
        _out, fresh = await central.write_with_events(
            [], [EventRow(9, "trigger:a", "3", "1", NOW)], PolicyMap("reject"), writer="w")
        assert fresh == ["committed"]
        # the owners' watermarks: a and x moved on after their events, b's is older
        for owner, days in (("trigger:a", 1), ("trigger:b", 20), ("asset_watcher:x", 1)):
            await central.write_direct(owner, "watermark", "9", updated_at=NOW - days * DAY,
                                       updated_by="seed")
        dry = await prune(central, now=NOW, retention="asset_watcher:*=never", dry_run=True)
        assert dry.event_keys == 2
        report = await prune(central, now=NOW, retention="asset_watcher:*=never")
        assert report.event_keys == 2
        left = {(o, k) for o, k in await central.run_read(select(e.owner, e.key), "read")}
        # an SQS message's key stays as long as SQS may redeliver it (15 days), not 7
        assert left == {("trigger:a", "3"), ("trigger:b", "1"), ("trigger:c", "1"),
                        ("asset_watcher:x", "1"), ("trigger:a", "sqs/m-1")}
        assert (await prune(central, now=NOW + 6 * DAY, retention="asset_watcher:*=never")
                ).event_keys == 1
        left -= {("trigger:a", "sqs/m-1")}
        assert {(o, k) for o, k in await central.run_read(select(e.owner, e.key), "read")} \
            == left
        _out, again = await central.write_with_events(
            [], [EventRow(10, "trigger:a", "3", "1", NOW)], PolicyMap("reject"), writer="w")
        assert again == ["duplicate"]  # what is kept still de-duplicates
        with pytest.raises(InvalidInput, match="event horizon"):
            await prune(central, now=NOW, event_horizon=60)
    finally:
        await central.close()


def datetime_of(central: CentralStore, ts: float) -> object:
    from datetime import datetime, timezone

    moment = datetime.fromtimestamp(ts, tz=timezone.utc)
    return moment if central.dialect == "postgresql" else moment.replace(tzinfo=None)
