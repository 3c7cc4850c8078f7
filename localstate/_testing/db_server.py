"""What the throwaway test servers share (`PostgresServer`, `MysqlServer`): a server in
``base_dir`` on a free 127.0.0.1 port, started on demand, stopped and restarted keeping its
data and port, closed once (also at interpreter exit).

Invariants: ``port`` and ``runtime_dir`` are set by the first `start` and never change after;
``close`` is final (a closed server refuses `start`).
"""

from __future__ import annotations

import abc
import atexit
import contextlib
import os
import pathlib
import pwd
import re
import socket
import weakref
from types import TracebackType
from typing import TypeVar

__all__ = ["HOST", "LOG_TAIL_LINES", "START_TIMEOUT_S", "DbServer", "check_identifier",
           "free_port", "tail"]

HOST = "127.0.0.1"
START_TIMEOUT_S = 60
LOG_TAIL_LINES = 40

_Server = TypeVar("_Server", bound="DbServer")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]
        return port


def tail(path: pathlib.Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        return f"<cannot read {path}: {exc}>"
    return "\n".join(text.splitlines()[-lines:])


def check_identifier(kind: str, value: str, max_len: int) -> None:
    if not re.fullmatch(rf"[A-Za-z_][A-Za-z0-9_]{{0,{max_len - 1}}}", value):
        raise ValueError(f"invalid {kind} {value!r}: use letters, digits and _ (max {max_len})")


def _cleanup_at_exit(ref: weakref.ref[DbServer]) -> None:
    server = ref()
    if server is not None:
        with contextlib.suppress(Exception):
            server.close()


class DbServer(abc.ABC):
    """The skeleton of a test server; a subclass runs its own binaries."""

    def __init__(self, base_dir: pathlib.Path, *, user: str, dbname: str,
                 max_identifier: int, port: int | None = None) -> None:
        check_identifier("user name", user, max_identifier)
        check_identifier("database name", dbname, max_identifier)
        self.base_dir = pathlib.Path(base_dir).absolute()
        self._user = user
        self._dbname = dbname
        #: the tests run as root: the server runs as a system user (see `run_as`)
        self.as_root = os.geteuid() == 0
        #: the system user's (uid, gid) the server runs as when the tests run as root
        self.uid_gid: tuple[int, int] | None = None
        self._port: int | None = port  # None: a free port, picked by the first start()
        self._runtime_dir: pathlib.Path | None = None
        self._initialized = False
        self._closed = False

    def run_as(self, system_user: str, missing: str) -> None:
        """As root: run the server as `system_user`; `missing` is the error when there is no
        such user. Then close the server at interpreter exit, if the caller forgot."""
        if self.as_root:
            try:
                entry = pwd.getpwnam(system_user)
            except KeyError:
                raise RuntimeError(missing) from None
            self.uid_gid = (entry.pw_uid, entry.pw_gid)
        atexit.register(_cleanup_at_exit, weakref.ref(self))

    # ----------------------------------------------------------------- properties

    @property
    def host(self) -> str:
        return HOST

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError(f"{type(self).__name__} has no port yet: call start() first")
        return self._port

    @property
    def user(self) -> str:
        return self._user

    @property
    def dbname(self) -> str:
        return self._dbname

    @property
    def url(self) -> str:
        """SQLAlchemy URL of the default database."""
        return self.url_for(self._dbname)

    @property
    def runtime_dir(self) -> pathlib.Path:
        """The directory the server's data, socket and (as root) log live in."""
        if self._runtime_dir is None:
            raise RuntimeError(f"{type(self).__name__} was not started yet")
        return self._runtime_dir

    @abc.abstractmethod
    def url_for(self, dbname: str) -> str:
        """SQLAlchemy URL of ``dbname``."""

    # ------------------------------------------------------------------ lifecycle

    @abc.abstractmethod
    def start(self) -> None:
        """Start the server (initializing its data on the first call); a no-op if running."""

    @abc.abstractmethod
    def stop(self, mode: str = "fast") -> None:
        """Stop the server, keeping its data and port. Safe to call repeatedly."""

    @abc.abstractmethod
    def is_running(self) -> bool: ...

    @abc.abstractmethod
    def close(self) -> None:
        """Stop the server (immediately) and remove its temporary directories. Idempotent."""

    def restart(self, mode: str = "fast") -> None:
        """Stop (``mode``) and start again on the same port, keeping the data."""
        self.stop(mode)
        self.start()

    def __enter__(self: _Server) -> _Server:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "running" if self.is_running() else "stopped"
        return f"{type(self).__name__}({str(self.base_dir)!r}, port={self._port}, {state})"
