"""The cache files on this host: where they are, who holds each, and what each holds, read
without taking their lock (their triggerers may be running)."""

from __future__ import annotations

import os
import socket
import sqlite3
from pathlib import Path
from typing import Any

import orjson

from localstate._core.config import Settings

__all__ = ["cache_files", "cache_folder", "cache_summary"]


def cache_folder(settings: Settings) -> Path:
    return settings.resolved_cache_dir


def cache_files(settings: Settings) -> list[Path]:
    found = set(cache_folder(settings).glob("*.db"))
    if settings.resolved_cache_path.is_file():
        found.add(settings.resolved_cache_path)
    return sorted(found)


def _holder(path: Path) -> dict[str, Any]:
    lock = path.with_name(path.name + ".lock")
    try:
        info = orjson.loads(lock.read_bytes() or b"null")
    except (OSError, orjson.JSONDecodeError):
        info = None
    if not isinstance(info, dict) or not isinstance(info.get("pid"), int):
        return {"held_by": None, "running": False}
    pid, host = info["pid"], info.get("host")
    running: bool | None = None  # unknown: another host
    if host == socket.gethostname():
        try:
            os.kill(pid, 0)
            running = True
        except ProcessLookupError:
            running = False
        except PermissionError:
            running = True
    return {"held_by": f"pid {pid} on {host}", "running": running}


def cache_summary(path: Path) -> dict[str, Any]:
    """Who holds the cache file at `path`, its rows, how many are not flushed yet and the oldest
    of those; or, for a file that is not a readable cache, an ``error`` saying why."""
    from localstate._cache.cache_file import APPLICATION_ID

    out: dict[str, Any] = {"path": str(path), **_holder(path)}
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)
        try:
            if conn.execute("PRAGMA application_id").fetchone()[0] != APPLICATION_ID:
                return {**out, "error": "not a localstate cache file"}
            rows, dirty, oldest = conn.execute(
                "SELECT count(*), coalesce(sum(version != synced_version), 0), "
                "min(CASE WHEN version != synced_version THEN updated_at END) FROM state"
            ).fetchone()
            events = _pending_events(conn)
        finally:
            conn.close()
    except sqlite3.Error as exc:
        return {**out, "error": f"cannot read it: {exc}"}
    return {**out, "rows": rows, "dirty": dirty, "oldest_unflushed_at": oldest,
            "pending_events": sum(n for n, _at in events.values()),
            "oldest_pending_event_at": min((at for _n, at in events.values()), default=None),
            "pending_events_by_owner": {o: {"pending": n, "oldest_pending_at": at}
                                        for o, (n, at) in events.items()}}


def _pending_events(conn: sqlite3.Connection) -> dict[str, tuple[int, float]]:
    """Each owner's events in the file's outbox (emitted, not yet in the central DB) and the
    time of its oldest; none in a file made before the outbox."""
    try:
        found = conn.execute(
            "SELECT owner, count(*), min(created_at) FROM outbox GROUP BY owner").fetchall()
    except sqlite3.OperationalError:  # no outbox table: an older file
        return {}
    return {o: (int(n), float(at)) for o, n, at in found}
