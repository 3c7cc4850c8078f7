"""The CLI under ``sink = api``: get, set, delete, ls, status and status --fleet go through
``api_url`` with ``api_token`` (a real `localstate serve` subprocess over a central DB the
CLI has no credentials for), and no central DB is ever created in its place."""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from api_server import RO_TOKEN, ServeProcess, api_env
from localstate_cli import localstate_command

from localstate import StateStore

on_backends = pytest.mark.parametrize("backend", ["sqlite", "postgresql"], indirect=True)


@pytest.fixture
def server(central_url: str) -> Iterator[ServeProcess]:
    proc = ServeProcess(central_url)
    proc.start()
    yield proc
    proc.stop()


def cli(home: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([localstate_command(), *args], capture_output=True, text=True,
                          timeout=120, env={**env, "AIRFLOW_HOME": str(home)})


def ok(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, (proc.returncode, proc.stdout, proc.stderr)
    return proc.stdout


async def flush_some(central_url: str, tmp_path: Path) -> None:
    """A triggerer of the deployment, flushing straight to its central DB."""
    async with StateStore(central_url=central_url, triggerer_id="deployed-t",
                          cache_path=tmp_path / "deployed.db", flush_interval=60.0) as store:
        for i in range(3):
            await store.set("asset_watcher:orders", f"k{i}", {"offset": i})
        await store.flush()


@on_backends
async def test_ls_get_set_delete_and_status_go_through_the_api(
        server: ServeProcess, central_url: str, tmp_path: Path) -> None:
    await flush_some(central_url, tmp_path)
    home = tmp_path / "cli-home"
    home.mkdir()
    env = api_env(server.url)

    def run(*args: str) -> str:
        return ok(cli(home, env, *args))

    listed = await asyncio.to_thread(run, "ls")
    assert "(3 state variables)" in listed
    assert "asset_watcher:orders" in listed
    assert '{"offset":2}' in listed
    rows = json.loads(await asyncio.to_thread(run, "ls", "--json", "--owner", "asset_"))
    assert [r["key"] for r in rows] == ["k0", "k1", "k2"]
    assert json.loads(await asyncio.to_thread(run, "ls", "--json", "--limit", "2"))[-1][
        "key"] == "k1"
    got = json.loads(await asyncio.to_thread(run, "get", "asset_watcher:orders", "k1",
                                             "--json"))
    assert (got["value"], got["version"]) == ({"offset": 1}, 1)
    assert "version 2" in await asyncio.to_thread(
        run, "set", "asset_watcher:orders", "k1", '{"offset": 10}', "--expected-version", "1")
    conflict = await asyncio.to_thread(cli, home, env, "set", "asset_watcher:orders", "k1",
                                       "5", "--expected-version", "1")
    assert conflict.returncode == 4, conflict.stderr
    await asyncio.to_thread(run, "delete", "asset_watcher:orders", "k2")
    missing = await asyncio.to_thread(cli, home, env, "get", "asset_watcher:orders", "k2")
    assert missing.returncode == 3, missing.stderr
    # the central DB (which the CLI has no credentials for) holds what the CLI wrote
    async with StateStore(central_url=central_url, cache_path=tmp_path / "check.db") as check:
        assert await check.get("asset_watcher:orders", "k1") == {"offset": 10}
        assert await check.get("asset_watcher:orders", "k2") is None

    status = await asyncio.to_thread(run, "status")
    assert f"API           {server.url}" in status
    assert server.store_id in status
    fleet = await asyncio.to_thread(run, "status", "--fleet")
    assert f"(API {server.url})" in fleet
    [line] = [t for t in fleet.splitlines() if t.startswith("deployed-t")]
    assert " idle " in line or " flushing " in line
    view = json.loads(await asyncio.to_thread(run, "status", "--fleet", "--json"))
    assert [m["triggerer"] for m in view["fleet"]["triggerers"]] == ["deployed-t"]
    config = await asyncio.to_thread(run, "config")
    where = {line.split("  ", 1)[0]: line.split("  ", 1)[1].strip()
             for line in config.splitlines() if line.startswith("(")}
    assert where["(CLI get/set/ls/status)"] == f"API {server.url}"
    assert where["(flushes go to)"].startswith(f"API {server.url} (with api_token)")
    # nothing in $AIRFLOW_HOME: no empty central DB stood in for the deployment's
    assert not list(home.rglob("*.db")), list(home.rglob("*"))


@on_backends
async def test_a_read_token_reads_and_its_write_is_refused(
        server: ServeProcess, central_url: str, tmp_path: Path) -> None:
    await flush_some(central_url, tmp_path)
    env = api_env(server.url, RO_TOKEN)
    assert "(3 state variables)" in ok(await asyncio.to_thread(cli, tmp_path, env, "ls"))
    refused = await asyncio.to_thread(cli, tmp_path, env, "set", "asset_watcher:orders", "k0",
                                      "1")
    assert refused.returncode == 1
    assert "read-only" in refused.stderr


def test_sink_api_without_api_url_and_sink_airflow_without_central_url_say_what_to_set(
        tmp_path: Path) -> None:
    base = api_env("http://127.0.0.1:9")
    del base["AIRFLOW__LOCALSTATE__API_URL"]
    no_url = cli(tmp_path, base, "ls")
    assert no_url.returncode == 1
    assert "api_url is not set" in no_url.stderr
    airflow = cli(tmp_path, {**base, "AIRFLOW__LOCALSTATE__SINK": "airflow"}, "ls")
    assert airflow.returncode == 1
    assert "--central-url" in airflow.stderr
    down = cli(tmp_path, api_env("http://127.0.0.1:9"), "ls")
    assert down.returncode == 1
    assert "did not answer" in down.stderr
    # the commands that only a central DB can answer refuse rather than create one
    for args in (["db", "upgrade"], ["db", "prune", "--older-than", "7d", "--dry-run"]):
        refused = cli(tmp_path, api_env("http://127.0.0.1:9"), *args)
        assert refused.returncode == 1, refused.stderr
        assert "give --central-url" in refused.stderr
    assert not list(tmp_path.rglob("*.db"))
