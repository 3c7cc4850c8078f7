"""A real ``airflow api-server`` with localstate's plugin, on a migrated metadata DB.

`start_api_server` migrates a fresh metadata database (``airflow db migrate``), writes the
SimpleAuthManager users (`USERS`: one per role the tests need, with known passwords) and
starts ``airflow api-server`` on a free loopback port, waiting until localstate's health
route answers through it (synchronous: a module's tests share one server).
`ApiServer.login(user)` returns the JWT Airflow's ``/auth/token`` gives that user.
"""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from airflow_harness import AIRFLOW, Deployment, new_deployment, stop

from localstate._testing.postgres_server import PostgresServer

#: SimpleAuthManager users: name -> (role, password)
USERS = {"admin": ("ADMIN", "admin-pw"), "op": ("OP", "op-pw"),
         "viewer": ("VIEWER", "viewer-pw")}
#: the machine token the API server knows (a triggerer's: read-write, asset watchers only)
MACHINE_TOKEN = "machine-token-0123456789abcdef"
MACHINE_PREFIX = "asset_watcher:"
#: triggerers' own tokens, each bound to its triggerer id (what its rows record as who wrote)
TRIGGERER_NAMES = ("triggerer-a", "triggerer-b", "triggerer-c")
#: the per_triggerer key (each triggerer's credential is derived from it and its id)
TRIGGERER_KEY = "per-triggerer-key-0123456789abcdef"


def triggerer_token(name: str) -> str:
    """The token of triggerer `name` (one of `TRIGGERER_NAMES`), bound to its identity."""
    assert name in TRIGGERER_NAMES, name
    return f"{name}-token-0123456789abcdef"


def _api_tokens(extra: Sequence[Mapping[str, Any]] = ()) -> str:
    """``api_tokens``: the machine token (no identity: recorded by its name, ``token 1``) and
    one token per triggerer bound to its id, asset watchers, and the ``trigger:`` owners of
    triggers watching several assets (a fan-out trigger's own watermark); the per_triggerer
    key `TRIGGERER_KEY` for the same owners; then `extra` (a test's own, e.g. a DAG's)."""
    return json.dumps([
        {"token": MACHINE_TOKEN, "role": "read-write", "owners": [MACHINE_PREFIX]},
        *({"token": triggerer_token(n), "role": "read-write",
           "owners": [MACHINE_PREFIX, "trigger:"],
           "name": n, "identity": n} for n in TRIGGERER_NAMES),
        {"token": TRIGGERER_KEY, "role": "read-write", "owners": [MACHINE_PREFIX, "trigger:"],
         "name": "fleet", "per_triggerer": True},
        *extra])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class ApiServer:
    deployment: Deployment
    url: str
    process: subprocess.Popen[bytes]

    def login(self, user: str) -> str:
        """A JWT of `user` from Airflow's SimpleAuthManager (``POST /auth/token``)."""
        with httpx.Client(base_url=self.url, timeout=60) as client:
            r = client.post("/auth/token", json={"username": user, "password": USERS[user][1]})
        assert r.status_code == 201, r.text
        return str(r.json()["access_token"])


def new_airflow(pg_server: PostgresServer, tmp_path: Path, *,
                extra_tokens: Sequence[Mapping[str, Any]] = ()) -> Deployment:
    """A deployment with localstate's machine token and the test users configured (and
    `extra_tokens`, a test's own, in ``api_tokens`` after them)."""
    passwords = tmp_path / "passwords.json"
    passwords.write_text(json.dumps({u: pw for u, (_, pw) in USERS.items()}))
    port = free_port()
    return new_deployment(
        pg_server, tmp_path,
        cfg=f"[localstate]\napi_tokens = {_api_tokens(extra_tokens)}\n",
        env={
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": ",".join(
                f"{u}:{role}" for u, (role, _) in USERS.items()),
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords),
            "AIRFLOW__API__PORT": str(port),
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{port}",
            "AIRFLOW__API__WORKERS": "1",
            "AIRFLOW__API_AUTH__JWT_SECRET": "localstate-tests-jwt-secret-0123456789abcdef",
        },
    )


@contextlib.contextmanager
def api_server(d: Deployment, timeout: float = 240) -> Iterator[ApiServer]:
    """``airflow api-server`` on `d` (migrated), from when localstate answers through it."""
    url = d.env["AIRFLOW__API__BASE_URL"]
    proc = d.start("api-server", "api-server", "--workers", "1")
    try:
        end = time.monotonic() + timeout
        with httpx.Client(base_url=url, timeout=10) as client:
            while True:
                assert proc.poll() is None, f"the api-server exited\n{d.tail()}"
                with contextlib.suppress(httpx.TransportError):
                    r = client.get("/localstate/api/v1/health")
                    if r.headers.get("content-type", "").startswith("application/json"):
                        break
                assert time.monotonic() < end, f"no localstate in the api-server\n{d.tail()}"
                time.sleep(0.5)
        yield ApiServer(d, url, proc)
    finally:
        stop(proc)


def migrate(d: Deployment) -> str:
    """``airflow db migrate`` on `d`, to the end; its output."""
    done = subprocess.run([str(AIRFLOW), "db", "migrate"], env=d.env, capture_output=True,
                          timeout=600, check=False)
    text = (done.stdout + done.stderr).decode(errors="replace")
    assert done.returncode == 0, f"airflow db migrate failed:\n{text[-4000:]}"
    return text
