"""Where a test's subprocesses are: their Python stacks (through `stack_dump_hook`) and the
database sessions they hold or wait on.

`stack_dump_env` gives the environment that arms the hook in every Python process started
with it; `dump_stacks` asks a process and its children for their stacks and returns them;
`session_locks` lists the server's sessions with what blocks each, by client process.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

import asyncpg
import psutil

__all__ = ["HOOK_DIR", "dump_stacks", "session_locks", "stack_dump_env"]

HOOK_DIR = Path(__file__).parent / "stack_dump_hook"


def stack_dump_env(folder: Path, pythonpath: str) -> dict[str, str]:
    """The variables that arm the hook: its folder first on `pythonpath`, dumps into `folder`."""
    return {"PYTHONPATH": f"{HOOK_DIR}{os.pathsep}{pythonpath}",
            "LOCALSTATE_STACK_DUMPS": str(folder)}


def dump_stacks(pid: int, folder: Path, wait: float = 2.0) -> str:
    """The stacks of process `pid` and its children, each headed by its command line."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error as exc:
        return f"(no process {pid}: {exc})"
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.send_signal(signal.SIGUSR2)
    time.sleep(wait)  # faulthandler writes from the signal handler: give it the time
    parts = []
    for proc in procs:
        dump = folder / f"{proc.pid}.txt"
        text = dump.read_text(errors="replace") if dump.exists() else "(no dump)"
        with contextlib.suppress(psutil.Error):
            parts.append(f"--- pid {proc.pid}: {' '.join(proc.cmdline())[:160]}\n{text}")
    return "\n".join(parts)


async def session_locks(db: asyncpg.Connection) -> list[str]:
    """Each other session of the database: its state, its wait, the sessions blocking it and
    the local process at its client's end."""
    rows = await db.fetch(
        "SELECT pid, state, wait_event_type, wait_event, client_port, "
        "pg_blocking_pids(pid) AS blocked_by, now() - xact_start AS in_xact, "
        "left(query, 100) AS query FROM pg_stat_activity "
        "WHERE datname = current_database() AND pid <> pg_backend_pid()")
    by_port = {}
    for conn in psutil.net_connections(kind="tcp"):
        if conn.laddr and conn.pid:
            by_port[conn.laddr.port] = conn.pid
    lines = []
    for r in rows:
        client = by_port.get(r["client_port"])
        who = "?"
        if client is not None:
            with contextlib.suppress(psutil.Error):
                who = f"{client} {' '.join(psutil.Process(client).cmdline())[:80]}"
        lines.append(f"session {r['pid']} ({who}): {r['state']}, in transaction for "
                     f"{r['in_xact']}, waits {r['wait_event_type']}/{r['wait_event']}, "
                     f"blocked by {list(r['blocked_by'])}: {r['query']}")
    return lines
