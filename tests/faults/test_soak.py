"""Soak: 1,000 triggers writing for about a minute, through a 30 s central outage.

A writer process (soak_writer.py) runs 1,000 trigger tasks against PostgreSQL while this test
stops the server for at least 30 s in the middle. It samples its own RSS and its cache file's
size (db + wal) twice a second; after warm-up both must stay flat: through the outage the
dirty set is bounded by the number of keys and the WAL by its checkpoints, so nothing may grow
with the number of writes or the length of the outage. When the DB is back and the writer
stops, every write it acknowledged must be in the central DB exactly once.

``LOCALSTATE_SOAK_SECONDS`` (default 60) makes the soak longer; the outage lasts half of it
(at least 30 s).
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import asyncpg
from fault_tally import FaultTally

from localstate._testing.postgres_server import PostgresServer

WRITER = Path(__file__).parents[1] / "support" / "soak_writer.py"
TRIGGERS = 1000
WARMUP = 12.0  # seconds: the interpreter's arenas, the pools, the WAL reach their size
OUTAGE_STARTS = 15.0
MIB = 1024 * 1024
# Flat, in numbers. RSS: after warm-up at most 5 % + 8 MiB over the warm-up level (measured:
# +2 MiB over the minute; malloc arenas and the GC's generations move by a few MiB, while a leak
# of even 100 bytes per write would add over 50 MiB in a minute at ~12,000 writes/s). Cache
# file: the WAL cycles between checkpoints (auto-checkpoint at 1,000 pages, truncated to
# journal_size_limit, 8 MiB), so its size may move by up to that limit (measured: flat at
# 4.3 MiB); anything that grew with the writes or the outage would pass it within the minute.
RSS_FACTOR, RSS_SLACK = 1.05, 8 * MIB
FILE_SLACK = 8 * MIB


def soak_seconds() -> float:
    return max(60.0, float(os.environ.get("LOCALSTATE_SOAK_SECONDS", "60")))


@dataclass(frozen=True)
class Sample:
    at: float
    rss: int
    cache_bytes: int
    dirty: int
    sets: int
    central_errors: int


async def test_a_minute_of_1000_triggers_through_a_30s_outage_stays_flat(
    pg_server: PostgresServer, tmp_path: Path, fault_tally: FaultTally,
) -> None:
    total = soak_seconds()
    outage = max(30.0, total / 2)
    dbname = f"soak_{uuid.uuid4().hex[:12]}"
    url = pg_server.create_database(dbname)
    options = {"central_url": url, "cache_path": str(tmp_path / "soak.db"),
               "triggers": TRIGGERS, "pace": 0.05, "flush_interval": 1.0,
               "sample_every": 0.5}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(WRITER), json.dumps(options), stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    assert proc.stdin is not None
    assert proc.stdout is not None
    assert proc.stderr is not None
    stdout = proc.stdout
    samples: list[Sample] = []
    counts: dict[tuple[str, str], tuple[int, object]] = {}
    stderr = asyncio.create_task(proc.stderr.read())  # the worker's retry warnings
    first_sample = asyncio.Event()

    async def read() -> None:
        while line := await stdout.readline():
            kind, *f = line.decode().rstrip("\n").split("\t")
            if kind == "SAMPLE":
                at, rss, db, wal, dirty, sets, errors = f
                samples.append(Sample(float(at), int(rss), int(db) + int(wal), int(dirty),
                                      int(sets), int(errors)))
                first_sample.set()
            elif kind == "COUNT":
                counts[f[0], f[1]] = (int(f[2]), json.loads(f[3]))

    reader = asyncio.create_task(read())
    outage_window: tuple[float, float] = (0.0, 0.0)
    try:
        await asyncio.wait_for(first_sample.wait(), 60)
        t0 = time.monotonic() - samples[0].at
        await asyncio.sleep(t0 + OUTAGE_STARTS - time.monotonic())
        await asyncio.to_thread(pg_server.stop, "fast")
        try:
            down_at = time.monotonic() - t0
            await asyncio.sleep(t0 + OUTAGE_STARTS + outage - time.monotonic())
        finally:
            await asyncio.to_thread(pg_server.start)
        outage_window = (down_at, time.monotonic() - t0)
        await asyncio.sleep(max(0.0, t0 + total - time.monotonic()))
        proc.stdin.write(b"stop\n")
        await proc.stdin.drain()
        await asyncio.wait_for(reader, 120)
        assert await asyncio.wait_for(proc.wait(), 60) == 0, (await stderr).decode()[-3000:]
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    await stderr

    # -- flat after warm-up ------------------------------------------------------------------
    warm = [s for s in samples if WARMUP / 2 <= s.at <= WARMUP]
    after = [s for s in samples if s.at > WARMUP]
    assert warm, "no samples in the warm-up window"
    assert after[-1].at >= total - 2, "the writer stopped sampling early"
    rss_level = max(s.rss for s in warm)
    file_level = max(s.cache_bytes for s in warm)
    rss_max = max(s.rss for s in after)
    file_max = max(s.cache_bytes for s in after)
    during = [s for s in after if outage_window[0] + 2 <= s.at <= outage_window[1]]
    summary = (
        f"RSS warm-up {rss_level / MIB:.1f} MiB, after {rss_max / MIB:.1f} MiB max "
        f"(median {statistics.median(s.rss for s in after) / MIB:.1f}); cache file warm-up "
        f"{file_level / MIB:.1f} MiB, after {file_max / MIB:.1f} MiB max; outage "
        f"{outage_window[0]:.1f}-{outage_window[1]:.1f} s, {len(during)} samples"
    )
    # the outage was real and writes went on through it
    assert during, summary
    assert during[-1].central_errors > during[0].central_errors, summary
    assert during[-1].sets > during[0].sets, summary
    assert max(s.dirty for s in during) <= 2 * TRIGGERS, summary  # one entry per key, at most
    assert rss_max <= rss_level * RSS_FACTOR + RSS_SLACK, summary
    assert file_max <= file_level + FILE_SLACK, summary

    # -- everything acknowledged landed, exactly once -----------------------------------------
    conn = await asyncpg.connect(pg_server.dsn_for(dbname))
    try:
        rows = await conn.fetch("SELECT owner, key, value, version FROM "
                                "localstate_state")
    finally:
        await conn.close()
    central = {(r["owner"], r["key"]): (r["version"], json.loads(r["value"])) for r in rows}
    acknowledged = sum(n for n, _ in counts.values())
    assert len(counts) >= TRIGGERS, f"only {len(counts)} keys were written"
    wrong = {k: (central.get(k), v) for k, v in counts.items() if central.get(k) != v}
    fault_tally.add("outages survived")
    fault_tally.add("acknowledged writes checked", acknowledged)
    fault_tally.lost("local, through the soak's outage", sum(
        max(0, n - (central.get(k) or (0, None))[0]) for k, (n, _v) in counts.items()))
    assert not wrong, f"{len(wrong)} keys differ (central, acknowledged): {list(wrong.items())[:5]}"
    print(f"\nsoak: {TRIGGERS} triggers, {total:.0f} s, {acknowledged} acknowledged writes, "
          f"lost=0; {summary}")
