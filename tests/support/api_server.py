"""A real `localstate serve` subprocess for the `sink = api` tests: start, SIGKILL, restart
on the same port."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import httpx
from localstate_cli import localstate_command

__all__ = ["DAG_TOKEN", "RO_TOKEN", "RW_TOKEN", "ServeProcess", "api_env"]

RW_TOKEN = "apisink-rw-0123456789abcdef"
DAG_TOKEN = "apisink-dag-0123456789abcdef"
RO_TOKEN = "apisink-ro-0123456789abcdef"
TOKENS = f"{RW_TOKEN}:read-write:*, {DAG_TOKEN}:read-write:dag:, {RO_TOKEN}:read:*"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def api_env(url: str, token: str = RW_TOKEN) -> dict[str, str]:
    """The environment of a process that reaches state through the API only: `sink = api`,
    no central_url, and Airflow's database blocked as its supervisor blocks it."""
    env = {k: v for k, v in os.environ.items() if k != "AIRFLOW__LOCALSTATE__CENTRAL_URL"}
    env.update({
        "AIRFLOW__LOCALSTATE__SINK": "api",
        "AIRFLOW__LOCALSTATE__API_URL": url,
        "AIRFLOW__LOCALSTATE__API_TOKEN": token,
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": "airflow-db-not-allowed:///",
        "AIRFLOW__CORE__SQL_ALCHEMY_CONN": "airflow-db-not-allowed:///",
    })
    return env


class ServeProcess:
    """`localstate serve` over `central_url` with the test tokens, on a fixed loopback port."""

    def __init__(self, central_url: str, *, store_id: str = "api-sink-server",
                 settings: dict[str, str] | None = None) -> None:
        self.central_url = central_url
        self.store_id = store_id
        #: more settings of the server, by name (``api_max_batch_rows``: ``"10"``)
        self.settings = dict(settings or {})
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = Path(tempfile.mkstemp(prefix="serve-", suffix=".log")[1])

    def start(self, timeout: float = 60.0) -> None:
        env = {**os.environ, "AIRFLOW__LOCALSTATE__API_TOKENS": TOKENS,
               **{f"AIRFLOW__LOCALSTATE__{k.upper()}": v for k, v in self.settings.items()}}
        with self.log.open("ab") as log:  # the child keeps its own descriptor
            self.proc = subprocess.Popen(
                [localstate_command(), "serve", "--port", str(self.port), "--central-url",
                 self.central_url, "--log-level", "warning", "--store-id", self.store_id],
                env=env, stdout=subprocess.DEVNULL, stderr=log)
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise AssertionError(f"serve exited: {self.log.read_text()[-3000:]}")
            try:
                if httpx.get(f"{self.url}/api/v1/health", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "serve did not start"
            time.sleep(0.1)

    def kill(self) -> None:
        """SIGKILL: no shutdown, connections dropped mid-request."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
