"""The process `test_crash.py` kills: run as ``python tests/crash_writer.py <mode> ...``.

``store`` mode
    Opens a `StateStore` and runs a hot loop of increasing integer writes over many owners and
    keys from concurrent writer coroutines (each key belongs to one coroutine, so a key's values
    are acknowledged in increasing order). It first reads every key's current value and prints
    ``READY <pid>``; then after each acknowledged ``await store.set(...)`` it writes one line
    ``<owner> <key> <value> <version> <monotonic time>`` to stdout with a single ``os.write``
    (atomic on a pipe, so a SIGKILL never leaves half a line, and unbuffered, so every line
    written was acknowledged before the kill).

``first-open`` mode
    Crash points of a cache's very first open: for each n it forks a child that opens a new
    `LocalCache` and SIGKILLs itself when SQLite starts the n-th statement (then the parent of
    the forks reports ``<n> killed`` or ``<n> finished``). The test then opens every file.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import time
from pathlib import Path
from typing import Any

OWNER_PREFIX = "asset_watcher:crash-"


def state_keys(owners: int, keys: int) -> list[tuple[str, str]]:
    return [(f"{OWNER_PREFIX}{o:02d}", f"k{k}") for o in range(owners) for k in range(keys)]


# -- store mode -------------------------------------------------------------------------------


async def run_store(args: argparse.Namespace) -> None:
    from localstate import StateStore

    store = await StateStore.open(
        central_url=args.central_url,
        cache_path=args.cache_path,
        triggerer_id=args.triggerer_id,
        durability=args.durability,
        flush_interval=args.flush_interval,
        local_sync=args.local_sync,
        memory_window=args.memory_window,
    )
    keys = state_keys(args.owners, args.keys)
    start = await asyncio.gather(*(store.get(o, k, 0) for o, k in keys))
    current: dict[tuple[str, str], int] = {k: int(v) for k, v in zip(keys, start, strict=True)}
    os.write(1, f"READY {os.getpid()}\n".encode())

    async def writer(mine: list[tuple[str, str]]) -> None:
        while True:
            for owner, key in mine:
                value = current[owner, key] + 1
                version = await store.set(owner, key, value)
                current[owner, key] = value
                os.write(1, f"{owner} {key} {value} {version} {time.monotonic()!r}\n".encode())
                if args.pace:
                    # a memory write never yields to the loop; real triggers await I/O
                    await asyncio.sleep(args.pace)

    await asyncio.gather(*(writer(keys[w::args.writers]) for w in range(args.writers)))


# -- first-open mode --------------------------------------------------------------------------


def _die_at_statement(n: int) -> Any:
    count = 0

    def trace(_sql: str) -> None:
        nonlocal count
        count += 1
        if count == n:
            os.kill(os.getpid(), signal.SIGKILL)

    return trace


async def _open_and_write(path: Path, n: int) -> None:
    import aiosqlite

    from localstate.entry import Entry
    from localstate.local_cache import LocalCache

    real_connect = aiosqlite.connect

    async def traced(database: Any, **kwargs: Any) -> aiosqlite.Connection:
        conn = await real_connect(database, **kwargs)
        # called by SQLite as each statement starts: the kill lands between two statements
        await conn.set_trace_callback(_die_at_statement(n))
        return conn

    aiosqlite.connect = traced  # type: ignore[assignment]
    cache = await LocalCache.open(path, owner_id="crash-first-open")
    await cache.commit(("owner", "key"), Entry("1", 1, 1, time.time(), "crash-first-open", 0))
    await cache.close()


def run_first_open(args: argparse.Namespace) -> None:
    # import once, before forking: each fork then starts in milliseconds
    import localstate.local_cache  # noqa: F401

    folder = Path(args.folder)
    for n in range(1, args.max_statements + 1):
        pid = os.fork()
        if pid == 0:  # the child: no event loop runs in the parent, so a fresh one is safe
            try:
                asyncio.run(_open_and_write(folder / f"cache-{n}.db", n))
            except BaseException as exc:
                os.write(2, f"statement {n}: {exc!r}\n".encode())
                os._exit(1)
            os._exit(0)
        _pid, status = os.waitpid(pid, 0)
        if os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL:
            outcome = "killed"
        elif os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0:
            outcome = "finished"
        else:
            outcome = f"failed:{status}"
        os.write(1, f"{n} {outcome}\n".encode())


def main() -> None:
    parser = argparse.ArgumentParser()
    modes = parser.add_subparsers(dest="mode", required=True)
    store = modes.add_parser("store")
    store.add_argument("--central-url", required=True)
    store.add_argument("--cache-path", required=True)
    store.add_argument("--triggerer-id", required=True)
    store.add_argument("--durability", default="local")
    store.add_argument("--flush-interval", type=float, default=0.1)
    store.add_argument("--local-sync", default="full")
    store.add_argument("--memory-window", type=float, default=0.05)
    store.add_argument("--owners", type=int, default=50)
    store.add_argument("--keys", type=int, default=4)
    store.add_argument("--writers", type=int, default=25)
    store.add_argument("--pace", type=float, default=0.0)
    first = modes.add_parser("first-open")
    first.add_argument("--folder", required=True)
    first.add_argument("--max-statements", type=int, default=30)
    args = parser.parse_args()
    if args.mode == "store":
        asyncio.run(run_store(args))
    else:
        run_first_open(args)


if __name__ == "__main__":
    main()
