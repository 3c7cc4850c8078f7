"""A program that never closes its store still exits, and loses nothing it was told is written.

Each case is a real program: a subprocess of this interpreter, with a timeout (a program that
hangs at exit fails the test with what it printed). Its store writes to a central DB of each
backend, directly (``sink = sql``) or through a real `localstate serve` (``sink = api``); the
``airflow`` sink runs only inside a triggerer (tests/airflow/test_airflow_left_open.py).

* A program whose code raises between open and close exits with status 1, for every
  combination of the cache on or off and the sink, and the write it made reaches the central
  DB (directly, or through the next open of its cache file). The same for the other fronts:
  `BlockingStateStore`, and `StateClient` and `AsyncStateClient` (no thread of their own).
* A program that ends normally with its store open, whichever way its event loop ends
  (``asyncio.run``, ``loop.run_until_complete`` then ``loop.close()``, or a
  `BlockingStateStore` whose loop runs on its own thread), exits with status 0, warns with a
  `ResourceWarning` naming the cache file, and leaves every acknowledged write in the file,
  ``memory`` writes of an unfinished window included; the next open flushes all of them.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from api_server import RW_TOKEN, ServeProcess

from localstate import StateStore

#: seconds a program may take to exit before it counts as hung (a hang is forever)
HUNG = 60.0

RAISES = """
import asyncio, json, sys, time
from localstate import StateStore

async def main():
    store = await StateStore.open(**json.loads(sys.argv[1]))
    await store.set("o", "k", 1)
    print(time.monotonic(), flush=True)
    raise RuntimeError("user code failed before close()")

asyncio.run(main())
"""

OTHER_FRONTS = """
import asyncio, json, sys, time

front, options = sys.argv[1], json.loads(sys.argv[2])

def failed():
    print(time.monotonic(), flush=True)
    raise RuntimeError("user code failed before close()")

if front == "blocking":
    from localstate import BlockingStateStore
    store = BlockingStateStore(**options)
    store.set("o", "k", 1)
    failed()
elif front == "client":
    from localstate.client import StateClient
    client = StateClient(options["api_url"], token=options["api_token"])
    client.set("o", "k", 1)
    failed()
else:
    from localstate.client import AsyncStateClient

    async def main():
        client = AsyncStateClient(options["api_url"], token=options["api_token"])
        await client.set("o", "k", 1)
        failed()

    asyncio.run(main())
"""

#: one `local` write, then `memory` writes the 30 s window has not committed when it ends
LEFT_OPEN = """
import asyncio, json, sys, time
from localstate import StateStore
from localstate.blocking import BlockingStateStore

how, options = sys.argv[1], json.loads(sys.argv[2])
WRITES = int(sys.argv[3])

async def body():
    store = await StateStore.open(**options)
    await store.set("o", "local", 0)
    for i in range(1, WRITES):
        await store.set("o", f"m{i}", i, durability="memory")
    return store

if how == "asyncio.run":
    store = asyncio.run(body())
elif how == "run_until_complete":
    loop = asyncio.new_event_loop()
    store = loop.run_until_complete(body())
    loop.close()
else:
    store = BlockingStateStore(**options)
    store.set("o", "local", 0)
    for i in range(1, WRITES):
        store.set("o", f"m{i}", i, durability="memory")
print(time.monotonic(), flush=True)
"""


@pytest.fixture(params=["sql", "api"])
def sink(request: pytest.FixtureRequest, central_url: str) -> Iterator[dict[str, Any]]:
    """The options that point a store at the test's central DB through the sink."""
    if request.param == "sql":
        yield {"central_url": central_url}
        return
    server = ServeProcess(central_url)
    server.start()
    try:
        yield {"sink": "api", "api_url": server.url, "api_token": RW_TOKEN}
    finally:
        server.stop()


def run(script: str, *args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    """Run `script`; also return the seconds from the time it printed until it exited."""
    proc = subprocess.Popen([sys.executable, "-W", "always::ResourceWarning", "-c", script,
                             *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=HUNG)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"the program did not exit within {HUNG:g} s:\n{out}\n{err[-3000:]}")
    ended = time.monotonic()
    printed = float(out.split()[-1]) if out.strip() else ended
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), ended - printed


async def central_values(options: dict[str, Any], cache: Path, keys: list[str]
                         ) -> dict[str, Any]:
    """Open a store on `cache` (the next open), let it flush, and read `keys` as the central
    DB committed them."""
    async with StateStore(**options, cache_path=cache, triggerer_id="h",
                          flush_interval=60.0) as store:
        await store.flush()
        records = {k: await store.read_committed("o", k) for k in keys}
    return {k: r.value for k, r in records.items() if r is not None}


@pytest.mark.parametrize("enabled", [True, False], ids=["cache-on", "cache-off"])
async def test_a_program_that_raises_before_close_exits(
    sink: dict[str, Any], enabled: bool, tmp_path: Path,
) -> None:
    cache = tmp_path / "h.db"
    options = {**sink, "cache_path": str(cache), "triggerer_id": "h", "enabled": enabled}
    done, seconds = run(RAISES, json.dumps(options))
    print(f"\n{sink.get('sink', 'sql')}, cache {'on' if enabled else 'off'}: exit {seconds:.2f} "
          "s after the raise")
    assert done.returncode == 1, done.stderr[-3000:]
    assert "RuntimeError: user code failed before close()" in done.stderr
    assert await central_values(sink, cache, ["k"]) == {"k": 1}


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)  # no central DB of its own
@pytest.mark.parametrize("front", ["blocking", "client", "async-client"])
async def test_the_other_fronts_exit_when_their_code_raises_before_close(
    central_url: str, front: str, tmp_path: Path,
) -> None:
    cache = tmp_path / "h.db"
    server = ServeProcess(central_url)
    if front == "blocking":
        options: dict[str, Any] = {"central_url": central_url, "cache_path": str(cache),
                                   "triggerer_id": "h"}
    else:
        server.start()
        options = {"api_url": server.url, "api_token": RW_TOKEN}
    try:
        done, seconds = run(OTHER_FRONTS, front, json.dumps(options))
    finally:
        server.stop()
    print(f"\n{front}: exit {seconds:.2f} s after the raise")
    assert done.returncode == 1, done.stderr[-3000:]
    assert "RuntimeError: user code failed before close()" in done.stderr
    assert await central_values({"central_url": central_url}, cache, ["k"]) == {"k": 1}


@pytest.mark.parametrize("how", ["asyncio.run", "run_until_complete", "blocking"])
async def test_a_store_left_open_warns_and_its_next_open_flushes_every_write(
    central_url: str, how: str, tmp_path: Path,
) -> None:
    cache = tmp_path / "h.db"
    writes = 200
    options = {"central_url": central_url, "cache_path": str(cache), "triggerer_id": "h",
               "memory_window": 30.0, "flush_interval": 60.0}
    done, seconds = run(LEFT_OPEN, how, json.dumps(options), str(writes))
    print(f"\n{how}: exit {seconds:.2f} s after the program's end")
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"ResourceWarning: the local cache {cache} was never closed" in done.stderr
    # the exit committed the memory window's writes to the file, and released its lock
    with closing(sqlite3.connect(f"file:{cache}?mode=ro", uri=True)) as db:
        rows = dict(db.execute("SELECT key, synced_version FROM state WHERE owner = 'o'"))
    assert len(rows) == writes  # every write is in the file
    assert set(rows.values()) == {0}  # and none was flushed: the next open flushes them
    keys = ["local", *(f"m{i}" for i in range(1, writes))]
    values = await central_values({"central_url": central_url}, cache, keys)
    assert values == {"local": 0, **{f"m{i}": i for i in range(1, writes)}}
