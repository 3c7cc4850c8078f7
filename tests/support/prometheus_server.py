"""A real Prometheus server (Debian's ``prometheus``) scraping given targets every second, and
its query API: for the metrics tests.

No mock and no skip: without the program the test fails saying how to install it.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx

__all__ = ["PrometheusServer"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class PrometheusServer:
    """``prometheus`` on a free loopback port scraping `targets` (``host:port``) each second,
    its data in a temporary folder removed on exit."""

    def __init__(self, targets: list[str]) -> None:
        program = shutil.which("prometheus")
        assert program is not None, "prometheus not found: `apt-get install prometheus`"
        self.program = program
        self.targets = targets
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.folder = Path(tempfile.mkdtemp(prefix="localstate-prometheus-"))
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> PrometheusServer:
        config = self.folder / "prometheus.yml"
        config.write_text(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
            "scrape_configs:\n  - job_name: localstate\n    static_configs:\n"
            f"      - targets: [{', '.join(repr(t) for t in self.targets)}]\n")
        with (self.folder / "prometheus.log").open("wb") as log:  # the child keeps its own
            self.proc = subprocess.Popen(
                [self.program, f"--config.file={config}",
                 f"--storage.tsdb.path={self.folder / 'data'}",
                 f"--web.listen-address=127.0.0.1:{self.port}"],
                stdout=log, stderr=log)
        deadline = time.monotonic() + 60
        while True:
            assert self.proc.poll() is None, f"prometheus exited: {self.log()}"
            try:
                if httpx.get(f"{self.url}/-/ready", timeout=2).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, f"prometheus not ready: {self.log()}"
            time.sleep(0.2)

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.folder, ignore_errors=True)

    def log(self) -> str:
        return (self.folder / "prometheus.log").read_text(errors="replace")[-3000:]

    def query(self, promql: str) -> list[dict[str, Any]]:
        """The instant vector `promql` evaluates to now: ``[{"metric": labels, "value":
        [time, "value"]}, ...]``."""
        r = httpx.get(f"{self.url}/api/v1/query", params={"query": promql}, timeout=10)
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["status"] == "success", body
        result: list[dict[str, Any]] = body["data"]["result"]
        return result
