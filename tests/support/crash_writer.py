"""The processes the crash harness (`crash_harness.py`) kills:
``python crash_writer.py <mode> ...``.

``store`` mode
    Opens a `StateStore` and runs a hot loop of increasing integer writes over many owners and
    keys from concurrent writer coroutines (each key belongs to one coroutine, so a key's values
    are acknowledged in increasing order, and a value always equals the version it was written
    at when the key starts from nothing). It first reads every key's current value and prints
    ``READY <pid>``; then after each acknowledged ``await store.set(...)`` it writes one line
    ``<owner> <key> <value> <version> <monotonic time>`` to stdout with a single ``os.write``
    (atomic on a pipe, so a SIGKILL never leaves half a line, and unbuffered, so every line
    written was acknowledged before the kill).

``zygote`` mode
    A fork server for many ``store`` runs: it imports the library once (about a second of
    imports a fresh interpreter pays each round), then for each JSON line of `store` options it
    reads on stdin forks a child that runs the store loop above on the shared stdout, waits for
    it to die, and writes ``EXIT <pid> <wait status>``. The child is a real process of its own
    (its own memory, file descriptors, SQLite and PostgreSQL connections); the parent of the
    test kills it by pid. Every line the child wrote precedes its ``EXIT`` line.

``first-open`` mode
    Crash points of a cache's very first open: for each n it forks a child that opens a new
    `LocalCache` and SIGKILLs itself when SQLite starts the n-th statement (then the parent of
    the forks reports ``<n> killed`` or ``<n> finished``). The test then opens every file.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
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


STORE_DEFAULTS: dict[str, Any] = {
    "triggerer_id": "crash-triggerer", "durability": "local", "flush_interval": 0.1,
    "local_sync": "full", "memory_window": 0.05, "owners": 50, "keys": 4, "writers": 25,
    "pace": 0.0,
}


def add_store_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--central-url", required=True)
    parser.add_argument("--cache-path", required=True)
    for name, default in STORE_DEFAULTS.items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=type(default), default=default)


# -- zygote mode ------------------------------------------------------------------------------


def run_zygote() -> None:
    # import everything a store run needs once, before forking: each fork starts at once
    import aiosqlite  # noqa: F401
    import asyncpg  # noqa: F401
    import sqlalchemy.dialects.postgresql.asyncpg
    import sqlalchemy.dialects.sqlite.aiosqlite  # noqa: F401

    import localstate._store
    import localstate._sync.central.central_store  # noqa: F401

    for line in sys.stdin:
        options = {**STORE_DEFAULTS, **json.loads(line)}
        pid = os.fork()
        if pid == 0:  # the child: no event loop or thread runs in the zygote, so this is safe
            code = 0
            try:
                asyncio.run(run_store(argparse.Namespace(**options)))
            except BaseException as exc:
                os.write(2, f"store run failed: {exc!r}\n".encode())
                code = 1
            os._exit(code)
        _pid, status = os.waitpid(pid, 0)
        os.write(1, f"EXIT {pid} {status}\n".encode())


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

    from localstate._cache.entry import Entry
    from localstate._cache.local_cache import LocalCache

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
    import localstate._cache.local_cache  # noqa: F401

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
    add_store_arguments(modes.add_parser("store"))
    modes.add_parser("zygote")
    first = modes.add_parser("first-open")
    first.add_argument("--folder", required=True)
    first.add_argument("--max-statements", type=int, default=30)
    args = parser.parse_args()
    if args.mode == "store":
        asyncio.run(run_store(args))
    elif args.mode == "zygote":
        run_zygote()
    else:
        run_first_open(args)


if __name__ == "__main__":
    main()
