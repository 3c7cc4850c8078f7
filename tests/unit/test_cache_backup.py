"""The backup page's procedure on a live cache file: SQLite's online backup of a cache a
running store holds open in WAL mode, its check, and its restore (the backlog flushed by the
store that opens the copy). The commands are taken from docs/operations/backup.md."""

from __future__ import annotations

import re
import shlex
import sqlite3
import subprocess
from pathlib import Path

from localstate import StateStore

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "operations" / "backup.md"


def _documented(start: str) -> list[str]:
    """The page's command line that starts with `start`, split as the shell splits it."""
    (line,) = [line for line in PAGE.read_text().splitlines() if line.startswith(start)]
    return shlex.split(line)


def _run(argv: list[str], cache: Path, backup: Path) -> str:
    """`argv` with the page's example paths replaced by the test's."""
    swap = {"/opt/airflow/localstate/triggerer-0.db": str(cache),
            "/backups/triggerer-0.db": str(backup)}
    real = [re.sub("|".join(map(re.escape, swap)), lambda m: swap[m.group(0)], a) for a in argv]
    done = subprocess.run(real, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


async def test_an_online_backup_of_a_live_cache_holds_its_backlog(tmp_path: Path) -> None:
    cache, backup = tmp_path / "triggerer-0.db", tmp_path / "backup" / "triggerer-0.db"
    backup.parent.mkdir()
    central = f"sqlite:///{tmp_path / 'central.db'}"
    # a long flush interval: the writes stay in the cache (and its WAL) while it is backed up
    async with StateStore(central_url=central, cache_path=cache, flush_interval=3600) as s:
        for i in range(50):
            await s.set("asset_watcher:orders", "watermark", i)
            await s.set(f"trigger:t:{i}", "cursor", {"at": i})
        wal = cache.with_name(cache.name + "-wal")
        assert wal.stat().st_size > 0  # recent commits are in the WAL file, not the .db
        _run(_documented("sqlite3 /opt/airflow/localstate/triggerer-0.db \".backup"),
             cache, backup)
        check = _run(_documented('sqlite3 /backups/triggerer-0.db "PRAGMA'), cache, backup)
        assert check.strip() == "ok"
        assert not backup.with_name(backup.name + "-wal").exists()
        with sqlite3.connect(backup) as db:
            rows = db.execute("SELECT count(*) FROM state").fetchone()[0]
        assert rows == 51

    # the restore: a store that opens the copy flushes its backlog to a central store
    restored = f"sqlite:///{tmp_path / 'restored-central.db'}"
    async with StateStore(central_url=restored, cache_path=backup) as s:
        await s.flush()
    async with StateStore(central_url=restored, cache_path=tmp_path / "reader.db") as s:
        watermark = await s.read_committed("asset_watcher:orders", "watermark")
        cursor = await s.read_committed("trigger:t:7", "cursor")
    assert watermark is not None
    assert cursor is not None
    assert (watermark.value, cursor.value) == (49, {"at": 7})
