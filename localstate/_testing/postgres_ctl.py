"""`PgCtl`: the programs that run one throwaway PostgreSQL cluster (initdb, pg_ctl start and
stop), each run as the server's system user when the tests run as root, and whether its
postmaster is alive. `PostgresServer` owns one per cluster, made once its folders exist.

Every program runs with the environment minus libpq's variables (`clean_env`), so nothing in
the caller's environment can point it at another server.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import shlex
import shutil
import subprocess
from collections.abc import Sequence

from localstate._testing.db_server import HOST, LOG_TAIL_LINES, START_TIMEOUT_S, tail
from localstate._testing.postgres_binaries import PostgresBinaries

__all__ = ["STOP_MODES", "PgCtl", "clean_env", "postmaster_running"]

STOP_MODES = frozenset({"smart", "fast", "immediate"})


def clean_env() -> dict[str, str]:
    """The environment minus libpq/server variables that could redirect the tools."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("PG")}
    env["PGCONNECT_TIMEOUT"] = "10"
    return env


def postmaster_running(data_dir: pathlib.Path) -> bool:
    """Whether the postmaster recorded in `data_dir`'s ``postmaster.pid`` is alive."""
    try:
        pid = int((data_dir / "postmaster.pid").read_text().split("\n", 1)[0])
    except (OSError, ValueError):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a dead postmaster may linger as a zombie if nobody reaps it
        stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


class PgCtl:
    """The tools of the cluster in ``runtime_dir/data``, run from `runtime_dir` as `run_as`
    (a system user; None: this process's user)."""

    def __init__(self, binaries: PostgresBinaries, runtime_dir: pathlib.Path, *,
                 run_as: str | None) -> None:
        self.binaries = binaries
        self.runtime_dir = runtime_dir
        self.data_dir = runtime_dir / "data"
        self.run_as = run_as

    def running(self) -> bool:
        return postmaster_running(self.data_dir)

    def run(self, args: Sequence[str]) -> subprocess.CompletedProcess[str]:
        command = list(args)
        if self.run_as is not None:
            runuser = shutil.which("runuser") or "/usr/sbin/runuser"
            command = [runuser, "-u", self.run_as, "--", *command]
        return subprocess.run(
            command, capture_output=True, text=True, env=clean_env(),
            cwd=self.runtime_dir,  # as root, the caller's cwd may be unreadable
            stdin=subprocess.DEVNULL, timeout=START_TIMEOUT_S + 30, check=False,
        )

    def initdb(self, user: str) -> None:
        """Create the cluster: `user` its superuser, trusted, UTF-8, byte-wise text order."""
        result = self.run([str(self.binaries.initdb), "-D", str(self.data_dir), "--auth=trust",
                           "-U", user, "--encoding=UTF8", "--no-locale", "--no-sync"])
        if result.returncode != 0:
            raise RuntimeError(failure("initdb failed", result))

    def start(self, port: int, *, log: pathlib.Path, shown_log: pathlib.Path,
              stat_statements: bool) -> None:
        """Start the postmaster on `port`, logging to `log` (`shown_log`: the path the error
        names). A start that fails leaves no postmaster behind, and raises with this start's
        part of the log."""
        log_offset = log.stat().st_size if log.exists() else 0
        options = shlex.join(_server_options(port, self.runtime_dir, stat_statements))
        pg_ctl = str(self.binaries.pg_ctl)
        result = self.run([pg_ctl, "start", "-D", str(self.data_dir), "-l", str(log),
                           "-w", "-t", str(START_TIMEOUT_S), "-o", options])
        if result.returncode == 0 and self.running():
            return
        text = ""
        with contextlib.suppress(OSError), log.open("rb") as fh:
            fh.seek(log_offset)
            text = fh.read().decode(errors="replace")
        text = "\n".join(text.splitlines()[-LOG_TAIL_LINES:])
        if self.running():  # a half-started postmaster must not outlive the failure
            self.run([pg_ctl, "stop", "-D", str(self.data_dir), "-m", "immediate", "-w"])
        raise RuntimeError(
            failure(f"pg_ctl start on port {port} failed", result)
            + f"\n--- {log} (this start; full log: {shown_log}) ---\n{text}"
        )

    def stop(self, mode: str, *, wait: bool, log: pathlib.Path) -> None:
        """``pg_ctl stop -m mode``; `wait=False` returns once the shutdown has begun."""
        if mode not in STOP_MODES:
            raise ValueError(f"stop mode must be one of {sorted(STOP_MODES)}, not {mode!r}")
        result = self.run([str(self.binaries.pg_ctl), "stop", "-D", str(self.data_dir),
                           "-m", mode,
                           *(("-w", "-t", str(START_TIMEOUT_S)) if wait else ("-W",))])
        if result.returncode != 0 and (not wait or self.running()):
            raise RuntimeError(failure("pg_ctl stop failed", result, log=log))


def _server_options(port: int, socket_dir: pathlib.Path, stat_statements: bool) -> list[str]:
    settings = {
        "port": str(port),
        "listen_addresses": HOST,
        "unix_socket_directories": str(socket_dir),
        # Throwaway data: nothing is forced to disk, which survives everything but an
        # OS crash. synchronous_commit stays on, so a commit has reached the OS when it
        # returns: the outage tests stop the server with `immediate` (a crash of
        # PostgreSQL), and with it off the last ~200 ms of acknowledged commits were lost.
        "fsync": "off",
        "full_page_writes": "off",
        "max_connections": "200",
    }
    if stat_statements:
        settings["shared_preload_libraries"] = "pg_stat_statements"
    options: list[str] = []
    for key, value in settings.items():
        options += ["-c", f"{key}={value}"]
    return options


def failure(what: str, result: subprocess.CompletedProcess[str], *,
            log: pathlib.Path | None = None) -> str:
    """The error text of a program that failed: its command, output and `log`'s tail."""
    parts = [
        f"{what} (exit {result.returncode}): {' '.join(map(str, result.args))}",
        f"--- stdout ---\n{result.stdout.strip()}",
        f"--- stderr ---\n{result.stderr.strip()}",
    ]
    if log is not None:
        parts.append(f"--- {log} (last {LOG_TAIL_LINES} lines) ---\n{tail(log)}")
    return "\n".join(parts)
