"""A store restarted while PostgreSQL is down writes and deletes keys it does not hold in memory.

Issue #21: such a write used to be acknowledged as version 1 (the record was further on) and
such a delete answered "nothing there" and was dropped. Here a triggerer's store wrote its keys
and emptied its memory (the cache turned off and on), a peer wrote keys of its own, PostgreSQL
stops, the store restarts on the same cache file and writes and deletes both kinds of keys,
then PostgreSQL comes back. The checks, against the central DB itself:

* no version handed to a caller is at or below the central version the key had before, and
  each key's versions only grow;
* every write and every delete happened: the central DB holds the last value written (at the
  version answered for it), or a tombstone;
* once the DB is back, the store's reads agree with the central DB (waited for with a
  generous deadline, never timed).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path
from typing import Any

import orjson
from fault_tally import FaultTally

from localstate import StateStore
from localstate._cache.entry import StateKey
from localstate._sync.central.central_store import CentralStore
from localstate._testing.postgres_server import PostgresServer

OWN = [(f"trigger:rwd-{o}", f"k{k}") for o in range(4) for k in range(5)]
PEER = [(f"peer:rwd-{o}", f"k{k}") for o in range(2) for k in range(5)]
POLICY = {"peer:*": "last_writer_wins", "*": "reject"}  # a peer's record is meant to be taken
FLUSH_INTERVAL = 0.5


async def central_rows(url: str) -> dict[StateKey, tuple[Any, int]]:
    central = await CentralStore.open(url)
    try:
        rows = await central.read_many(OWN + PEER)
    finally:
        await central.close()
    return {k: (None if r.data is None else orjson.loads(r.data), r.version)
            for k, r in rows.items()}


async def test_a_restart_during_an_outage_writes_and_deletes_what_it_does_not_hold(
    private_pg: PostgresServer, tmp_path: Path, fault_tally: FaultTally,
) -> None:
    url = private_pg.create_database(f"rwd_{uuid.uuid4().hex[:12]}")
    cache = tmp_path / "triggerer.db"
    async with StateStore(central_url=url, cache_path=cache, triggerer_id="t",
                          conflict_policy=POLICY) as first:
        for n in range(3):  # a few versions each
            for owner, key in OWN:
                await first.set(owner, key, n, durability="memory")
        await first.flush()
        await first.reconfigure(first.settings.replace(enabled=False))  # memory and file
        await first.reconfigure(first.settings.replace(enabled=True))   # emptied
    async with StateStore(central_url=url, cache_path=tmp_path / "peer.db",
                          triggerer_id="peer") as peer:
        for owner, key in PEER:
            await peer.set(owner, key, "peer's", durability="central")
    before = await central_rows(url)
    assert {k: v for k, (_value, v) in before.items()} == {
        **dict.fromkeys(OWN, 3), **dict.fromkeys(PEER, 1)}

    doomed = set(OWN[::3] + PEER[::3])
    answered: dict[StateKey, list[int]] = {k: [] for k in OWN + PEER}
    last: dict[StateKey, Any] = {}
    await asyncio.to_thread(private_pg.stop, "fast")
    try:
        store = await StateStore.open(central_url=url, cache_path=cache, triggerer_id="t",
                                      conflict_policy=POLICY, flush_interval=FLUSH_INTERVAL)
        assert store.stats().keys_in_memory == 0
        for round_ in range(2):
            for k in OWN + PEER:
                if k in doomed and round_ == 1:
                    assert await store.delete(*k) is True  # "deleted, or maybe": never False
                    last[k] = None
                    continue
                value = f"after-restart-{round_}"
                answered[k].append(await store.set(*k, value, durability="local"))
                last[k] = value
    finally:
        await asyncio.to_thread(private_pg.start)
    try:
        for k, versions in answered.items():
            assert versions == sorted(set(versions)), (k, versions)  # only grows
            assert versions[0] > before[k][1], (k, versions, before[k])  # above central's
        # the worker flushes on its own once the DB answers; wait for it (bounded)
        deadline = time.monotonic() + 60
        while store.stats().dirty_keys:
            assert time.monotonic() < deadline, f"still dirty: {store.stats()}"
            await asyncio.sleep(FLUSH_INTERVAL / 5)
        central = await central_rows(url)
        reads = {k: await store.get(*k) for k in OWN + PEER}
        # each peer key's first flush met the peer's record, taken under last_writer_wins
        assert store.stats().conflicts == len(PEER)
    finally:
        await store.close()
    lost = {k: (central.get(k), value) for k, value in last.items()
            if k not in central or central[k][0] != value}
    fault_tally.add("writes and deletes made while the central DB was down, after a restart",
                    sum(len(v) for v in answered.values()) + len(doomed))
    fault_tally.lost("writes and deletes of keys not in memory during an outage", len(lost))
    assert not lost, lost
    for k, versions in answered.items():
        if k not in doomed:
            assert central[k][1] == versions[-1], (k, central[k], versions)
        else:
            assert central[k][1] > versions[-1], (k, central[k], versions)  # the tombstone
    assert reads == {k: central[k][0] for k in OWN + PEER}
