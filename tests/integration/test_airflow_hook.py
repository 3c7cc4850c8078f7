"""`LocalStateHook` and the ``localstate`` connection against a real `localstate serve`.

The connection comes from ``AIRFLOW_CONN_*`` as an operator gives it (Airflow's own
environment-variables secrets backend reads it); the server is a real subprocess over a
SQLite central file. The DAG run that uses the hook inside real Airflow processes is
tests/airflow/test_airflow_hook_e2e.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from api_server import DAG_TOKEN, RO_TOKEN, RW_TOKEN, ServeProcess, api_env

from localstate._core.api_connection import Endpoint, endpoint
from localstate.airflow.hook import LocalStateHook
from localstate.airflow.provider import get_provider_info
from localstate.errors import AccessDenied, ConfigError, VersionConflict


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    central = tmp_path_factory.mktemp("hook") / "central.db"
    proc = ServeProcess(f"sqlite:///{central}", store_id="hook-server")
    proc.start()
    yield proc
    proc.stop()


def _conn(monkeypatch: pytest.MonkeyPatch, conn_id: str, url: str, token: str) -> None:
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(
        {"conn_type": "localstate", "host": url, "password": token}))


# -- the connection's fields ----------------------------------------------------------------


@pytest.mark.parametrize(("fields", "url"), [
    ({"host": "http://api:8080/localstate/"}, "http://api:8080/localstate"),
    ({"host": "https://state.example.com/localstate"}, "https://state.example.com/localstate"),
    # the URI form localstate://:TOKEN@api:8080/localstate
    ({"host": "api", "port": 8080, "schema": "localstate"}, "http://api:8080/localstate"),
    ({"host": "api"}, "http://api"),
])
def test_the_fields_name_the_api_url(fields: dict[str, object], url: str) -> None:
    found = endpoint("c", **fields, password="s3cret-value")  # type: ignore[arg-type]
    assert found == Endpoint(url, "s3cret-value")
    assert "s3cret" not in repr(found)


def test_the_uri_form_takes_https_and_a_ca_bundle_from_its_extra() -> None:
    """localstate://:TOKEN@api:8080/localstate?scheme=https&ca_bundle=/etc/ca.pem"""
    found = endpoint("c", "api", port=8080, schema="localstate", password="s3cret-value",
                     extra={"scheme": "https", "ca_bundle": "/etc/localstate-tls/ca.crt"})
    assert found == Endpoint("https://api:8080/localstate", "s3cret-value",
                             "/etc/localstate-tls/ca.crt")
    with pytest.raises(ConfigError, match=r"takes 'scheme' \(http or https\)"):
        endpoint("c", "api", extra={"scheme": "ftp"})
    with pytest.raises(ConfigError, match="has the extra"):
        endpoint("c", "api", extra={"verify": False})


def test_a_connection_without_host_names_what_to_set() -> None:
    with pytest.raises(ConfigError, match=r"'localstate_default' has no host: set its host"):
        endpoint("localstate_default", "  ")


def test_the_provider_declares_the_type_and_its_form() -> None:
    (conn,) = get_provider_info()["connection-types"]
    assert conn["connection-type"] == LocalStateHook.conn_type == "localstate"
    assert conn["hook-class-name"] == "localstate.airflow.hook.LocalStateHook"
    behaviour = conn["ui-field-behaviour"]
    assert behaviour["relabeling"] == {"host": "API URL", "password": "Token"}
    assert set(behaviour["hidden-fields"]) == {"schema", "port", "login"}
    # the extra a connection over https with a private CA needs
    assert "ca_bundle" in behaviour["placeholders"]["extra"]


# -- the hook on a real server ----------------------------------------------------------------


def test_get_set_compare_and_set_delete_list(server: ServeProcess,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    _conn(monkeypatch, "localstate_default", server.url, RW_TOKEN)
    hook = LocalStateHook()
    owner = LocalStateHook.task_owner("etl", "load")
    assert owner == "dag:etl/load"
    try:
        assert hook.get(owner, "cursor", default=0) == 0
        assert hook.record(owner, "cursor") is None
        first = hook.set(owner, "cursor", {"offset": 1})
        assert (first.owner, first.key, first.value, first.version) == (
            owner, "cursor", {"offset": 1}, 1)
        assert hook.compare_and_set(owner, "cursor", {"offset": 2},
                                    expected_version=1).version == 2
        with pytest.raises(VersionConflict) as conflict:
            hook.compare_and_set(owner, "cursor", {"offset": 3}, expected_version=1)
        assert (conflict.value.expected, conflict.value.actual) == (1, 2)
        assert hook.get(owner, "cursor") == {"offset": 2}
        hook.set(owner, "other", 5)
        assert sorted(r.key for r in hook.list("dag:etl/")) == ["cursor", "other"]
        assert hook.delete(owner, "other") is True
        assert hook.delete(owner, "other") is False
        assert hook.test_connection() == (True, f"the localstate API at {server.url} answered")
    finally:
        hook.close()


async def test_the_async_twins(server: ServeProcess, monkeypatch: pytest.MonkeyPatch) -> None:
    _conn(monkeypatch, "localstate_async", server.url, RW_TOKEN)
    hook = LocalStateHook(localstate_conn_id="localstate_async")
    owner = "dag:async_dag/t"
    try:
        assert await hook.aget(owner, "k", default="none") == "none"
        assert (await hook.aset(owner, "k", 1)).version == 1
        assert (await hook.acompare_and_set(owner, "k", 2, expected_version=1)).version == 2
        with pytest.raises(VersionConflict):
            await hook.acompare_and_set(owner, "k", 3, expected_version=0)
        rec = await hook.arecord(owner, "k")
        assert rec is not None
        assert rec.value == 2
        assert [r.key async for r in hook.alist("dag:async_dag/")] == ["k"]
        assert await hook.adelete(owner, "k", expected_version=2) is True
        assert await hook.aget(owner, "k") is None
    finally:
        await hook.aclose()


def test_a_token_without_the_prefix_gets_a_403_naming_it(
        server: ServeProcess, monkeypatch: pytest.MonkeyPatch) -> None:
    _conn(monkeypatch, "localstate_ro", server.url, RO_TOKEN)
    _conn(monkeypatch, "localstate_dag", server.url, DAG_TOKEN)
    read_only, dag_only = LocalStateHook("localstate_ro"), LocalStateHook("localstate_dag")
    try:
        with pytest.raises(AccessDenied, match="read-only") as denied:
            read_only.set("dag:etl/load", "cursor", 1)
        assert denied.value.status == 403
        with pytest.raises(AccessDenied) as denied:
            dag_only.get("asset_watcher:orders", "watermark")
        assert denied.value.status == 403
        assert "lacks the prefix 'asset_watcher:'" in str(denied.value)
    finally:
        read_only.close()
        dag_only.close()


def test_a_missing_connection_is_airflows_not_found(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AIRFLOW_CONN_LOCALSTATE_NOWHERE", raising=False)
    with pytest.raises(Exception, match="localstate_nowhere") as raised:
        LocalStateHook("localstate_nowhere").get("dag:a/b", "k")
    assert type(raised.value).__name__ == "AirflowNotFoundException"


# -- StateVariable through the same connection ----------------------------------------------

TASK = r"""
import json
import airflow.sdk  # loaded in every task process
from localstate import Settings
from localstate.blocking import StateVariable

settings = Settings.resolve()
StateVariable.set("cursor", 7, owner="dag:etl/sv")
print(json.dumps({"url": settings.api_url, "source": settings.sources["api_url"],
                  "token_source": settings.sources["api_token"],
                  "cursor": StateVariable.get("cursor", owner="dag:etl/sv")}))
"""


def test_state_variable_uses_the_default_connection_when_no_api_url_is_set(
        server: ServeProcess, tmp_path: Path) -> None:
    env = api_env(server.url, DAG_TOKEN)
    del env["AIRFLOW__LOCALSTATE__API_URL"], env["AIRFLOW__LOCALSTATE__API_TOKEN"]
    # Airflow parses its DB URL at import; the DAG run in test_airflow_hook_e2e.py is the
    # task process with the blocked one
    del env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"], env["AIRFLOW__CORE__SQL_ALCHEMY_CONN"]
    env.update({"AIRFLOW_HOME": str(tmp_path), "AIRFLOW__LOCALSTATE__ENABLED": "false",
                "AIRFLOW_CONN_LOCALSTATE_DEFAULT": json.dumps(
                    {"conn_type": "localstate", "host": server.url, "password": DAG_TOKEN})})
    env.pop("AIRFLOW_CONFIG", None)
    done = subprocess.run([sys.executable, "-c", TASK], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out == {"url": server.url, "source": "Airflow connection 'localstate_default'",
                   "token_source": "Airflow connection 'localstate_default'", "cursor": 7}
