"""A real, throwaway PostgreSQL server for the test suite.

Uses the distribution's PostgreSQL binaries (Debian: ``apt-get install postgresql``).
There is deliberately no mock and no skip: if the binaries are missing, the suite fails
with a message that says how to install them.

Typical use::

    with PostgresServer(tmp_path) as pg:
        conn = await asyncpg.connect(pg.dsn)
        engine = create_async_engine(pg.url)

PostgreSQL refuses to run as root. When the tests run as root, ``initdb`` and ``pg_ctl``
run as the ``postgres`` system user (via ``runuser``), and the data directory, the unix
socket and the server log live in a fresh ``/tmp/localstate-pg-*`` directory owned by
``postgres`` (pytest's ``/tmp/pytest-of-root`` tree is mode 0700, so ``postgres`` cannot
reach ``base_dir``). ``base_dir/postgres.log`` is then a symlink to the real log, replaced
by a copy of it on :meth:`PostgresServer.close`.

The server owns its folders, port and databases; the programs that run the cluster (initdb,
pg_ctl) are its `PgCtl`'s (`localstate._testing.postgres_ctl`).
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import shutil
import subprocess
import tempfile

from localstate._testing.db_server import HOST, DbServer, check_identifier, free_port
from localstate._testing.postgres_binaries import (
    PostgresBinaries,
    find_postgres_binaries,
)
from localstate._testing.postgres_ctl import STOP_MODES, PgCtl, clean_env
from localstate._testing.postgres_sql import locale_clause, quote_ident, quote_literal

__all__ = ["PostgresServer"]

_SYSTEM_USER = "postgres"
_MAX_IDENTIFIER = 63
# sun_path is 108 bytes including the NUL; PostgreSQL appends "/.s.PGSQL.<port>".
_MAX_SOCKET_DIR_LEN = 107 - len("/.s.PGSQL.65535")
_PSQL_TIMEOUT_S = 60


class PostgresServer(DbServer):
    """A PostgreSQL cluster in ``base_dir`` listening on a free 127.0.0.1 port.

    ``start()`` runs initdb on first use; ``stop()``/``restart()`` keep the data and the
    port, so tests can simulate an outage. ``close()`` (or leaving the ``with`` block)
    stops the server and removes any temporary directory this object created. The
    server is also closed at interpreter exit if the caller forgot.
    """

    def __init__(
        self,
        base_dir: pathlib.Path,
        *,
        user: str = "localstate",
        dbname: str = "localstate",
        port: int | None = None,
        binaries: PostgresBinaries | None = None,
    ) -> None:
        super().__init__(base_dir, user=user, dbname=dbname, max_identifier=_MAX_IDENTIFIER,
                         port=port)
        self.binaries = binaries if binaries is not None else find_postgres_binaries()
        self.major_version = self.binaries.major_version()
        pkglibdir = self.binaries.pkglibdir()
        self.has_pg_stat_statements: bool = (
            pkglibdir is not None and (pkglibdir / "pg_stat_statements.so").is_file()
        )
        self._temp_dir: pathlib.Path | None = None
        #: the cluster's programs, once its folders exist (the first start)
        self._ctl: PgCtl | None = None
        self._icu: bool | None = None  # whether the server has ICU, once asked
        self.run_as(_SYSTEM_USER,
                     "running as root, and PostgreSQL refuses to run as root, but there is "
                     f"no {_SYSTEM_USER!r} system user to run it as: "
                     "`apt-get install postgresql` creates it (or run the tests as non-root)")

    # ----------------------------------------------------------------- properties

    @property
    def dsn(self) -> str:
        """libpq/asyncpg DSN of the default database: ``postgresql://...``."""
        return self.dsn_for(self.dbname)

    @property
    def data_dir(self) -> pathlib.Path:
        return self.runtime_dir / "data"

    @property
    def socket_dir(self) -> pathlib.Path:
        return self.runtime_dir

    @property
    def log_path(self) -> pathlib.Path:
        """``base_dir/postgres.log`` (as root: a symlink to the real log until close())."""
        return self.base_dir / "postgres.log"

    def url_for(self, dbname: str) -> str:
        return f"postgresql+asyncpg://{self.user}@{HOST}:{self.port}/{dbname}"

    def dsn_for(self, dbname: str) -> str:
        return f"postgresql://{self.user}@{HOST}:{self.port}/{dbname}"

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Start the server (initdb on first call). A no-op if it is already running."""
        if self._closed:
            raise RuntimeError("PostgresServer was closed; create a new one")
        if not self._initialized:
            self._ctl = self._prepare_dirs()
            self._ctl.initdb(self.user)
            self._initialized = True
            first_start = True
        else:
            first_start = False
        if self.is_running():
            return
        if self._port is not None:
            self._pg_ctl_start(self._port)
        else:
            # The port is free when we bind it but someone could take it before the
            # postmaster does: retry a few times with a fresh port.
            for attempt in range(3):
                port = free_port()
                try:
                    self._pg_ctl_start(port)
                except RuntimeError as exc:
                    if attempt == 2 or "could not bind" not in str(exc):
                        raise
                    continue
                self._port = port
                break
        if first_start:
            self.psql(f"CREATE DATABASE {quote_ident(self.dbname)}", dbname="postgres")

    def stop(self, mode: str = "fast", *, wait: bool = True) -> None:
        """Stop the server (pg_ctl -m smart|fast|immediate). Safe to call repeatedly.

        ``wait=False`` returns once the shutdown has begun: a smart shutdown then waits for
        the open sessions to end while refusing new ones ("the database system is shutting
        down").
        """
        if mode not in STOP_MODES:
            raise ValueError(f"stop mode must be one of {sorted(STOP_MODES)}, not {mode!r}")
        if self._ctl is None or not self._ctl.running():
            return
        self._ctl.stop(mode, wait=wait, log=self._real_log())

    def is_running(self) -> bool:
        """Whether the postmaster recorded in ``postmaster.pid`` is alive."""
        return self._ctl is not None and self._ctl.running()

    def close(self) -> None:
        """Stop the server (immediate mode) and remove temporary directories. Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            self.stop("immediate")
        finally:
            self._remove_temp_dir()

    # -------------------------------------------------------------------- helpers

    def create_database(self, name: str, *, locale: str | None = None) -> str:
        """Create an empty database ``name`` and return its SQLAlchemy URL.

        Without ``locale`` the database orders text as the cluster does: byte-wise (``C``,
        initdb ran with ``--no-locale``). With a language tag such as ``"en-US"`` it orders
        text as that language does, as most real installations do (``a`` < ``B`` < ``b``):
        through ICU where the server has it (PostgreSQL 15+
        built with ICU, as Debian's and the PGDG packages are; ICU needs no system locale),
        else through the system's libc locale (``en_US.UTF-8``), when it is installed.
        Neither: a RuntimeError saying how to get one.
        """
        check_identifier("database name", name, _MAX_IDENTIFIER)
        sql = f"CREATE DATABASE {quote_ident(name)}"
        if locale is not None:
            sql += " " + locale_clause(locale, self.major_version, self._has_icu)
        self.psql(sql, dbname="postgres")
        return self.url_for(name)

    def _has_icu(self) -> bool:
        """Whether databases can take an ICU locale (PostgreSQL 15+ built with ICU)."""
        if self._icu is None:
            self._icu = self.major_version >= 15 and int(self.psql(
                "SELECT count(*) FROM pg_collation WHERE collprovider = 'i'", dbname="postgres"
            ).strip()) > 0
        return self._icu

    def drop_database(self, name: str) -> None:
        """Drop ``name`` (terminating its connections first). Missing is fine."""
        check_identifier("database name", name, _MAX_IDENTIFIER)
        self.terminate_backends(name)
        self.psql(f"DROP DATABASE IF EXISTS {quote_ident(name)}", dbname="postgres")

    def terminate_backends(self, dbname: str | None = None) -> int:
        """``pg_terminate_backend`` every client backend of ``dbname`` (default: the
        default database) except this call's own; returns how many were terminated.

        On PostgreSQL 14+ it waits (up to 5 s each) until the backends are gone, so a
        connection's next query is guaranteed to fail.
        """
        target = self.dbname if dbname is None else dbname
        wait = ", 5000" if self.major_version >= 14 else ""
        sql = (
            f"SELECT count(*) FILTER (WHERE pg_terminate_backend(pid{wait})) "
            "FROM pg_stat_activity "
            f"WHERE datname = {quote_literal(target)} "
            "AND backend_type = 'client backend' AND pid <> pg_backend_pid()"
        )
        return int(self.psql(sql, dbname="postgres").strip())

    def psql(self, sql: str, *, dbname: str | None = None) -> str:
        """Run one SQL command through psql over TCP and return its unaligned output."""
        if self.binaries.psql is None:
            raise RuntimeError("psql not found: `apt-get install postgresql-client`")
        cmd = [str(self.binaries.psql), "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1",
               "-h", HOST, "-p", str(self.port), "-U", self.user,
               "-d", self.dbname if dbname is None else dbname, "-c", sql]
        result = subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            env=clean_env(),
            timeout=_PSQL_TIMEOUT_S,
            check=False,
        )
        if result.returncode != 0:
            raise RuntimeError(
                f"psql failed (exit {result.returncode}) running {sql!r}:\n{result.stderr.strip()}"
            )
        return result.stdout

    # ------------------------------------------------------------------- internals

    def _prepare_dirs(self) -> PgCtl:
        """Make the cluster's folders (`runtime_dir`); return its programs' runner."""
        self.base_dir.mkdir(parents=True, exist_ok=True)
        if self.as_root:
            assert self.uid_gid is not None
            temp = pathlib.Path(tempfile.mkdtemp(prefix="localstate-pg-"))
            self._temp_dir = temp
            os.chown(temp, *self.uid_gid)
            self._runtime_dir = temp
            self._link_log()
        elif len(str(self.base_dir)) > _MAX_SOCKET_DIR_LEN:
            # The unix socket path would be too long for sun_path.
            temp = pathlib.Path(tempfile.mkdtemp(prefix="localstate-pg-"))
            self._temp_dir = temp
            self._runtime_dir = temp
        else:
            self._runtime_dir = self.base_dir
        return PgCtl(self.binaries, self._runtime_dir,
                     run_as=_SYSTEM_USER if self.as_root else None)

    def _real_log(self) -> pathlib.Path:
        return self.runtime_dir / "postgres.log" if self.as_root else self.log_path

    def _link_log(self) -> None:
        real = self._real_log()
        if real == self.log_path:
            return
        with contextlib.suppress(FileNotFoundError):
            self.log_path.unlink()
        self.log_path.symlink_to(real)

    def _remove_temp_dir(self) -> None:
        if self._temp_dir is None:
            return
        real = self._real_log()
        if real != self.log_path and self.log_path.is_symlink():
            with contextlib.suppress(OSError):
                self.log_path.unlink()
                shutil.copyfile(real, self.log_path)
        shutil.rmtree(self._temp_dir, ignore_errors=True)
        self._temp_dir = None

    def _pg_ctl_start(self, port: int) -> None:
        assert self._ctl is not None, "started after _prepare_dirs"
        self._ctl.start(port, log=self._real_log(), shown_log=self.log_path,
                        stat_statements=self.has_pg_stat_statements)
