"""Baselines measured beside the store in the same run: raw drivers, the flush, and peers.

* ``aiosqlite_executemany``: the local schema written with aiosqlite's executemany, 1,000 rows
  per transaction, at the store's own pragmas: the most a local cache can write;
* ``central_bulk``: the central driver's best bulk upsert of the same rows (PostgreSQL: asyncpg
  with ``unnest``; MySQL: aiomysql's executemany, which sends one multi-row ``INSERT … VALUES
  … ON DUPLICATE KEY UPDATE``, rewriting rows the table holds; SQLite: sqlite3's
  executemany), no fencing: the most a flush can write;
* ``flush``: `StateStore.flush()` of N dirty keys, to compare with ``central_bulk`` of N rows;
* peers (Airflow's own state store, ``Variable.set``): see `localstate._bench.airflow_peer`;
  measured when apache-airflow is installed and migrated on the same database, else reported
  as skipped with the reason.
"""

from __future__ import annotations

import asyncio
import sqlite3
import statistics
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import aiosqlite
from sqlalchemy.engine import make_url

from localstate._cache.cache_file import SCHEMA, UPSERT
from localstate._store import StateStore

__all__ = [
    "PEER_MODES",
    "aiosqlite_executemany",
    "central_bulk_upsert",
    "flush_rows_per_s",
]

PEER_MODES = ("airflow_metastore", "airflow_variable")


def _rows(n: int, tag: str) -> list[tuple[Any, ...]]:
    now = time.time()
    return [(f"bench:raw:{tag}:{i}", "watermark", str(i), 1, now, "bench", 0)
            for i in range(n)]


async def aiosqlite_executemany(folder: Path, rows: int, batch: int = 1000) -> float:
    """Rows/s of aiosqlite executemany into the local schema, `batch` rows per commit."""
    path = folder / "raw-aiosqlite.db"
    path.unlink(missing_ok=True)
    data = _rows(rows, "aiosqlite")
    async with aiosqlite.connect(path) as conn:
        await conn.execute("PRAGMA journal_mode=WAL")
        await conn.execute("PRAGMA synchronous=FULL")
        await conn.execute(SCHEMA)
        await conn.commit()
        started = time.perf_counter()
        for start in range(0, rows, batch):
            await conn.executemany(UPSERT, data[start:start + batch])
            await conn.commit()
        elapsed = time.perf_counter() - started
    return rows / elapsed


_PG_INSERT = (
    'INSERT INTO localstate_state AS t (owner, "key", value, version, prev_version, '
    "updated_at, updated_by) "
)
_PG_ON_CONFLICT = (
    ' ON CONFLICT (owner, "key") DO UPDATE SET value = EXCLUDED.value, '
    "version = EXCLUDED.version, prev_version = EXCLUDED.prev_version, "
    "updated_at = EXCLUDED.updated_at, updated_by = EXCLUDED.updated_by"
)
_PG_UNNEST = (
    _PG_INSERT + "SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[], "
    "$5::bigint[], $6::timestamptz[], $7::text[])" + _PG_ON_CONFLICT
)
_PG_VALUES = _PG_INSERT + "VALUES ($1, $2, $3, $4, $5, $6, $7)" + _PG_ON_CONFLICT
_SQLITE_UPSERT = (
    'INSERT INTO localstate_state (owner, "key", value, version, prev_version, '
    "updated_at, updated_by) VALUES (?, ?, ?, ?, ?, ?, ?) "
    'ON CONFLICT (owner, "key") DO UPDATE SET value = excluded.value, '
    "version = excluded.version, prev_version = excluded.prev_version, "
    "updated_at = excluded.updated_at, updated_by = excluded.updated_by"
)


async def central_bulk_upsert(url: str, rows: int, *, batch: int | None = None,
                              tag: str = "bulk", method: str = "unnest") -> float:
    """Rows/s of the central driver's bulk upsert into the central table (schema must exist),
    `batch` rows per transaction (default: all in one). PostgreSQL: `method` "unnest" (one
    statement of arrays) or "executemany" (asyncpg's pipelined executemany)."""
    batch = batch or rows
    parsed = make_url(url)
    now = datetime.now(timezone.utc)
    owners = [f"bench:raw:{tag}:{i}" for i in range(rows)]
    if parsed.get_backend_name() == "postgresql":
        import asyncpg  # the postgres extra

        conn = await asyncpg.connect(
            user=parsed.username, password=parsed.password, host=parsed.host,
            port=parsed.port, database=parsed.database,
        )
        try:
            started = time.perf_counter()
            for start in range(0, rows, batch):
                part = owners[start:start + batch]
                n = len(part)
                async with conn.transaction():
                    if method == "executemany":
                        await conn.executemany(
                            _PG_VALUES,
                            [(o, "watermark", str(i), 2, 1, now, "bench")
                             for i, o in enumerate(part)],
                        )
                    else:
                        await conn.execute(
                            _PG_UNNEST, part, ["watermark"] * n, [str(i) for i in range(n)],
                            [2] * n, [1] * n, [now] * n, ["bench"] * n,
                        )
            elapsed = time.perf_counter() - started
        finally:
            await conn.close()
        return rows / elapsed
    if parsed.get_backend_name() == "mysql":
        return await _mysql_bulk_upsert(url, owners, batch, method)
    path = parsed.database or ""
    stamp = now.strftime("%Y-%m-%d %H:%M:%S.%f")
    with sqlite3.connect(path, timeout=30) as conn:
        conn.execute("PRAGMA journal_mode=WAL")
        started = time.perf_counter()
        for start in range(0, rows, batch):
            part = owners[start:start + batch]
            conn.executemany(
                _SQLITE_UPSERT, [(o, "watermark", str(i), 2, 1, stamp, "bench")
                                 for i, o in enumerate(part)],
            )
            conn.commit()
        elapsed = time.perf_counter() - started
    conn.close()
    return rows / elapsed


_MY_INSERT = ("INSERT INTO localstate_state (owner, `key`, value, version, "
              "prev_version, updated_at, updated_by) ")
_MY_UPDATE = (" ON DUPLICATE KEY UPDATE value = VALUES(value), version = VALUES(version), "
              "prev_version = VALUES(prev_version), updated_at = VALUES(updated_at), "
              "updated_by = VALUES(updated_by)")
_MY_NAME = "VARCHAR(250) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"
_MY_JSON_TABLE = (
    _MY_INSERT + "SELECT * FROM JSON_TABLE(%s, '$[*]' COLUMNS ("
    f"o {_MY_NAME} PATH '$[0]', k {_MY_NAME} PATH '$[1]', v LONGTEXT PATH '$[2]', "
    "ver BIGINT PATH '$[3]', prev BIGINT PATH '$[4]', at DATETIME(6) PATH '$[5]', "
    f"b {_MY_NAME} PATH '$[6]')) AS j" + _MY_UPDATE
)


async def _mysql_bulk_upsert(url: str, owners: list[str], batch: int, method: str) -> float:
    """MySQL: "executemany" (aiomysql rewrites it into multi-row INSERT … VALUES statements)
    or "json_table" (one statement over a JSON array, the flush's form without its fence).

    The rows are inserted first, untimed, and the timed upsert rewrites them: what a flush
    does in a triggerer's steady state. On InnoDB that costs 2-3x inserting new rows (each
    row meets its duplicate key, then is updated), so a baseline of new rows would measure
    another operation than the flush's."""
    import aiomysql  # the mysql extra
    import orjson

    parsed = make_url(url)
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")
    conn = await aiomysql.connect(host=parsed.host, port=parsed.port or 3306,
                                  user=parsed.username, password=parsed.password or "",
                                  db=parsed.database, charset="utf8mb4", autocommit=False)
    try:
        async with conn.cursor() as cur:
            for timed in (False, True):
                started = time.perf_counter()
                for start in range(0, len(owners), batch):
                    rows = [(o, "watermark", str(i), 1 + timed, int(timed), stamp, "bench")
                            for i, o in enumerate(owners[start:start + batch])]
                    if method == "json_table":
                        await cur.execute(_MY_JSON_TABLE, (orjson.dumps(rows).decode(),))
                    else:
                        await cur.executemany(
                            _MY_INSERT + "VALUES (%s, %s, %s, %s, %s, %s, %s)" + _MY_UPDATE,
                            rows)
                    await conn.commit()
                elapsed = time.perf_counter() - started
    finally:
        conn.close()
    return len(owners) / elapsed


async def flush_rows_per_s(url: str, folder: Path, keys: int, *, tag: str = "flush",
                           max_batch: int = 10_000, rounds: int = 1,
                           **store_options: Any) -> tuple[float, float]:
    """(rows/s, seconds) of one `StateStore.flush()` of `keys` dirty keys to the central DB:
    the median of `rounds` flushes, each after every key was set again (a triggerer's steady
    state: each flush rewrites rows the central DB already holds). `store_options` go to the
    store (``sink="api", api_url=..., api_token=...``: the same flush through an API server).
    """
    cache = folder / f"flush-{tag}-{keys}.db"
    times: list[float] = []
    async with StateStore(cache_path=cache, central_url=url, triggerer_id=f"flush-{tag}",
                          flush_interval=3600.0, max_batch=max_batch,
                          **store_options) as store:
        # Keep the max_batch kick from flushing in the background while the keys are dirtied:
        # the flush measured is the one below, in batches of `max_batch` rows.
        store.entry_table.kick_at = keys + 1
        owners = [f"bench:flush:{tag}:{i}" for i in range(keys)]
        for start in range(0, keys, 5000):  # first writes read through: many per query
            await asyncio.gather(*(store.set(o, "watermark", 0, durability="memory")
                                   for o in owners[start:start + 5000]))
        await store.flush()
        for n in range(rounds):
            for i, owner in enumerate(owners):
                await store.set(owner, "watermark", n * keys + i + 1, durability="memory")
            # the local commit of those memory writes is the local writer's work, not the flush's
            await store.sync_local()
            started = time.perf_counter()
            report = await store.flush()
            times.append(time.perf_counter() - started)
            assert report.written == keys, report
    elapsed = statistics.median(times)
    return keys / elapsed, elapsed

