"""A real PgBouncer in front of a throwaway `PostgresServer`, set up as the official Airflow
Helm chart sets up its PgBouncer.

Uses the distribution's ``pgbouncer`` (Debian: ``apt-get install pgbouncer``); if it is
missing, the suite fails with a message that says how to install it. The settings that matter
are the chart's (``pgbouncer_config`` in its ``_helpers.yaml``): ``pool_mode = transaction``
(a client's next transaction may run on another server connection, so nothing may be kept in
the session), ``ignore_startup_parameters = extra_float_digits`` (any other startup parameter
is refused), clients authenticated from an ``auth_file``, a pool of 10 server connections per
database, up to 100 clients. Every database name a client asks for goes to the database of
that name on the server (the chart maps one alias; the suite makes databases per test).

As root, ``pgbouncer`` runs as the server's system user (it refuses to run as root), from a
``/tmp/localstate-pgbouncer-*`` folder that user can read.

Typical use::

    with PgBouncer(pg) as bouncer:
        url = bouncer.url_for("airflow")   # postgresql+asyncpg://user:password@127.0.0.1:port/airflow
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import shutil
import subprocess
import tempfile
import time
from types import TracebackType

from localstate._testing.db_server import HOST, START_TIMEOUT_S, free_port, tail
from localstate._testing.postgres_ctl import clean_env
from localstate._testing.postgres_server import PostgresServer

__all__ = ["PgBouncer", "find_pgbouncer"]

#: the password clients give PgBouncer (the server behind trusts it)
PASSWORD = "pgbouncer-0123456789"
_CANDIDATES = ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer")


def find_pgbouncer() -> pathlib.Path:
    """The ``pgbouncer`` program; a RuntimeError that says how to install it if missing."""
    found = shutil.which("pgbouncer")
    for candidate in ((found,) if found else ()) + _CANDIDATES:
        if pathlib.Path(candidate).is_file():
            return pathlib.Path(candidate)
    raise RuntimeError("pgbouncer not found: `apt-get install pgbouncer` (Debian), or put "
                       "it on PATH")


class PgBouncer:
    """PgBouncer on a free 127.0.0.1 port in front of `server` (started on demand).

    `pool_size`: server connections per (database, user), the chart's ``metadataPoolSize``.
    """

    def __init__(self, server: PostgresServer, *, pool_size: int = 10,
                 max_client_conn: int = 100) -> None:
        self.server = server
        self.user = server.user
        self.password = PASSWORD
        self.pool_size = pool_size
        self.max_client_conn = max_client_conn
        self.program = find_pgbouncer()
        self.port = free_port()
        self.folder = pathlib.Path(tempfile.mkdtemp(prefix="localstate-pgbouncer-"))
        self.proc: subprocess.Popen[bytes] | None = None

    # ----------------------------------------------------------------- properties

    @property
    def config_path(self) -> pathlib.Path:
        return self.folder / "pgbouncer.ini"

    @property
    def log_path(self) -> pathlib.Path:
        return self.folder / "pgbouncer.log"

    def url_for(self, dbname: str) -> str:
        """The SQLAlchemy URL of database `dbname` through PgBouncer."""
        return f"postgresql+asyncpg://{self.user}:{self.password}@{HOST}:{self.port}/{dbname}"

    def dsn_for(self, dbname: str) -> str:
        """libpq/psycopg2 DSN of database `dbname` through PgBouncer."""
        return f"postgresql://{self.user}:{self.password}@{HOST}:{self.port}/{dbname}"

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Start PgBouncer (and the server behind it); returns once it takes clients."""
        if self.proc is not None and self.proc.poll() is None:
            return
        self.server.start()
        self._write_config()
        command = [str(self.program)]
        if os.geteuid() == 0:
            command += ["-u", "postgres"]
        self.proc = subprocess.Popen([*command, str(self.config_path)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     env=clean_env())
        self._wait_ready()

    def stop(self) -> None:
        """Stop PgBouncer (SIGTERM: at once, its clients cut). Safe to call repeatedly."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> PgBouncer:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    # ------------------------------------------------------------------ inspection

    def show(self, what: str) -> list[dict[str, str]]:
        """``SHOW <what>`` on PgBouncer's admin console (``STATS``, ``POOLS``, ...): its rows
        as dicts of column -> text."""
        psql = self.server.binaries.psql
        if psql is None:
            raise RuntimeError("psql not found: `apt-get install postgresql-client`")
        result = subprocess.run(
            [str(psql), "-X", "-q", "-A", "-F", "\t", "-P", "footer=off", "-h", HOST,
             "-p", str(self.port), "-U", self.user, "-d", "pgbouncer", "-c", f"SHOW {what}"],
            capture_output=True, text=True, timeout=30, check=False,
            env={**clean_env(), "PGPASSWORD": self.password})
        if result.returncode != 0:
            raise RuntimeError(f"SHOW {what} on PgBouncer failed: {result.stderr.strip()}")
        header, *rows = result.stdout.splitlines()
        names = header.split("\t")
        return [dict(zip(names, row.split("\t"), strict=True)) for row in rows]

    def transactions(self, dbname: str) -> int:
        """Transactions PgBouncer has pooled for database `dbname` so far."""
        return sum(int(row["total_xact_count"]) for row in self.show("STATS")
                   if row["database"] == dbname)

    # ------------------------------------------------------------------- internals

    def _write_config(self) -> None:
        os.chmod(self.folder, 0o755)
        auth_file = self.folder / "users.txt"
        auth_file.write_text(f'"{self.user}" "{self.password}"\n')
        self.config_path.write_text(
            "[databases]\n"
            f"* = host={HOST} port={self.server.port}\n"
            "\n[pgbouncer]\n"
            # the official chart's settings
            "pool_mode = transaction\n"
            "ignore_startup_parameters = extra_float_digits\n"
            "auth_type = scram-sha-256\n"
            f"auth_file = {auth_file}\n"
            f"default_pool_size = {self.pool_size}\n"
            f"max_client_conn = {self.max_client_conn}\n"
            "server_tls_sslmode = prefer\n"
            "verbose = 0\n"
            # the suite's own: where it listens, the admin console for `show`, its log
            f"listen_addr = {HOST}\n"
            f"listen_port = {self.port}\n"
            "unix_socket_dir =\n"
            f"admin_users = {self.user}\n"
            f"stats_users = {self.user}\n"
            f"logfile = {self.log_path}\n"
        )
        self.log_path.touch()
        if os.geteuid() == 0 and self.server.uid_gid is not None:
            os.chown(self.log_path, *self.server.uid_gid)
        for path in (auth_file, self.config_path):
            os.chmod(path, 0o644)

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"pgbouncer exited with {self.proc.returncode}:\n"
                                   f"{tail(self.log_path)}")
            with contextlib.suppress(RuntimeError):
                self.show("VERSION")
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"pgbouncer did not take clients within {START_TIMEOUT_S} "
                                   f"s:\n{tail(self.log_path)}")
            time.sleep(0.1)
