"""A central DB that stops answering: the server frozen (SIGSTOP), as a host that hangs or a
network that drops packets looks to its clients. No error comes back and no timeout fires: a
flush under way waits, and must not take `close()` with it.

Related: a server that is down or restarting (`test_central_outage.py`), connections cut in the
middle of a flush (`test_connection_cut.py`).
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest

from localstate import CentralUnavailable, StateStore
from localstate._sync.central.central_store import CentralStore
from localstate._testing.postgres_server import PostgresServer

OWNER = "asset_watcher:orders"


@contextmanager
def frozen(server: PostgresServer) -> Iterator[None]:
    """Every process of `server` stopped (SIGSTOP) for the block, then woken (SIGCONT)."""
    pid = int((server.data_dir / "postmaster.pid").read_text().split()[0])
    postmaster = psutil.Process(pid)
    procs = [postmaster, *postmaster.children(recursive=True)]
    for proc in procs:
        proc.send_signal(signal.SIGSTOP)
    try:
        yield
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGCONT)


@pytest.mark.parametrize("central_thread", [True, False], ids=["thread", "loop"])
async def test_close_ends_within_close_timeout_while_a_flush_hangs(
        private_pg: PostgresServer, tmp_path: Path, central_thread: bool) -> None:
    url = private_pg.create_database(f"hang_{int(central_thread)}")
    options = {"central_url": url, "cache_path": tmp_path / "cache.db", "triggerer_id": "t",
               "central_thread": central_thread}
    store = await StateStore.open(**options, flush_interval=0.05, close_timeout=1)
    try:
        await store.set(OWNER, "wm", 1)
        await store.flush()
        with frozen(private_pg):
            await store.set(OWNER, "wm", 2)  # acknowledged locally
            await asyncio.sleep(0.5)  # the loop's next flush has begun, and waits
            # before: close awaited that flush for as long as the server stayed frozen
            await asyncio.wait_for(store.close(), 30)
    finally:
        await store.close()
    # the write was kept: the next start flushes it
    again = await StateStore.open(**options, flush_interval=3600)
    try:
        await again.flush()
    finally:
        await again.close()
    async with CentralStore.open(url) as central:
        [row] = (await central.read_many([(OWNER, "wm")])).values()
    assert row.data == "2"


@pytest.mark.parametrize("central_thread", [True, False], ids=["thread", "loop"])
async def test_a_flush_the_frozen_db_does_not_answer_is_abandoned_then_retried(
        private_pg: PostgresServer, tmp_path: Path, central_thread: bool) -> None:
    url = private_pg.create_database(f"stall_{int(central_thread)}")
    store = await StateStore.open(central_url=url, cache_path=tmp_path / "cache.db",
                                  triggerer_id="t", central_thread=central_thread,
                                  flush_interval=3600, flush_timeout=0.5)
    try:
        await store.set(OWNER, "wm", 1)
        await store.flush()
        with frozen(private_pg):
            await store.set(OWNER, "wm", 2)
            # before: this flush waited for as long as the server stayed frozen
            with pytest.raises(CentralUnavailable, match="flush_timeout"):
                await asyncio.wait_for(store.flush(), 30)
            assert store.stats().dirty_keys == 1
        report = await store.flush()  # the server answers again: the write goes out
        assert report.written == 1
    finally:
        await store.close()
    async with CentralStore.open(url) as central:
        [row] = (await central.read_many([(OWNER, "wm")])).values()
    assert row.data == "2"
