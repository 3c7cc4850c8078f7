"""A real, throwaway MySQL-family server (MariaDB) for the test suite.

Uses the distribution's MariaDB server (Debian: ``apt-get install mariadb-server``; Debian
ships no MySQL 8 server). There is deliberately no mock and no skip: if the binaries are
missing, the suite fails with a message that says how to install them.

Typical use::

    with MysqlServer(tmp_path) as my:
        url = my.create_database("central")      # mysql+aiomysql://localstate@127.0.0.1:port/central

``mariadb-install-db`` creates the data directory, ``mariadbd`` serves it on a free
127.0.0.1 port. As root the server runs as the ``mysql`` system user (``mariadbd --user``), so
the data directory, the unix socket and the log live in a fresh ``/tmp/localstate-my-*``
directory owned by ``mysql``. Administrative statements (creating databases, ``KILL``) go
through the unix socket as the server's ``root`` account with PyMySQL (a dependency of aiomysql).

The server runs with MySQL 8's default ``sql_mode`` (stricter than MariaDB's), utf8mb4 as the
server character set, and ``innodb_flush_log_at_trx_commit=2``: a commit reaches the OS when it
returns, so a crash of the server (``stop("immediate")``, SIGKILL) loses no acknowledged commit;
only an OS crash would.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from typing import Any

from localstate._testing.db_server import (
    HOST,
    LOG_TAIL_LINES,
    START_TIMEOUT_S,
    DbServer,
    check_identifier,
    free_port,
)

__all__ = ["MysqlServer", "find_mysql_binaries"]

_log = logging.getLogger("localstate.testing.mysql_server")

INSTALL_HINT = (
    "MariaDB server binaries (mariadbd, mariadb-install-db) were not found on PATH nor in "
    "/usr/sbin. The test suite needs a real MySQL-family server: install it with "
    "`apt-get install mariadb-server` (Debian/Ubuntu), or put a directory containing "
    "mariadbd and mariadb-install-db on PATH."
)

#: fast: SIGTERM, a normal shutdown (open connections are closed with "server shutdown");
#: immediate: SIGKILL, a crash (InnoDB recovers at the next start)
_STOP_SIGNALS = {"fast": signal.SIGTERM, "immediate": signal.SIGKILL}
_SYSTEM_USER = "mysql"
_MAX_IDENTIFIER = 64
#: MySQL 8.0's default sql_mode: SQL MariaDB accepts but MySQL 8 refuses fails here too
_MYSQL8_SQL_MODE = ("ONLY_FULL_GROUP_BY,STRICT_TRANS_TABLES,NO_ZERO_IN_DATE,NO_ZERO_DATE,"
                    "ERROR_FOR_DIVISION_BY_ZERO,NO_ENGINE_SUBSTITUTION")


def _which(name: str) -> str | None:
    return shutil.which(name) or next(
        (str(p) for d in ("/usr/sbin", "/usr/bin") if os.access(p := pathlib.Path(d, name),
                                                                 os.X_OK)), None)


def find_mysql_binaries() -> tuple[str, str]:
    """(mariadbd, mariadb-install-db): the server and the data directory initializer."""
    server = _which("mariadbd")
    install_db = _which("mariadb-install-db")
    if server is None or install_db is None:
        raise RuntimeError(INSTALL_HINT)
    return server, install_db


class MysqlServer(DbServer):
    """A MariaDB server on a free 127.0.0.1 port, its data in a temporary directory.

    ``start()`` initializes the data directory on first use; ``stop()``/``restart()`` keep the
    data and the port, so tests can simulate an outage. ``close()`` (or leaving the ``with``
    block) stops the server and removes its directory; also done at interpreter exit.
    """

    def __init__(self, base_dir: pathlib.Path, *, user: str = "localstate",
                 dbname: str = "localstate") -> None:
        super().__init__(base_dir, user=user, dbname=dbname, max_identifier=_MAX_IDENTIFIER)
        self._server_bin, self._install_db = find_mysql_binaries()
        self._process: subprocess.Popen[bytes] | None = None
        self.version = ""  # SELECT VERSION() once started, e.g. "10.11.19-MariaDB-0+deb12u1"
        self.run_as(_SYSTEM_USER,
                     f"running as root, and there is no {_SYSTEM_USER!r} system user to run "
                     "MariaDB as: `apt-get install mariadb-server` creates it")

    # ----------------------------------------------------------------- properties

    @property
    def socket_path(self) -> pathlib.Path:
        return self.runtime_dir / "mysqld.sock"

    @property
    def log_path(self) -> pathlib.Path:
        return self.runtime_dir / "mariadb.log"

    def url_for(self, dbname: str) -> str:
        """SQLAlchemy URL of ``dbname``: ``mysql+aiomysql://...``."""
        return f"mysql+aiomysql://{self.user}@{HOST}:{self.port}/{dbname}"

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Start the server (creating the data directory on first call); a no-op if running."""
        if self._closed:
            raise RuntimeError("MysqlServer was closed; create a new one")
        if self.is_running():
            return
        first = not self._initialized
        if first:
            self._prepare_dirs()
            self._install()
            self._initialized = True
            self._port = free_port()
        self._spawn()
        if first:
            self.execute(f"CREATE USER '{self.user}'@'%'")
            self.execute(f"GRANT ALL PRIVILEGES ON *.* TO '{self.user}'@'%' WITH GRANT OPTION")
            self.create_database(self.dbname)
            self.version = str(self.query("SELECT VERSION()")[0][0])

    def stop(self, mode: str = "fast") -> None:
        """Stop the server: ``fast`` (SIGTERM, a clean shutdown) or ``immediate`` (SIGKILL, a
        crash). Waits until the process is gone. Safe to call repeatedly."""
        if mode not in _STOP_SIGNALS:
            raise ValueError(f"stop mode must be one of {sorted(_STOP_SIGNALS)}, not {mode!r}")
        process = self._process
        if process is None or process.poll() is not None:
            self._process = None
            return
        process.send_signal(_STOP_SIGNALS[mode])
        try:
            process.wait(timeout=START_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        self._process = None

    def is_running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def ensure_running(self) -> bool:
        """Start the server again if it died by itself (MariaDB 10.11 has crashed here with
        SIGSEGV inside an information_schema query, a server bug); True if it had to.
        A server this object stopped on purpose is started again too: call it only where
        the server should be up."""
        if self._closed or not self._initialized or self.is_running():
            return False
        log = self.log_path.read_text(errors="replace")[-2000:] if self.log_path.exists() else ""
        _log.warning("MariaDB at port %s had died; starting it again. Its log ends:\n%s",
                     self._port, log)
        self.start()
        return True

    def close(self) -> None:
        """Stop the server (immediately) and remove its directory. Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            self.stop("immediate")
        finally:
            if self._runtime_dir is not None:
                with contextlib.suppress(OSError):
                    self.base_dir.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(self.log_path, self.base_dir / "mariadb.log")
                shutil.rmtree(self._runtime_dir, ignore_errors=True)

    # -------------------------------------------------------------------- helpers

    def create_database(self, name: str) -> str:
        """Create an empty utf8mb4 database ``name`` and return its SQLAlchemy URL."""
        check_identifier("database name", name, _MAX_IDENTIFIER)
        # Airflow's documented set-up for a MySQL metadata DB
        self.execute(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4 "
                     "COLLATE utf8mb4_unicode_ci")
        return self.url_for(name)

    def drop_database(self, name: str) -> None:
        check_identifier("database name", name, _MAX_IDENTIFIER)
        self.kill_connections(name)
        self.execute(f"DROP DATABASE IF EXISTS `{name}`")

    def kill_connections(self, dbname: str | None = None) -> int:
        """``KILL CONNECTION`` every client connection using ``dbname`` (default: the default
        database) but this call's own; returns how many. Waits (up to 5 s) until they are
        gone from the process list, so a killed connection's next statement fails."""
        target = self.dbname if dbname is None else dbname
        with self._admin() as conn, conn.cursor() as cur:
            cur.execute("SELECT id FROM information_schema.processlist "
                        "WHERE db = %s AND id <> CONNECTION_ID()", (target,))
            ids = [int(row[0]) for row in cur.fetchall()]
            killed = 0
            for id_ in ids:
                try:
                    cur.execute(f"KILL CONNECTION {id_}")
                    killed += 1
                except Exception as exc:  # 1094 unknown thread: it ended meanwhile
                    if getattr(exc, "args", (None,))[0] != 1094:
                        raise
            deadline = time.monotonic() + 5
            while ids and time.monotonic() < deadline:
                cur.execute("SELECT id FROM information_schema.processlist WHERE id IN ("
                            + ",".join(map(str, ids)) + ")")
                if not cur.fetchall():
                    break
                time.sleep(0.01)
        return killed

    def execute(self, sql: str, params: Any = None) -> None:
        """Run one statement as the server's root account (autocommit)."""
        with self._admin() as conn, conn.cursor() as cur:
            cur.execute(sql, params)

    def query(self, sql: str, params: Any = None, *, dbname: str | None = None
              ) -> list[tuple[Any, ...]]:
        """Rows of one statement run as root (in ``dbname`` when given)."""
        with self._admin(dbname) as conn, conn.cursor() as cur:
            cur.execute(sql, params)
            return list(cur.fetchall())

    # ------------------------------------------------------------------- internals

    @contextlib.contextmanager
    def _admin(self, dbname: str | None = None) -> Any:
        import pymysql  # the test extra's aiomysql brings it

        conn = pymysql.connect(unix_socket=str(self.socket_path), user="root", password="",
                               database=dbname, autocommit=True, connect_timeout=10)
        try:
            yield conn
        finally:
            conn.close()

    def _accepts_connections(self) -> bool:
        # a bare socket, closed whatever happens (a failed driver connect may leak its own)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            probe.settimeout(5)
            try:
                probe.connect(str(self.socket_path))
                return bool(probe.recv(1))  # the server's greeting
            except OSError:
                return False

    def _prepare_dirs(self) -> None:
        self.base_dir.mkdir(parents=True, exist_ok=True)
        # a short path: the unix socket's must fit in 107 bytes
        self._runtime_dir = pathlib.Path(tempfile.mkdtemp(prefix="localstate-my-"))
        # a temporary-file folder of its own: servers of parallel test workers, and servers
        # killed earlier, never meet in /tmp (internal temporary tables are files there)
        (self._runtime_dir / "tmp").mkdir()
        if self.uid_gid is not None:
            os.chown(self._runtime_dir, *self.uid_gid)
            os.chown(self._runtime_dir / "tmp", *self.uid_gid)

    def _user_args(self) -> list[str]:
        return [f"--user={_SYSTEM_USER}"] if self.as_root else []

    def _install(self) -> None:
        result = subprocess.run(
            [self._install_db, "--no-defaults", f"--datadir={self.runtime_dir / 'data'}",
             *self._user_args(), "--auth-root-authentication-method=normal", "--skip-test-db",
             "--skip-name-resolve"],
            capture_output=True, text=True, cwd=self.runtime_dir, stdin=subprocess.DEVNULL,
            timeout=START_TIMEOUT_S * 2, check=False,
        )
        if result.returncode != 0:
            raise RuntimeError(f"mariadb-install-db failed (exit {result.returncode}):\n"
                               f"{result.stdout.strip()}\n{result.stderr.strip()}")

    def _spawn(self) -> None:
        args = [
            self._server_bin, "--no-defaults", *self._user_args(),
            f"--datadir={self.runtime_dir / 'data'}", f"--socket={self.socket_path}",
            f"--port={self.port}", f"--bind-address={HOST}",
            f"--pid-file={self.runtime_dir / 'mariadbd.pid'}", f"--log-error={self.log_path}",
            "--skip-name-resolve", f"--sql-mode={_MYSQL8_SQL_MODE}",
            "--character-set-server=utf8mb4", "--collation-server=utf8mb4_general_ci",
            "--innodb-flush-log-at-trx-commit=2", "--innodb-doublewrite=0",
            "--innodb-buffer-pool-size=128M", "--max-connections=500",
            f"--tmpdir={self.runtime_dir / 'tmp'}",
        ]
        offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        self._process = subprocess.Popen(args, cwd=self.runtime_dir, stdin=subprocess.DEVNULL,
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if self._process.poll() is not None:
                break
            if self._accepts_connections():
                return
            if time.monotonic() > deadline:
                break
            time.sleep(0.05)
        self.stop("immediate")
        tail = ""
        with contextlib.suppress(OSError), self.log_path.open("rb") as fh:
            fh.seek(offset)
            tail = "\n".join(fh.read().decode(errors="replace").splitlines()[-LOG_TAIL_LINES:])
        raise RuntimeError(f"mariadbd did not start on port {self.port}: {' '.join(args)}\n"
                           f"--- {self.log_path} (this start) ---\n{tail}")
