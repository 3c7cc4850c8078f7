"""The `localstate` state commands as an operator runs them: the installed command, in a
subprocess, against the central DB of each backend."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import StoreFactory, collations
from localstate_cli import cache_folder, ok, run

from localstate import StateStore, __version__


def leave_unflushed(url: str, triggerer_id: str, count: int) -> Path:
    """A triggerer that wrote `count` keys to its cache and died before flushing them."""
    path = cache_folder() / f"{triggerer_id}.db"
    script = f"""
import asyncio, os
from localstate import StateStore, __version__
async def main():
    store = await StateStore.open(central_url={url!r}, cache_path={str(path)!r},
                                  triggerer_id={triggerer_id!r}, flush_interval=3600)
    for n in range({count}):
        await store.set("asset_watcher:w", f"k{{n:04d}}", n, durability="local")
    os._exit(0)  # no close: the writes stay in the cache only
asyncio.run(main())
"""
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120)
    return path


def test_set_get_ls_delete(central_url: str) -> None:
    proc = ok(run("set", "dag:etl/load", "cursor", '{"offset": 10}', url=central_url))
    assert "version 1" in proc.stdout
    proc = ok(run("get", "dag:etl/load", "cursor", "--json", url=central_url))
    record = json.loads(proc.stdout)
    assert (record["owner"], record["key"], record["value"], record["version"]) == (
        "dag:etl/load", "cursor", {"offset": 10}, 1)
    assert record["updated_by"].startswith("cli:")
    human = ok(run("get", "dag:etl/load", "cursor", url=central_url)).stdout
    assert "owner       dag:etl/load" in human
    assert '"offset": 10' in human

    ok(run("set", "asset_watcher:orders", "watermark", "41", url=central_url))
    ok(run("set", "asset_watcher:users", "watermark", '"2024-05-01"', url=central_url))
    listing = json.loads(ok(run("ls", "--json", url=central_url)).stdout)
    assert [(r["owner"], r["key"], r["value"]) for r in listing] == [
        ("asset_watcher:orders", "watermark", 41), ("asset_watcher:users", "watermark",
                                                    "2024-05-01"),
        ("dag:etl/load", "cursor", {"offset": 10})]
    filtered = json.loads(ok(run("ls", "--owner", "asset_watcher:", "--json",
                                 url=central_url)).stdout)
    assert [r["owner"] for r in filtered] == ["asset_watcher:orders", "asset_watcher:users"]
    table = ok(run("ls", "--owner", "asset_watcher:", url=central_url)).stdout.splitlines()
    assert table[0].split() == ["OWNER", "KEY", "VERSION", "UPDATED_AT", "UPDATED_BY", "VALUE"]
    assert table[1].split()[:3] == ["asset_watcher:orders", "watermark", "1"]
    assert table[-1] == "(2 state variables with owners starting with 'asset_watcher:')"

    proc = ok(run("delete", "asset_watcher:orders", "watermark", url=central_url))
    assert "deleted" in proc.stdout
    proc = run("get", "asset_watcher:orders", "watermark", url=central_url)
    assert proc.returncode == 3
    assert "not found" in proc.stderr
    proc = run("delete", "asset_watcher:orders", "watermark", url=central_url)
    assert proc.returncode == 3
    assert len(json.loads(ok(run("ls", "--json", url=central_url)).stdout)) == 2


def test_not_found_is_exit_3(central_url: str) -> None:
    proc = run("get", "dag:none", "k", url=central_url)
    assert proc.returncode == 3
    assert proc.stdout == ""
    assert "'dag:none'" in proc.stderr


def test_expected_version_conflict_is_exit_4_and_changes_nothing(central_url: str) -> None:
    ok(run("set", "dag:x", "k", "1", "--expected-version", "0", url=central_url))
    proc = run("set", "dag:x", "k", "2", "--expected-version", "0", url=central_url)
    assert proc.returncode == 4
    assert "conflict" in proc.stderr
    assert "version 1" in proc.stderr
    proc = run("set", "dag:x", "k", "2", "--expected-version", "5", url=central_url)
    assert proc.returncode == 4
    proc = run("delete", "dag:x", "k", "--expected-version", "3", url=central_url)
    assert proc.returncode == 4
    assert json.loads(ok(run("get", "dag:x", "k", "--json", url=central_url)).stdout)[
        "value"] == 1
    proc = ok(run("set", "dag:x", "k", "2", "--expected-version", "1", "--json",
                  url=central_url))
    assert json.loads(proc.stdout)["version"] == 2
    ok(run("delete", "dag:x", "k", "--expected-version", "2", url=central_url))
    assert run("get", "dag:x", "k", url=central_url).returncode == 3


def test_value_from_stdin(central_url: str) -> None:
    ok(run("set", "dag:x", "k", "-", url=central_url, stdin='{"from": ["stdin"]}'))
    got = json.loads(ok(run("get", "dag:x", "k", "--json", url=central_url)).stdout)
    assert got["value"] == {"from": ["stdin"]}


@pytest.mark.parametrize(("args", "message"), [
    (["set", "dag:x", "k", "not json"], "not valid JSON"),
    (["set", "dag:x", "k", "NaN"], "not valid JSON"),
    (["set", "dag:x", "k\x01", "1"], "control characters"),
    (["get", "", "k"], "must not be empty"),
    (["set", "dag:x", "k", "1", "--expected-version", "-2"], "0 or more"),
    (["ls", "--limit", "0"], "above 0"),
    (["ls", "--owner", os.fsdecode(b"dag:\xff")], "lone surrogates"),  # not UTF-8
])
def test_bad_input_is_exit_2(central_url: str, args: list[str], message: str) -> None:
    proc = run(*args, url=central_url)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr
    assert json.loads(ok(run("ls", "--json", url=central_url)).stdout) == []


def test_an_unreachable_central_db_is_exit_1() -> None:
    proc = run("get", "dag:x", "k", url="postgresql://nobody@127.0.0.1:1/none")
    assert proc.returncode == 1
    assert proc.stderr.startswith("error: ")


async def test_ls_pages_through_many_rows(central_url: str, open_store: StoreFactory) -> None:
    store = await open_store(triggerer_id="many")
    for n in range(1203):
        await store.set(f"dag:d{n % 7}", f"k{n:05d}", n, durability="memory")
    await store.flush()
    rows = json.loads(ok(run("ls", "--json", url=central_url)).stdout)
    assert len(rows) == 1203
    assert [(r["owner"], r["key"]) for r in rows] == sorted((r["owner"], r["key"]) for r in rows)
    limited = json.loads(ok(run("ls", "--json", "--limit", "600", url=central_url)).stdout)
    assert [r["key"] for r in limited] == [r["key"] for r in rows[:600]]
    proc = ok(run("ls", "--owner", "dag:d3", url=central_url))
    assert proc.stdout.splitlines()[-1].startswith(f"({sum(1 for n in range(1203) if n % 7 == 3)}"
                                                   " state variables")


@collations
async def test_ls_owner_prefix_is_literal_and_ls_orders_byte_wise(
    central_url: str, open_store: StoreFactory
) -> None:
    owners = ["dag:x_y", "dag:x%y", "dag:x\\y", "dag:xAy", "dag:xay", "dag:X", "Dag:x",
              "dag:x.y", "dag:x-y", "dag:x/y", "dag:x:y"]
    store = await open_store(triggerer_id="seeder")
    for owner in owners:
        await store.set(owner, "k", 1, durability="memory")
    await store.flush()
    for prefix in ["dag:x_", "dag:x%", "dag:x\\"]:  # each a subprocess: the LIKE cases
        rows = json.loads(ok(run("ls", "--owner", prefix, "--json", url=central_url)).stdout)
        assert [r["owner"] for r in rows] == sorted(o for o in owners if o.startswith(prefix)), (
            prefix)
    table = ok(run("ls", url=central_url)).stdout.splitlines()
    assert [line.split()[0] for line in table[1:-1]] == sorted(owners)  # whatever the DB


def test_status_and_flush_of_a_dead_triggerers_backlog(central_url: str) -> None:
    path = leave_unflushed(central_url, "dead-triggerer", 1500)
    status = json.loads(ok(run("status", "--json", url=central_url)).stdout)
    assert status["localstate"] == __version__  # the release, beside the schema it found
    assert status["central"]["rows"] == 0
    (cache,) = status["caches"]
    assert (Path(cache["path"]), cache["rows"], cache["dirty"]) == (path, 1500, 1500)
    assert cache["running"] is False  # the writer's pid is gone
    human = ok(run("status", url=central_url)).stdout
    assert "dead-triggerer.db" in human
    assert "not running" in human

    proc = ok(run("flush", url=central_url, env={"AIRFLOW__LOCALSTATE__MAX_BATCH": "500"}))
    assert "dead-triggerer.db: flushed 1500 rows, 0 conflicts, 0 still unflushed" in proc.stdout
    bar = [line for line in proc.stderr.splitlines() if line.startswith("flush dead-triggerer")]
    assert len(bar) == 3  # one line per batch of 500 (stderr is no terminal here)
    assert bar[-1].split()[3] == "3/3"
    rows = json.loads(ok(run("ls", "--json", url=central_url)).stdout)
    assert len(rows) == 1500
    assert {r["updated_by"] for r in rows} == {"dead-triggerer"}
    after = json.loads(ok(run("status", "--json", url=central_url)).stdout)
    assert after["caches"][0]["dirty"] == 0
    assert after["central"]["rows"] == 1500
    assert after["central"]["writers"][0]["updated_by"] == "dead-triggerer"
    again = json.loads(ok(run("flush", "--json", url=central_url)).stdout)
    assert again == [{"path": str(path), "flushed": 0, "conflicts": 0, "still_dirty": 0}]


async def test_flush_skips_a_cache_a_live_process_holds(central_url: str) -> None:
    path = leave_unflushed(central_url, "live-triggerer", 3)
    store = await StateStore.open(central_url=central_url, cache_path=path,
                                  triggerer_id="live-triggerer", flush_interval=3600)
    try:
        proc = ok(run("flush", "--cache", str(path), url=central_url))
        assert "skipped" in proc.stdout
        assert "live process" in proc.stdout
        status = json.loads(ok(run("status", "--json", url=central_url)).stdout)
        assert status["caches"][0]["running"] is True
        assert status["central"]["rows"] == 0
    finally:
        await store.close()  # the holder flushes it itself
    assert len(json.loads(ok(run("ls", "--json", url=central_url)).stdout)) == 3


def test_version_names_the_installed_release() -> None:
    from importlib.metadata import version

    from localstate import __version__

    out = ok(run("--version")).stdout.strip()
    assert out == f"localstate {__version__}"
    # the distribution's metadata reads the same single source (pyproject: dynamic version)
    assert version("localstate") == __version__


def test_status_shows_pending_and_committed_events_and_flush_sends_them(
        central_url: str) -> None:
    """A triggerer that emitted events (`StateStore.emit`) and died before flushing them: status
    shows them pending in its cache file, `localstate flush` commits them, status then shows
    them committed in the central DB and none pending."""
    path = cache_folder() / "dead-emitter.db"
    script = f"""
import asyncio, os
from localstate import StateStore, __version__
async def main():
    store = await StateStore.open(central_url={central_url!r}, cache_path={str(path)!r},
                                  triggerer_id="dead-emitter", flush_interval=3600)
    for n in range(1, 8):
        await store.emit("trigger:orders", {{"n": n}}, watermark=n)
    os._exit(0)  # no close: the events stay in the outbox only
asyncio.run(main())
"""
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120)
    status = json.loads(ok(run("status", "--json", url=central_url)).stdout)
    (cache,) = status["caches"]
    assert cache["pending_events"] == 7
    assert cache["pending_events_by_owner"]["trigger:orders"]["pending"] == 7
    assert cache["oldest_pending_event_at"] is not None
    assert status["central"]["events"] == []
    human = ok(run("status", url=central_url)).stdout
    assert "EVENTS PENDING" in human

    ok(run("flush", url=central_url))
    after = json.loads(ok(run("status", "--json", url=central_url)).stdout)
    assert after["caches"][0]["pending_events"] == 0
    (events,) = after["central"]["events"]
    assert (events["owner"], events["committed"], events["asset_events"]) == (
        "trigger:orders", 7, 0)
    assert "EVENTS OF" in ok(run("status", url=central_url)).stdout


def test_flush_says_when_it_upgrades_the_central_schema(tmp_path: Path) -> None:
    """A flush against a central DB at an earlier schema upgrades it, and says so on the
    terminal (the upgrade's log line, which a plain CLI run would otherwise drop)."""
    from sqlalchemy import create_engine

    from localstate._sync.central.schema import LATEST_VERSION, apply_step

    old = tmp_path / "old-central.db"
    engine = create_engine(f"sqlite:///{old}")
    with engine.begin() as conn:
        for version in (1, 2):
            assert apply_step(conn, version)
    engine.dispose()
    cache = leave_unflushed(f"sqlite:///{tmp_path / 'current.db'}", "stopped", 3)
    proc = ok(run("flush", "--cache", str(cache), "--no-progress", url=f"sqlite:///{old}"))
    assert "note: upgraded the localstate schema of the central DB sqlite" in proc.stderr
    assert f"{old} from version 2 to {LATEST_VERSION}: " in proc.stderr, proc.stderr
    # a central DB already current: nothing to note
    again = leave_unflushed(f"sqlite:///{tmp_path / 'current.db'}", "stopped-2", 2)
    proc = ok(run("flush", "--cache", str(again), "--no-progress", url=f"sqlite:///{old}"))
    assert "upgraded" not in proc.stderr, proc.stderr
