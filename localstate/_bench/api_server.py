"""A `localstate serve` process for the benchmark's ``sink = api`` rows: a real server process
on the benchmark's central DB, as a deployment runs it (its own process, its own core), with a
token made for the run."""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from localstate.errors import LocalStateError

__all__ = ["ApiServer", "api_server"]


@dataclass(frozen=True)
class ApiServer:
    url: str
    token: str


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextlib.asynccontextmanager
async def api_server(central_url: str, folder: Path, timeout: float = 60.0
                     ) -> AsyncIterator[ApiServer]:
    """`localstate serve` over `central_url` until the block ends (stopped with SIGTERM)."""
    port, token = _free_port(), secrets.token_urlsafe(24)
    env = {**os.environ, "AIRFLOW__LOCALSTATE__API_TOKENS": f"{token}:read-write:*",
           "AIRFLOW__LOCALSTATE__CACHE_DIR": str(folder)}
    log = folder / "bench-serve.log"
    with log.open("ab") as err:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "localstate.cli", "serve", "--port", str(port),
            "--central-url", central_url, "--log-level", "warning", "--store-id",
            "bench-api", env=env, stdout=subprocess.DEVNULL, stderr=err)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        async with httpx.AsyncClient() as client:
            while True:
                if proc.returncode is not None:
                    raise LocalStateError(f"localstate serve exited: {log.read_text()[-2000:]}")
                with contextlib.suppress(httpx.TransportError):
                    if (await client.get(f"{url}/api/v1/health")).status_code == 200:
                        break
                if time.monotonic() > deadline:
                    raise LocalStateError(f"localstate serve did not answer within {timeout} s")
                await asyncio.sleep(0.1)
        yield ApiServer(url, token)
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), 60)
        except asyncio.TimeoutError:
            proc.kill()
            await proc.wait()
