"""What tests/airflow/test_airflow_api_e2e.py reads of a running deployment: the central table's
commit log, cache files, Airflow's asset_state_store, and the PostgreSQL connections of a
process (with psutil and pg_stat_activity)."""

from __future__ import annotations

import contextlib
import json
import sqlite3
import subprocess
from pathlib import Path
from typing import Any

import asyncpg
import psutil

#: every write to localstate's table, logged when its transaction commits
HISTORY_SQL = """
CREATE TABLE e2e_history (seq bigserial PRIMARY KEY, owner text, key text, value text,
                          updated_by text, txid bigint, committed timestamptz);
CREATE FUNCTION e2e_log() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO e2e_history (owner, key, value, updated_by, txid, committed)
  VALUES (NEW.owner, NEW.key, NEW.value::text, NEW.updated_by, txid_current(),
          clock_timestamp());
  RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER e2e_log AFTER INSERT OR UPDATE ON localstate_state
DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION e2e_log();
"""


def cached(cache: Path, key: str = "watermark") -> dict[str, float]:
    """Each owner's value of `key` in a stopped triggerer's cache file (acknowledged writes;
    opened read-write, so whatever its WAL holds is read too)."""
    with contextlib.closing(sqlite3.connect(cache)) as db:
        rows = db.execute("SELECT owner, value FROM state WHERE key = ?", (key,)).fetchall()
    return {owner: float(json.loads(value)) for owner, value in rows}


def version_sum(cache: Path) -> int:
    """The watermarks' versions summed over a running triggerer's cache file: each set of a
    watermark adds one, so a difference counts the sets in between."""
    with contextlib.closing(sqlite3.connect(f"file:{cache}?mode=ro", uri=True)) as db:
        return int(db.execute("SELECT coalesce(sum(version), 0) FROM state "
                              "WHERE key = 'watermark'").fetchone()[0])


async def central_values(db: asyncpg.Connection, key: str = "watermark") -> dict[str, float]:
    rows = await db.fetch("SELECT owner, value FROM localstate_state WHERE key = $1",
                          key)
    return {r["owner"]: float(json.loads(r["value"])) for r in rows}


async def mirrored(db: asyncpg.Connection) -> dict[str, float]:
    """Airflow's asset_state_store watermark of each asset, by localstate owner."""
    rows = await db.fetch(
        "SELECT a.name, s.value FROM asset_state_store s JOIN asset a ON a.id = s.asset_id "
        "WHERE s.key = 'watermark'")
    return {f"asset_watcher:{r['name']}": float(json.loads(r["value"])) for r in rows}


async def resumed(db: asyncpg.Connection, by: str) -> dict[str, float]:
    """The ``resumed_from`` each trigger recorded when it started on triggerer `by`."""
    rows = await db.fetch("SELECT owner, value FROM e2e_history WHERE key = 'resumed_from' "
                          "AND updated_by = $1", by)
    return {r["owner"]: float(json.loads(r["value"])) for r in rows}


async def opened_by(db: asyncpg.Connection, pid: int, port: int) -> list[str]:
    """Connections to PostgreSQL that process `pid` opened, with their backends.

    The runner is forked from the triggerer's supervisor, which holds Airflow's pooled
    connections: their sockets are inherited (open in the child's fd table too, used by the
    parent). Their backends began before the runner existed. A socket in `pid`'s table whose
    backend began later was opened by `pid` itself (what the parent opens after the fork is
    not in the child's table). A socket the parent holds too is inherited whenever its backend
    began: the parent may open a pooled connection just before it forks, and PostgreSQL stamps
    ``backend_start`` when its backend starts, a few ms after the client's connect, while
    psutil's ``create_time`` is rounded down to a clock tick (seen once in CI: one idle
    connection of the supervisor's, held through the whole window).
    """
    try:
        proc = psutil.Process(pid)
        born = proc.create_time()
        conns = [c for c in proc.net_connections(kind="tcp") if c.raddr and c.raddr.port == port]
        parent = proc.parent()
        held_by_parent = {c.laddr for c in parent.net_connections(kind="tcp")} if parent else set()
    except psutil.NoSuchProcess:
        return []
    found = []
    for c in conns:
        if c.laddr in held_by_parent:
            continue
        backend = await db.fetchrow(
            "SELECT extract(epoch FROM backend_start) AS began, application_name, state "
            "FROM pg_stat_activity WHERE client_port = $1", c.laddr.port)
        if backend is None or float(backend["began"]) >= born:
            found.append(f"{c.laddr} -> {c.raddr}: {dict(backend or {})}")
    return found


def probes_of(folder: Path) -> list[dict[str, Any]]:
    """What each trigger runner reported about itself (`e2e_tick_trigger._probe`)."""
    return [json.loads(p.read_text()) for p in sorted(folder.glob("runner-*.json"))]


def group_pids(leader: subprocess.Popen[bytes]) -> list[int]:
    proc = psutil.Process(leader.pid)
    return [proc.pid, *(p.pid for p in proc.children(recursive=True))]
