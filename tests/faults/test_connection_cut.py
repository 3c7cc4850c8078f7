"""Central connections cut in the middle of flushes: pg_terminate_backend on PostgreSQL,
KILL CONNECTION on MySQL.

Every acknowledged write must reach the central DB exactly once: each key's central version
equals the number of times it was set, and its value is the last one set.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections import Counter
from pathlib import Path

from central_history import current_rows
from fault_tally import FaultTally

from localstate import CentralError, StateStore
from localstate._testing.mysql_server import MysqlServer
from localstate._testing.postgres_server import PostgresServer

KEYS = 20_000
ROUNDS = 3


async def test_backends_terminated_mid_flush_lose_and_duplicate_nothing(
    db_server: PostgresServer | MysqlServer, tmp_path: Path, fault_tally: FaultTally
) -> None:
    dbname = f"cut_{uuid.uuid4().hex[:12]}"
    url = db_server.create_database(dbname)
    cut = (db_server.terminate_backends if isinstance(db_server, PostgresServer)
           else db_server.kill_connections)
    store = await StateStore.open(cache_path=tmp_path / "cut.db", central_url=url,
                                  triggerer_id="cut", flush_interval=0.2)
    killed = 0
    failed_flushes = 0
    try:
        for n in range(ROUNDS):
            for start in range(0, KEYS, 2000):  # local durability: acknowledged on return
                await asyncio.gather(*(store.set(f"trigger:cut:{i}", "watermark", n)
                                       for i in range(start, start + 2000)))
            flush = asyncio.create_task(store.flush())
            while not flush.done():
                killed += await asyncio.to_thread(cut, dbname)
                await asyncio.sleep(0.005)
            try:
                await flush
            except CentralError:
                failed_flushes += 1
        # the DB answers again: flush until nothing is dirty (bounded)
        for _ in range(50):
            with contextlib.suppress(CentralError):
                await store.flush()
            if store.stats().dirty_keys == 0:
                break
        assert store.stats().dirty_keys == 0
    finally:
        await store.close()
    assert killed > 0, "no backend was ever terminated: the test cut nothing"
    counts = Counter((value, version) for _o, _k, value, version in
                     await current_rows(url, "trigger:cut:"))
    # every key: set ROUNDS times, so exactly version ROUNDS, holding the last value
    held = counts[str(ROUNDS - 1), ROUNDS]
    backend = "mysql" if isinstance(db_server, MysqlServer) else "postgresql"
    fault_tally.add("backends terminated mid-flush", killed)
    fault_tally.add("acknowledged writes checked", KEYS * ROUNDS)
    fault_tally.lost(f"local, through connection cuts ({backend})", KEYS - held)
    assert sorted(counts.items()) == [((str(ROUNDS - 1), ROUNDS), KEYS)]
    print(f"\nconnection cuts: {killed} backends terminated, {failed_flushes} flushes failed "
          f"mid-way, {KEYS * ROUNDS} acknowledged writes checked, lost=0, duplicated=0")
