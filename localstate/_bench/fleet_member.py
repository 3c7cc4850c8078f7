"""One triggerer of the fleet benchmark: ``python -m localstate._bench.fleet_member <json>``.

It opens a `StateStore` on the shared central DB (its own cache file) and runs the triggers it
is given, each a task that claims its owner (as `StateEnabledTrigger` does when it starts),
reads its watermark and then sets it one higher every ``set_interval`` seconds, until it is
dropped or its store raises `OwnerLost` (a zombie's trigger stops there).

Orders on stdin, one JSON object a line: ``{"own": [owners]}``, ``{"drop": [owners]}``,
``{"quit": true}`` (stop the triggers, close the store, report). Reports on stdout, one line
each: ``READY``, ``OWNED <n>`` once the triggers of an ``own`` have claimed, ``LOST <owner>
<POSIX time>`` when a trigger stops on `OwnerLost`, and ``STATS <json>`` at the end.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import time
from typing import Any

from localstate._store import StateStore
from localstate.errors import OwnerLost

__all__ = ["main"]


def _say(*fields: object) -> None:
    os.write(1, (" ".join(str(f) for f in fields) + "\n").encode())


async def _trigger(store: StateStore, owner: str, set_interval: float, stop: asyncio.Event,
                   claimed: asyncio.Event, losses: list[str]) -> None:
    await store.claim(owner)
    claimed.set()
    watermark = int(await store.get(owner, "watermark", 0))
    try:
        while not stop.is_set():
            watermark += 1
            await store.set(owner, "watermark", watermark)
            await asyncio.sleep(set_interval)  # a poll's wait (a benchmark, not the library)
    except OwnerLost:
        losses.append(owner)
        _say("LOST", owner, time.time())


async def main(options: dict[str, Any]) -> None:
    logging.getLogger("localstate.store").setLevel(logging.ERROR)  # each loss: a LOST line
    store = await StateStore.open(
        central_url=options["central_url"], cache_path=options["cache_path"],
        triggerer_id=options["triggerer_id"], flush_interval=options["flush_interval"],
        durability="memory", central_budget_rows_per_s=options.get("budget"),
    )
    tasks: dict[str, tuple[asyncio.Task[None], asyncio.Event]] = {}
    losses: list[str] = []
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    _say("READY")
    while line := await reader.readline():
        command = json.loads(line)
        if "own" in command:
            events = []
            for owner in command["own"]:
                stop, claimed = asyncio.Event(), asyncio.Event()
                events.append(claimed)
                tasks[owner] = (asyncio.create_task(_trigger(
                    store, owner, options["set_interval"], stop, claimed, losses)), stop)
            await asyncio.gather(*(e.wait() for e in events))
            _say("OWNED", len(events))
        elif "drop" in command:
            for owner in command["drop"]:
                task, stop = tasks.pop(owner)
                stop.set()
                await task
        else:
            break
    for _task, stop in tasks.values():
        stop.set()
    await asyncio.gather(*(t for t, _ in tasks.values()))
    await store.close()
    s = store.stats()
    _say("STATS", json.dumps({
        "sets": s.sets, "flushes": s.flushes, "central_transactions": s.central_transactions,
        "central_rows": s.central_rows, "lag_p99_s": s.flush_lag_p99_s,
        "flush_interval_s": s.flush_interval_s, "owners_lost": len(losses),
        "zombie_writes_refused": store.claims_refused,
    }))


if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.argv[1])))
