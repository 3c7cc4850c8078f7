"""Emitted events under SIGKILL: a real writer process (`emit_writer.py`) emitting one event
per item with its watermark (`StateStore.emit`, ``local`` durability), killed at random moments
(mid group commit, mid flush, between a flush's commit and its mark-clean), restarted from its
watermark each time, on every central backend.

After the last run every acknowledged event is in the central DB exactly once: the event
table holds each item's key once, with no gap from the first item to the last (an item
re-emitted after a restart, or a batch replayed after a lost answer, added nothing), and the
central watermark is the last item. ``LOCALSTATE_CRASH_SEED=<seed>`` replays a run.
"""

from __future__ import annotations

import asyncio
import random
import signal
import sys
from pathlib import Path

from crash_harness import crash_seed
from emit_writer import OWNER
from sqlalchemy import select

from localstate._sync.central.central_store import CentralStore
from localstate._sync.central.schema import event

WRITER = Path(__file__).parents[1] / "support" / "emit_writer.py"
ROUNDS = 8


async def run_writer(central_url: str, cache: Path, flush_interval: float, last: int,
                     kill_after: float | None) -> tuple[int, list[int], bool]:
    """One run of the writer: (the watermark it started from, the items it acknowledged,
    whether it finished)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(WRITER), central_url, str(cache), str(flush_interval), str(last),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    assert proc.stdout is not None
    ready = await asyncio.wait_for(proc.stdout.readline(), 60)
    assert ready.startswith(b"READY "), (ready, await proc.stderr.read())  # type: ignore[union-attr]
    start = int(ready.split()[1])
    if kill_after is not None:
        await asyncio.sleep(kill_after)
        proc.send_signal(signal.SIGKILL)
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    lines = out.decode().split()
    acked = [int(v) for k, v in zip(lines[::2], lines[1::2], strict=False) if k == "ACK"]
    done = out.endswith(b"DONE\n")
    if kill_after is None:
        assert proc.returncode == 0, err.decode()[-2000:]
        assert done, err.decode()[-2000:]
    return start, acked, done


async def test_every_acknowledged_event_is_committed_exactly_once_across_kills(
    central_url: str, tmp_path: Path,
) -> None:
    seed = crash_seed()
    rng = random.Random(seed)
    cache = tmp_path / "emit.db"
    acked: list[int] = []
    kills = 0
    for _ in range(ROUNDS):
        flush_interval = rng.choice([0.02, 0.1, 0.5])
        start, got, done = await run_writer(central_url, cache, flush_interval, 100_000,
                                            rng.uniform(0.2, 1.0))
        # a restart resumes at or after the last acknowledged item (local durability), and
        # never before the first
        if acked:
            assert start >= acked[-1], f"seed {seed}: the watermark went back"
        acked += got
        kills += not done
    assert kills >= ROUNDS - 1, f"seed {seed}: the writer finished before most kills"
    assert acked, f"seed {seed}: nothing was acknowledged"
    last = max(acked) + 20
    _start, got, _done = await run_writer(central_url, cache, 0.05, last, None)
    async with CentralStore.open(central_url) as central:
        e = event.c
        keys = [k for (k,) in await central.run_read(
            select(e.key).where(e.owner == OWNER), "read events")]
        record = await central.read_many([(OWNER, "watermark")])
    items = sorted(int(k) for k in keys)
    assert len(items) == len(set(items)), f"seed {seed}: an item committed twice"
    assert items == list(range(1, last + 1)), (
        f"seed {seed}: missing {sorted(set(range(1, last + 1)) - set(items))[:10]}")
    assert set(acked) <= set(items)
    assert record[(OWNER, "watermark")].data == str(last)
