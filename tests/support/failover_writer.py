"""One triggerer of the failover race: ``python failover_writer.py <json options>``.

It opens a `StateStore` (its own cache file, the shared central DB) and takes orders, one JSON
object a line, on stdin:

``{"own": owner, "epoch": e}``
    this process now runs `owner`'s trigger: it refreshes the owner from the central DB
    (`StateStore.load`, as a triggerer does when a trigger moves to it) and writes its keys in a
    loop. Under ``max`` owners (``asset_watcher:*``) a key's value is a watermark: the value it
    read, then one more each write. Under ``reject`` owners the value is ``[epoch, n]``, n
    counting from 1, so every write names the ownership it was made under.
``{"release": owner}``
    stop writing `owner` (after the write in progress); answers ``RELEASED``.
``{"quit": true}``
    stop every loop, close the store (which flushes), report, exit.

It reports on stdout, one ``os.write`` per line, tab-separated: ``READY``, ``OWNED owner``,
``ACK owner key value version`` after each acknowledged set, ``CONFLICT <ConflictInfo as JSON>``
from the `on_conflict` callback,
``RELEASED owner``, and at the end ``CLOSED conflicts dirty_keys`` from its stats. The parent
may stop it with SIGSTOP at any moment and wake it with SIGCONT: a zombie that still believes
it owns its owners and flushes late.
"""

from __future__ import annotations

import asyncio
import dataclasses
import faulthandler
import json
import os
import signal
import sys
from typing import Any

from localstate import StateStore
from localstate._bench.child_process import report_line
from localstate._sync.flush.settle import ConflictInfo

KEYS = ("watermark", "cursor")


def on_conflict(info: ConflictInfo) -> None:
    report_line("CONFLICT", json.dumps(dataclasses.asdict(info)))


async def write_loop(store: StateStore, owner: str, epoch: int, stop: asyncio.Event,
                     pace: float) -> None:
    await store.load(owner)
    watermark = owner.startswith("asset_watcher:")
    counters = {key: int(await store.get(owner, key, 0)) if watermark else 0 for key in KEYS}
    report_line("OWNED", owner)
    while not stop.is_set():
        for key in KEYS:
            counters[key] += 1
            value: Any = counters[key] if watermark else [epoch, counters[key]]
            version = await store.set(owner, key, value)
            report_line("ACK", owner, key, json.dumps(value, separators=(",", ":")), version)
        await asyncio.sleep(pace)


def dump_tasks() -> None:
    """Every task's stack to stderr: the parent sends SIGUSR1 when a release hangs."""
    for task in asyncio.all_tasks():
        task.print_stack(file=sys.stderr)


async def main(options: dict[str, Any]) -> None:
    store = await StateStore.open(
        central_url=options["central_url"], cache_path=options["cache_path"],
        triggerer_id=options["triggerer_id"], conflict_policy=options["conflict_policy"],
        flush_interval=options["flush_interval"], local_sync="normal",
        on_conflict=on_conflict,
    )
    loops: dict[str, tuple[asyncio.Task[None], asyncio.Event]] = {}
    commands: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    pending = bytearray()

    def read_commands() -> None:
        # raw reads: a buffered readline could keep a second line where no wakeup finds it
        data = os.read(0, 65536)
        pending.extend(data or b'{"quit": true}\n')
        while (end := pending.find(b"\n")) >= 0:
            commands.put_nowait(json.loads(pending[:end]))
            del pending[:end + 1]

    loop = asyncio.get_running_loop()
    loop.add_reader(0, read_commands)
    loop.add_signal_handler(signal.SIGUSR1, dump_tasks)
    report_line("READY")

    async def release(owner: str) -> None:
        if owner in loops:
            task, stop = loops.pop(owner)
            stop.set()
            await task  # re-raises a failed set: the parent sees the process die

    while True:
        command = await commands.get()
        if "own" in command:
            stop = asyncio.Event()
            task = asyncio.create_task(write_loop(store, command["own"], command["epoch"],
                                                  stop, options["pace"]))
            loops[command["own"]] = (task, stop)
        elif "release" in command:
            await release(command["release"])
            report_line("RELEASED", command["release"])
        else:
            break
    loop.remove_reader(0)
    for owner in list(loops):
        await release(owner)
    await store.close()
    stats = store.stats()
    report_line("CLOSED", stats.conflicts, stats.dirty_keys)


if __name__ == "__main__":
    faulthandler.register(signal.SIGUSR2)  # the parent asks for stacks when a release hangs
    asyncio.run(main(json.loads(sys.argv[1])))
