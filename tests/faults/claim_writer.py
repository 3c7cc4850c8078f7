"""One triggerer of the claim failover test: ``python claim_writer.py <json options>``.

It opens a `StateStore` (its own cache file, the shared central DB; flushes only when told)
and runs orders, one JSON object a line on stdin, one at a time, answering each with
``DONE <id> <answer>`` (one ``os.write`` per line):

``{"id": n, "claim": owner}``
    `StateStore.claim`: answers the epoch.
``{"id": n, "write": owner, "key": key, "value": v}``
    a set in ``memory`` durability: answers ``ok <version>``, or ``lost`` when the store
    refused it with `OwnerLost`.
``{"id": n, "get": owner, "key": key}``
    answers the value as JSON.
``{"id": n, "flush": true}``
    a flush: answers ``<lost> <conflicts>``, the writes it saw refused for their claim epoch
    and the conflicts it settled by policy.
``{"quit": true}``
    closes the store and exits.

The parent may SIGSTOP it at any moment (mid-flush too) and SIGCONT it later: a zombie.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
from typing import Any

from localstate import StateStore
from localstate.errors import OwnerLost


def answer(n: int, *fields: object) -> None:
    os.write(1, (" ".join(["DONE", str(n), *(str(f) for f in fields)]) + "\n").encode())


async def run(store: StateStore, command: dict[str, Any]) -> None:
    n = command["id"]
    if "claim" in command:
        answer(n, await store.claim(command["claim"]))
    elif "write" in command:
        try:
            version = await store.set(command["write"], command["key"], command["value"],
                                      durability="memory")
        except OwnerLost:
            answer(n, "lost")
        else:
            answer(n, "ok", version)
    elif "get" in command:
        value = await store.get(command["get"], command["key"])
        answer(n, json.dumps(value, separators=(",", ":")))
    else:
        report = await store.flush()
        lost = sum(1 for o in report.outcomes if o.lost_to)
        answer(n, lost, report.conflicts)


async def main(options: dict[str, Any]) -> None:
    store = await StateStore.open(
        central_url=options["central_url"], cache_path=options["cache_path"],
        triggerer_id=options["triggerer_id"], conflict_policy=options["conflict_policy"],
        flush_interval=3600.0, local_sync="normal", central_thread=False,
    )
    # each loss is logged once; here they are the point, and thousands
    logging.getLogger("localstate.store").setLevel(logging.ERROR)
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    os.write(1, b"READY\n")
    while line := await reader.readline():
        command = json.loads(line)
        if "quit" in command:
            break
        await run(store, command)
    await store.close()


if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.argv[1])))
