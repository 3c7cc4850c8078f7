"""`localstate serve` as an operator starts it: the installed command in a subprocess on a
loopback port, over the central DB of each backend; its token (given, generated and kept, or
none with `api_open`), what it logs, and a clean stop on SIGTERM."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import stat
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from localstate_cli import cache_folder, localstate_command, ok, run

TOKEN = "cli-serve-token-0123456789"


def test_serve_refuses_a_public_address_when_the_api_is_open(tmp_path: Path) -> None:
    proc = run("serve", "--host", "0.0.0.0", "--port", "8686",
               url=f"sqlite:///{tmp_path}/c.db", env={"AIRFLOW__LOCALSTATE__API_OPEN": "true"})
    assert proc.returncode == 1
    assert "refusing to serve on 0.0.0.0" in proc.stderr
    assert "api_open" in proc.stderr


def test_serve_without_tokens_generates_one_and_refuses_requests_without_it(
    central_url: str,
) -> None:
    proc, base, announced = start_serve(central_url, {})
    try:
        match = re.search(r"http://127\.0\.0\.1:\d+/\?token=([\w-]+) ", announced)
        assert match is not None, announced
        token = match.group(1)
        assert len(token) >= 40
        assert http(f"{base}/api/v1/health")[1]["auth_required"] is True
        url = f"{base}/api/v1/state/dag:x/k"
        assert http(url, None, "PUT", {"value": 1})[0] == 401
        assert http(url, "not-the-token-at-all", "PUT", {"value": 1})[0] == 401
        assert http(url, token, "GET")[0] == 404  # nothing was written
        assert http(url, token, "PUT", {"value": 2})[0] == 200
    finally:
        err = stop_serve(proc)
    assert token not in err  # printed once, in the URL, never again
    token_file = cache_folder() / "api-token"
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    assert token_file.read_text().strip() == token
    proc, base, announced = start_serve(central_url, {})  # the next start keeps the token
    try:
        assert f"?token={token} " in announced
    finally:
        stop_serve(proc)


def test_serve_with_api_open_needs_no_token_on_loopback(central_url: str) -> None:
    proc, base, announced = start_serve(central_url, {"AIRFLOW__LOCALSTATE__API_OPEN": "true"})
    try:
        assert "?token=" not in announced
        assert http(f"{base}/api/v1/health")[1]["auth_required"] is False
        assert http(f"{base}/api/v1/state/dag:x/k", None, "PUT", {"value": 1})[0] == 200
    finally:
        stop_serve(proc)
    assert not (cache_folder() / "api-token").exists()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def http(url: str, token: str | None = None, method: str = "GET",
         body: Any = None) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    request = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def start_serve(central_url: str, env: dict[str, str], store_id: str = "serve-test"
                ) -> tuple[subprocess.Popen[str], str, str]:
    """`localstate serve` on a free loopback port: the process, its base URL, and the line
    it printed to say where it serves (read before the server answered)."""
    port = free_port()
    proc = subprocess.Popen(
        [localstate_command(), "serve", "--port", str(port), "--central-url", central_url,
         "--log-level", "warning", "--store-id", store_id],
        env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    base = f"http://127.0.0.1:{port}"
    announced = ""
    for line in proc.stderr:
        if "localstate API and UI on" in line:
            announced = line
            break
    assert announced, proc.communicate()
    deadline = time.monotonic() + 60
    while True:
        assert proc.poll() is None, proc.communicate()
        try:
            http(f"{base}/api/v1/health")
            return proc, base, announced
        except OSError:
            assert time.monotonic() < deadline, "serve did not start"
            time.sleep(0.1)


def stop_serve(proc: subprocess.Popen[str]) -> str:
    proc.send_signal(signal.SIGTERM)
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    return err


def test_serve_answers_on_loopback_with_tokens_and_stops_cleanly(central_url: str) -> None:
    proc, base, announced = start_serve(
        central_url, {"AIRFLOW__LOCALSTATE__API_TOKENS": f"{TOKEN}:read-write:dag:"})
    port = base.rsplit(":", 1)[1]
    try:
        status, health = http(f"{base}/api/v1/health")
        assert (status, health["auth_required"]) == (200, True)
        assert http(f"{base}/api/v1/state")[0] == 401
        status, saved = http(f"{base}/api/v1/state/dag:s%2Ft/k", TOKEN, "PUT", {"value": 5})
        assert (status, saved["version"], saved["flush_state"]) == (200, 1, "flushed")
        assert http(f"{base}/api/v1/state/asset_watcher:a/k", TOKEN, "PUT",
                    {"value": 5})[0] == 403
    finally:
        err = announced + stop_serve(proc)
    assert TOKEN not in err  # never logged
    assert f"http://127.0.0.1:{port}/ " in err
    # the serving store was closed after the server stopped: its cache lock is released
    assert (cache_folder() / "serve-test.db.lock").read_bytes() == b""
    got = json.loads(ok(run("get", "dag:s/t", "k", "--json", url=central_url)).stdout)
    # the server records who wrote: the token that made the request (by its name)
    assert (got["value"], got["updated_by"]) == (5, "token 1")
