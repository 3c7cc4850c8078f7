"""The process `test_emit_crash.py` kills: ``python emit_writer.py <central_url> <cache_path>
<flush_interval> <last>``.

Opens a `StateStore` (``local`` durability) as a restarted trigger would, reads its watermark,
prints ``READY <watermark>``, then emits one event per item from the watermark on, each with
``await store.emit(OWNER, {"item": i}, watermark=i)``, and after each acknowledged emit writes
``ACK <i>`` with a single ``os.write`` (atomic on a pipe, unbuffered: every line written was
acknowledged before a kill). At `last` it closes the store (the final flush) and prints
``DONE``.
"""

from __future__ import annotations

import asyncio
import os
import sys

OWNER = "trigger:emit-crash"


async def main(central_url: str, cache_path: str, flush_interval: float, last: int) -> None:
    from localstate import StateStore

    store = await StateStore.open(central_url=central_url, cache_path=cache_path,
                                  triggerer_id="emit-writer", durability="local",
                                  flush_interval=flush_interval)
    watermark = int(await store.get(OWNER, "watermark", 0))
    os.write(1, f"READY {watermark}\n".encode())
    for i in range(watermark + 1, last + 1):
        await store.emit(OWNER, {"item": i}, watermark=i)
        os.write(1, f"ACK {i}\n".encode())
    await store.close()
    os.write(1, b"DONE\n")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])))
