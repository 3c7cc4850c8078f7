"""Live reload: airflow.cfg edited on disk while a store runs (watchfiles), on both backends.

The toggle is flipped both ways under running writers; every acknowledged write must be in the
central DB at the end with its last value. flush_interval, max_batch and durability changes
apply at once; an invalid edit is reported and the last good settings stay in force.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import orjson
import pytest
import pytest_asyncio
from conftest import StoreFactory

from localstate import ConfigError, Settings, StateStore
from localstate._core.model import Durability
from localstate._core.reload import ConfigWatcher
from localstate._metrics import MetricsReporter
from localstate._sync.central.central_store import CentralStore
from localstate._testing.postgres_server import PostgresServer

RELOAD_TIMEOUT = 15.0  # generous: inotify answers in milliseconds, but the machine is shared


def cfg_path() -> Path:
    return Path(os.environ["AIRFLOW_HOME"]) / "airflow.cfg"


def edit_cfg(**settings: object) -> None:
    """Rewrite airflow.cfg as editors save: a new file renamed over the old one."""
    body = "[core]\ndags_folder = /tmp/dags\n\n[localstate]\n" + "".join(
        f"{name} = {value}\n" for name, value in settings.items())
    tmp = cfg_path().with_name(f".airflow.cfg.{uuid.uuid4().hex}.tmp")
    tmp.write_text(body)
    os.replace(tmp, cfg_path())


def watcher_of(store: StateStore) -> ConfigWatcher:
    watcher = store.config_watcher
    assert watcher is not None
    return watcher


async def reloaded(watcher: ConfigWatcher, done: Callable[[], bool],
                   timeout: float = RELOAD_TIMEOUT) -> None:
    """Wait (bounded) until the watcher has handled edits and `done()` holds."""
    deadline = time.monotonic() + timeout
    while True:
        seen = watcher.reloads
        if done():
            return
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"not applied in {timeout} s; last error: {watcher.last_error}"
        await watcher.wait_for_reload(seen, remaining)


async def eventually(done: Callable[[], object], timeout: float = 10.0) -> None:
    """Poll `done` (bounded): for effects of the sync worker, which has no event to wait on."""
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


@pytest_asyncio.fixture
async def central(central_url: str) -> AsyncIterator[CentralStore]:
    """A reader of the central DB apart from the store under test."""
    c = await CentralStore.open(central_url)
    yield c
    await c.close()


async def central_values(central: CentralStore, keys: list[tuple[str, str]]
                         ) -> dict[tuple[str, str], object]:
    rows = await central.read_many(keys)
    return {k: orjson.loads(r.data) for k, r in rows.items() if r.data is not None}


@pytest_asyncio.fixture
async def watched_store(central_url: str, tmp_path: Path) -> AsyncIterator[StoreFactory]:
    opened: list[StateStore] = []

    async def factory(**options: object) -> StateStore:
        store = await StateStore.open(central_url=central_url, cache_path=tmp_path / "c.db",
                                      triggerer_id="reloading", watch_config=True, **options)
        opened.append(store)
        return store

    yield factory
    for store in opened:
        await store.close()


class WriteLoop:
    """Writers in hot loops, each over its own keys; records every acknowledged write."""

    MODES: tuple[Durability, ...] = ("memory", "local", "central", "local")

    def __init__(self, store: StateStore, writers: int = 4) -> None:
        self.store = store
        self.acked: dict[tuple[str, str], int] = {}
        self.count = 0
        self._progress = asyncio.Condition()
        self._stop = asyncio.Event()
        self._tasks = [asyncio.create_task(self._write(w)) for w in range(writers)]

    async def _write(self, w: int) -> None:
        owner = f"trigger:w{w}"
        durability = self.MODES[w % len(self.MODES)]
        for i in itertools.count(1):
            if self._stop.is_set():
                return
            # a few hot keys, and now and then a key never seen (read through, first write)
            key = f"fresh-{i}" if i % 25 == 0 else f"k{i % 5}"
            await self.store.set(owner, key, i, durability=durability)
            self.acked[owner, key] = i
            self.count += 1
            async with self._progress:
                self._progress.notify_all()
            await asyncio.sleep(0)  # memory writes never suspend: let the others run

    async def more(self, n: int, timeout: float = 20.0) -> None:
        """Wait until `n` more writes were acknowledged."""
        target = self.count + n
        async with self._progress:
            await asyncio.wait_for(self._progress.wait_for(lambda: self.count >= target),
                                   timeout)

    async def stop(self) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks)


async def test_toggle_flipped_both_ways_under_writers_loses_no_write(
    watched_store: StoreFactory, central: CentralStore
) -> None:
    edit_cfg(enabled="True", flush_interval=0.2)
    store = await watched_store()
    watcher = watcher_of(store)
    loop = WriteLoop(store)
    try:
        await loop.more(300)
        for enabled in (False, True, False, True):
            edit_cfg(enabled=enabled, flush_interval=0.2)
            # the setting applies at once; the switch, once the cache's backlog is central
            await reloaded(watcher, lambda e=enabled: (  # type: ignore[misc]
                store.settings.enabled is e and store.stats().cache_enabled is e))
            assert not store.stats().cache_turning_off
            assert watcher.last_error is None
            if not enabled:
                # turning the cache off flushed everything first: every write acknowledged
                # so far is in the central DB already (or a later one of the same key)
                acked = dict(loop.acked)
                held = await central_values(central, list(acked))
                behind = {k: (v, held.get(k)) for k, v in acked.items()
                          if not isinstance(held.get(k), int) or held[k] < v}  # type: ignore[operator]
                assert not behind
                assert store.stats().keys_in_memory == 0
            await loop.more(200)  # writes keep being acknowledged in the new mode
    finally:
        await loop.stop()
    await store.flush()
    held = await central_values(central, list(loop.acked))
    assert held == loop.acked
    assert len(loop.acked) > 4 * 5  # hot keys and fresh ones
    assert watcher.applied == 4


async def test_flush_interval_max_batch_and_durability_apply_live(
    watched_store: StoreFactory, central: CentralStore
) -> None:
    edit_cfg(flush_interval=60, max_batch=10000, durability="local")
    store = await watched_store()
    watcher = watcher_of(store)
    await store.set("o", "early", 1)
    assert store.stats().flushes == 0  # a 60 s interval: nothing flushed yet

    # a shorter interval applies to the running worker (its 60 s wait ends early)
    edit_cfg(flush_interval=0.1, max_batch=10000, durability="local")
    await reloaded(watcher, lambda: store.settings.flush_interval == 0.1)
    assert store.settings.sources["flush_interval"].endswith("[localstate] flush_interval")
    await store.set("o", "late", 2)
    await eventually(lambda: store.stats().dirty_keys == 0)
    assert await central_values(central, [("o", "early"), ("o", "late")]) == {
        ("o", "early"): 1, ("o", "late"): 2}

    # max_batch: rows per central transaction, and the dirty count that starts a flush
    edit_cfg(flush_interval=60, max_batch=5, durability="memory")
    await reloaded(watcher, lambda: store.settings.max_batch == 5)
    assert store.settings.durability == "memory"
    for i in range(12):  # first writes read through (they suspend): the worker may run
        await store.set("batch", f"k{i}", i)
    await store.flush()
    before = store.stats()
    for i in range(12):  # known keys, memory durability: no suspension, so 12 dirty keys
        await store.set("batch", f"k{i}", -i)
    # This flush, or the worker's own (5 dirty keys kicked it, and it may take the flush lock
    # first), writes the 12 keys in batches of 5: 3 transactions either way.
    await store.flush()
    await eventually(lambda: store.stats().dirty_keys == 0)
    after = store.stats()
    assert (after.central_rows - before.central_rows,
            after.central_transactions - before.central_transactions) == (12, 3)
    for i in range(5):  # five dirty keys start a flush although the interval is 60 s
        await store.set("kick", f"k{i}", i)
    await eventually(lambda: store.stats().dirty_keys == 0)

    # durability: a plain set now returns once the central DB holds it
    edit_cfg(flush_interval=60, max_batch=5, durability="central")
    await reloaded(watcher, lambda: store.settings.durability == "central")
    await store.set("o", "sure", 3)
    assert await central_values(central, [("o", "sure")]) == {("o", "sure"): 3}


BAD_EDITS = [
    ({"flush_interval": "soon"}, ["'flush_interval'", "greater than 0"]),
    ({"enabled": "maybe"}, ["'enabled'", "true or false"]),
    ({"durability": "disk"}, ["'durability'", "central, local, memory"]),
    ({"max_batch": "-1"}, ["'max_batch'", "whole number"]),
]


async def test_an_invalid_edit_is_reported_and_the_last_good_settings_stay(
    watched_store: StoreFactory, caplog: pytest.LogCaptureFixture
) -> None:
    edit_cfg(enabled="True", flush_interval=0.5)
    store = await watched_store()
    watcher = watcher_of(store)
    good = store.settings
    for bad, phrases in BAD_EDITS:
        caplog.clear()
        edit_cfg(**{"enabled": "True", "flush_interval": 0.5, **bad})
        await reloaded(watcher, lambda: watcher.last_error is not None)
        error = store.stats().config_error
        assert error is not None
        for phrase in [*phrases, str(cfg_path()), "last good"]:
            assert phrase in error
        assert any(r.levelno == logging.ERROR and phrases[0] in r.getMessage()
                   for r in caplog.records)
        assert store.settings == good  # nothing of the bad file applied
        assert store.stats().cache_enabled is True
        # valid again: the error clears
        edit_cfg(enabled="True", flush_interval=0.5)
        await reloaded(watcher, lambda: watcher.last_error is None)

    cfg_path().write_text("[localstate\nflush_interval = 0.1\n")  # edited in place, broken
    await reloaded(watcher, lambda: watcher.last_error is not None)
    assert "cannot parse" in (store.stats().config_error or "")
    assert store.settings.flush_interval == 0.5

    edit_cfg(enabled="True", flush_interval=0.25)
    await reloaded(watcher, lambda: store.settings.flush_interval == 0.25)
    assert store.stats().config_error is None


async def test_arguments_and_environment_keep_winning_over_the_file(
    watched_store: StoreFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIRFLOW__LOCALSTATE__MAX_BATCH", "77")
    edit_cfg(flush_interval=0.5, max_batch=10, durability="local")
    store = await watched_store(durability="memory")
    watcher = watcher_of(store)
    edit_cfg(flush_interval=0.3, max_batch=20, durability="central")
    await reloaded(watcher, lambda: store.settings.flush_interval == 0.3)
    assert (store.settings.durability, store.settings.max_batch) == ("memory", 77)


async def test_reconfigure_without_a_watcher(central_url: str, tmp_path: Path,
                                             central: CentralStore) -> None:
    async with StateStore(central_url=central_url, cache_path=tmp_path / "r.db",
                          triggerer_id="r", flush_interval=60) as store:
        await store.set("o", "k", 1, durability="memory")
        off = Settings.resolve({"enabled": False, "flush_interval": 60})
        assert await store.reconfigure(off) == ("enabled",)
        assert await central_values(central, [("o", "k")]) == {("o", "k"): 1}
        assert await store.set("o", "k", 2) == 2  # direct: the central version
        assert await store.get("o", "k") == 2
        # a setting that only applies at the next start is logged, not applied
        later = Settings.resolve({"enabled": False, "flush_interval": 60, "absent_ttl": 9})
        assert await store.reconfigure(later) == ()
        assert store.settings.absent_ttl == 5.0
        on = Settings.resolve({"enabled": True, "flush_interval": 60})
        assert await store.reconfigure(on) == ("enabled",)
        assert await store.get("o", "k") == 2  # read through: the file's copy was dropped
        assert await store.set("o", "k", 3) == 3
        await store.flush()
    assert await central_values(central, [("o", "k")]) == {("o", "k"): 3}


@pytest.mark.postgres
async def test_turning_off_while_the_central_db_refuses_waits_serving_from_the_cache(
    pg_server: PostgresServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    dbname = f"reload_{uuid.uuid4().hex[:12]}"
    url = pg_server.create_database(dbname)
    edit_cfg(enabled="True")
    store = await StateStore.open(central_url=url, cache_path=tmp_path / "down.db",
                                  triggerer_id="down", flush_interval=60, close_timeout=1)
    watcher = ConfigWatcher(store, cfg_path(), retry_interval=0.2)
    await watcher.start()
    try:
        await store.set("o", "k", 1)
        pg_server.psql(f'ALTER DATABASE "{dbname}" ALLOW_CONNECTIONS false')
        pg_server.terminate_backends(dbname)
        caplog.clear()
        caplog.set_level(logging.INFO, logger="localstate.store")
        edit_cfg(enabled="False")
        await reloaded(watcher, lambda: store.settings.enabled is False)
        assert watcher.last_error is None  # applied: the switch is pending, not refused
        stats = store.stats()
        assert (stats.cache_enabled, stats.cache_turning_off) == (True, True)
        assert any("pending" in r.getMessage() for r in caplog.records)
        assert stats.cache_turning_off_s > 0
        gauges = MetricsReporter(store, interval=60).sample().gauges  # what metrics report
        assert gauges["cache_turning_off"] > 0
        # still local-first, nothing lost: writes keep being acknowledged from the cache
        assert await store.get("o", "k") == 1
        assert await store.set("o", "k", 2) == 2
        assert store.stats().dirty_keys == 1
        pg_server.psql(f'ALTER DATABASE "{dbname}" ALLOW_CONNECTIONS true')
        await eventually(lambda: not store.stats().cache_enabled, timeout=20)
        assert not store.stats().cache_turning_off
        assert MetricsReporter(store, interval=60).sample().gauges["cache_turning_off"] == 0
        assert any("the local cache is off" in r.getMessage() for r in caplog.records)
        assert await store.get("o", "k") == 2  # now read from the central DB
        assert await store.set("o", "k", 3) == 3  # direct, on from the flushed version
    finally:
        await watcher.stop()
        await store.close()
    c = await CentralStore.open(url)
    try:
        assert await central_values(c, [("o", "k")]) == {("o", "k"): 3}
    finally:
        await c.close()


@pytest.mark.postgres
async def test_a_turn_off_pending_at_close_is_finished_by_the_next_start(
    pg_server: PostgresServer, tmp_path: Path
) -> None:
    dbname = f"reload_{uuid.uuid4().hex[:12]}"
    url = pg_server.create_database(dbname)
    options: dict[str, object] = {
        "central_url": url, "cache_path": tmp_path / "left.db", "triggerer_id": "left",
        "flush_interval": 60, "close_timeout": 1}
    store = await StateStore.open(**options)
    await store.set("o", "k", 1)
    await asyncio.to_thread(pg_server.stop, "fast")
    try:
        await store.reconfigure(Settings.resolve({**options, "enabled": False}))
        assert store.stats().cache_turning_off
        await store.close()  # the backlog cannot be flushed: it stays in the file
        # the next start, with the cache off, serves from the file until it is central
        store = await StateStore.open(**options, enabled=False)
        stats = store.stats()
        assert (stats.cache_enabled, stats.cache_turning_off, stats.dirty_keys) == (
            True, True, 1)
        assert await store.get("o", "k") == 1
    finally:
        await asyncio.to_thread(pg_server.start)
    try:
        await eventually(lambda: not store.stats().cache_enabled, timeout=20)
        assert await store.set("o", "k", 2) == 2
    finally:
        await store.close()
    c = await CentralStore.open(url)
    try:
        assert await central_values(c, [("o", "k")]) == {("o", "k"): 2}
    finally:
        await c.close()


async def test_watching_a_file_in_a_missing_folder_is_refused_and_nothing_stays_open(
    central_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIRFLOW_CONFIG", str(tmp_path / "no-such-folder" / "airflow.cfg"))
    with pytest.raises(ConfigError, match="no-such-folder"):
        await StateStore.open(central_url=central_url, cache_path=tmp_path / "m.db",
                              watch_config=True)
    # the cache file is free again: the failed open released it
    async with StateStore(central_url=central_url, cache_path=tmp_path / "m.db") as store:
        assert store.config_watcher is None
