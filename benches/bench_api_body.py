"""What an oversized flush body costs the API server: its memory and its other requests.

    python benches/bench_api_body.py [--json docs/bench-api-body.json] [--skip-old] [--postgres]

Starts a real `localstate serve` (central DB: an SQLite file, or with ``--postgres`` a throwaway
PostgreSQL server; one read-write token) and, in
separate threads, samples its RSS (``/proc/<pid>/status``, every 20 ms) and asks its
``/api/v1/health`` every 50 ms (the slowest answer is the longest the server's event loop was
held). Then, one at a time, over a raw socket:

* ``declared-65MB``: a 65 MB flush of 1,000,000 rows, with its ``Content-Length``;
* ``chunked-65MB``: the same body chunked (no length), sent until the server answers;
* ``largest-within``: the largest flush a client sends, 100,000 rows in just under the limit
  (32 MiB), which the server reads, parses in a worker thread and writes;
* the baseline, same run: the 65 MB body against a server with the former fixed limit
  (``api_max_request_bytes = 67108864``), which reads and parses it before refusing it
  (``--skip-old`` leaves it out).

For each: the answer's status and error, when it came, how many bytes had been sent by then,
the server's RSS growth (peak during the request minus before it) and the slowest health
answer meanwhile.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import orjson

from localstate._core.config import max_batch_body
from localstate._core.protocol import MAX_BATCH_ROWS, field_header
from localstate._core.rows import DirtyRow

TOKEN = "bench-body-0123456789abcdef"
MiB = 1024 * 1024


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rss_mib(pid: int) -> float:
    text = Path(f"/proc/{pid}/status").read_text()
    found = re.search(r"VmRSS:\s+(\d+) kB", text)
    return int(found.group(1)) / 1024 if found else 0.0


class Server:
    def __init__(self, folder: Path, settings: dict[str, str], central_url: str) -> None:
        self.port = _free_port()
        exe = shutil.which("localstate", path=str(Path(sys.executable).parent))
        assert exe is not None
        env = {**os.environ, "AIRFLOW__LOCALSTATE__API_TOKENS": f"{TOKEN}:read-write:*",
               "AIRFLOW__LOCALSTATE__CACHE_DIR": str(folder),
               **{f"AIRFLOW__LOCALSTATE__{k.upper()}": v for k, v in settings.items()}}
        self.proc = subprocess.Popen(
            [exe, "serve", "--port", str(self.port), "--central-url",
             central_url, "--log-level", "warning",
             "--store-id", "bench-body"], env=env, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, cwd=folder)
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}/api/v1/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise SystemExit("localstate serve did not start")
            time.sleep(0.2)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(60)


class Watch:
    """RSS and health latency of a server, sampled in threads while a request runs."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.rss: list[float] = []
        self.health: list[float] = []
        self._stop = threading.Event()

    def _sample_rss(self) -> None:
        while not self._stop.wait(0.02):
            self.rss.append(_rss_mib(self.server.proc.pid))

    def _ask_health(self) -> None:
        with httpx.Client(base_url=f"http://127.0.0.1:{self.server.port}", timeout=60) as c:
            while not self._stop.wait(0.05):
                started = time.perf_counter()
                c.get("/api/v1/health")
                self.health.append(time.perf_counter() - started)

    def __enter__(self) -> Watch:
        self.before = _rss_mib(self.server.proc.pid)
        self._threads = [threading.Thread(target=self._sample_rss),
                         threading.Thread(target=self._ask_health)]
        for t in self._threads:
            t.start()
        time.sleep(0.5)
        return self

    def __exit__(self, *_exc: object) -> None:
        time.sleep(0.5)
        self._stop.set()
        for t in self._threads:
            t.join()


def flush_body(rows: int, data_bytes: int) -> bytes:
    data = json.dumps("x" * (data_bytes - 2))
    return orjson.dumps({"fields": field_header(DirtyRow), "writer": None,
                         "policies": "reject",
                         "rows": [[f"trigger:b{i % 1000}", f"k{i}", data, 1, 0, 1.7e9,
                                   "bench", 0] for i in range(rows)]})


async def send(port: int, body: bytes, *, chunked: bool) -> dict[str, Any]:
    """Send `body` as a flush until it is all sent or the server answers; the answer."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    head = (b"POST /api/v1/flush HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Authorization: Bearer " + TOKEN.encode() + b"\r\n"
            b"Content-Type: application/json\r\n"
            + (b"Transfer-Encoding: chunked\r\n" if chunked
               else b"Content-Length: %d\r\n" % len(body)) + b"\r\n")
    started = time.perf_counter()
    answer = asyncio.ensure_future(reader.readuntil(b"\r\n\r\n"))
    writer.write(head)
    sent = 0
    try:
        for at in range(0, len(body), MiB):
            if answer.done():
                break
            piece = body[at:at + MiB]
            writer.write(b"%x\r\n%s\r\n" % (len(piece), piece) if chunked else piece)
            await writer.drain()
            sent += len(piece)
            await asyncio.sleep(0)
        else:
            if chunked:
                writer.write(b"0\r\n\r\n")
                await writer.drain()
    except ConnectionError:
        pass  # the server answered and closed while the body was still coming
    head_in = await asyncio.wait_for(answer, 600)
    took = time.perf_counter() - started
    length = re.search(rb"(?i)content-length: *(\d+)", head_in)
    text = await reader.readexactly(int(length.group(1))) if length else b""
    writer.close()
    status = int(head_in.split(b" ", 2)[1])
    error = orjson.loads(text).get("error") if status >= 400 and text else None
    return {"status": status, "error": error, "answer_s": round(took, 3),
            "sent_bytes": sent, "body_bytes": len(body)}


def scenario(server: Server, name: str, body: bytes, *, chunked: bool) -> dict[str, Any]:
    with Watch(server) as w:
        result = asyncio.run(send(server.port, body, chunked=chunked))
    result.update(name=name, rss_before_mib=round(w.before, 1),
                  rss_growth_mib=round(max(w.rss, default=w.before) - w.before, 1),
                  health_max_s=round(max(w.health, default=0.0), 3),
                  health_answers=len(w.health))
    print(json.dumps(result))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument("--skip-old", action="store_true",
                        help="leave out the baseline (the former 64 MiB limit)")
    parser.add_argument("--postgres", action="store_true",
                        help="the central DB on a throwaway PostgreSQL server (default: "
                             "an SQLite file)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        if not args.postgres:
            run(args, lambda name: f"sqlite:///{folder}/{name}.db", "SQLite")
            return
        from localstate._testing.postgres_server import PostgresServer

        pg = PostgresServer(Path(folder) / "postgres")
        pg.start()
        try:
            def url(name: str) -> str:
                pg.create_database(name)
                return pg.url_for(name)

            run(args, url, "PostgreSQL")
        finally:
            pg.close()


def run(args: argparse.Namespace, central_url: Callable[[str], str], central: str) -> None:
    big = flush_body(1_000_000, 6)  # 1,000,000 rows, about 65 MB
    limit = max_batch_body(MAX_BATCH_ROWS, 64 * 1024)  # the default limit
    within = flush_body(100_000, 275)  # 100,000 rows, just under it
    assert 60e6 < len(big) < 70e6, len(big)
    assert limit - MiB < len(within) <= limit, (len(within), limit)
    print(f"bodies: {len(big) / 1e6:.1f} MB and {len(within) / MiB:.1f} MiB")
    results = []
    with tempfile.TemporaryDirectory() as folder:
        server = Server(Path(folder), {}, central_url("bench_new"))
        try:
            results.append(scenario(server, "declared-65MB", big, chunked=False))
            results.append(scenario(server, "chunked-65MB", big, chunked=True))
            results.append(scenario(server, "largest-within", within, chunked=False))
        finally:
            server.stop()
    if not args.skip_old:
        with tempfile.TemporaryDirectory() as folder:
            server = Server(Path(folder), {"api_max_request_bytes": str(64 * MiB)},
                            central_url("bench_old"))
            try:
                results.append(scenario(server, "baseline-old-limit-65MB", big,
                                        chunked=False))
            finally:
                server.stop()
    if args.json:
        args.json.write_text(json.dumps({
            "date": time.strftime("%Y-%m-%d"), "machine": f"{platform.machine()}, "
            f"{os.cpu_count()} cores, Python {platform.python_version()}",
            "central": central,
            "results": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
