"""An API-server outage of 60 s, as a triggerer with ``sink = api`` lives it: a real store in a
subprocess, writing a watermark five times a second and reading a key it never saw every 10 s,
against a real `localstate serve` that is stopped for 60 s and started again on the same port.
Its log holds a WARNING when the flushes (and the reads) start failing, at most a summary a
minute, and an INFO when they recover; never a line per retry."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from api_server import RW_TOKEN, ServeProcess

from localstate._sync.central.central_store import CentralStore

OUTAGE_S = 60.0

WRITER = r"""
import asyncio, logging, sys, time
from localstate import StateStore

logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                    format="%(levelname)s %(name)s %(message)s")
logging.getLogger("httpx").setLevel(logging.WARNING)

async def main(url, token, cache):
    async with StateStore(sink="api", api_url=url, api_token=token, triggerer_id="outage-t",
                          cache_path=cache, flush_interval=1.0) as store:
        await store.claim("asset_watcher:outage")
        i = 0
        next_read = time.monotonic()
        while True:
            i += 1
            await store.set("asset_watcher:outage", "watermark", i)
            if time.monotonic() >= next_read:  # a trigger starting: a key not cached
                next_read += 10.0
                try:
                    await store.get("asset_watcher:outage", f"fresh-{i}")
                except Exception as exc:
                    print(f"read failed: {type(exc).__name__}", file=sys.stderr, flush=True)
            print(f"set {i}", flush=True)
            await asyncio.sleep(0.2)

asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3]))
"""


def start_writer(url: str, cache: Path, log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as err:  # the child keeps its own descriptor
        return subprocess.Popen([sys.executable, "-c", WRITER, url, RW_TOKEN, str(cache)],
                                stdout=subprocess.DEVNULL, stderr=err, env=dict(os.environ))


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
async def test_a_60_s_outage_of_the_api_server_logs_at_most_3_warnings(
        central_url: str, tmp_path: Path) -> None:
    server = ServeProcess(central_url)
    server.start()
    log = tmp_path / "writer.log"
    writer = start_writer(server.url, tmp_path / "t.db", log)
    central = await CentralStore.open(central_url)
    try:
        async def flushed() -> int:
            row = (await central.read_many([("asset_watcher:outage", "watermark")])).get(
                ("asset_watcher:outage", "watermark"))
            return 0 if row is None or row.data is None else int(row.data)

        async def wait_for(predicate_s: float, what: str) -> int:
            end = time.monotonic() + predicate_s
            while True:
                assert writer.poll() is None, log.read_text()[-3000:]
                value = await flushed()
                if value:
                    return value
                assert time.monotonic() < end, f"{what}\n{log.read_text()[-3000:]}"
                await asyncio.sleep(0.2)

        await wait_for(60.0, "the writer never flushed")
        # the log as it stood before the server stops: the writer's first failed flush may be
        # logged while `stop` waits for the server's process to end
        before = log.read_text()
        server.stop()
        outage_start = time.monotonic()
        await asyncio.sleep(OUTAGE_S)
        server.start()
        outage = time.monotonic() - outage_start
        during = await flushed()
        # the writer catches up: a watermark written after the restart reaches the central DB
        end = time.monotonic() + 30.0
        while "recovered after" not in log.read_text() or await flushed() <= during:
            assert time.monotonic() < end, log.read_text()[-3000:]
            await asyncio.sleep(0.2)
    finally:
        writer.terminate()
        writer.wait(timeout=30)
        await central.close()
        server.stop()
    text = log.read_text()
    outage_lines = text[len(before):].splitlines()
    warnings = [line for line in outage_lines if line.startswith("WARNING")]
    print(f"outage {outage:.1f} s: {len(warnings)} WARNING lines", *warnings, sep="\n")
    assert 1 <= len(warnings) <= 3, "\n".join(warnings)
    flush_started = r"WARNING localstate\.sync\.worker flush to localstate API http://\S+ failed"
    assert any(re.match(flush_started, w) for w in warnings)
    # the reads failed too (the callers got the errors), and said so once
    assert sum("read-through" in w for w in warnings) <= 1
    assert "read failed: CentralUnavailable" in text[len(before):]
    recovered = [line for line in outage_lines if "flush to" in line and "recovered" in line]
    assert len(recovered) == 1
    count, took = re.search(r"recovered after (\d+) failures in ([\d.]+) s", recovered[0]
                            ).groups()  # type: ignore[union-attr]
    assert int(count) >= 10  # about one try a second: all but a few went unlogged
    assert OUTAGE_S - 5 <= float(took) <= outage + 10
