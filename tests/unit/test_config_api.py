"""The API and metrics settings: token formats, validation that never shows a token."""

from __future__ import annotations

from pathlib import Path

import pytest

from localstate import ConfigError, Settings
from localstate._core.setting_specs import ApiToken

SECRET = "s3cret-token-0123456789"


def test_defaults_bind_loopback_and_leave_metrics_off(tmp_path: Path) -> None:
    s = Settings.resolve(environ={"AIRFLOW_HOME": str(tmp_path)})
    assert (s.api_tokens, s.api_host, s.api_port) == ((), "127.0.0.1", 8686)
    assert (s.statsd_host, s.statsd_port, s.statsd_prefix, s.otel) == (
        None, 8125, "localstate", False)
    assert s.metrics_interval == 10.0


def test_text_form_with_owner_prefixes_holding_colons_and_slashes(tmp_path: Path) -> None:
    env = {"AIRFLOW_HOME": str(tmp_path), "AIRFLOW__LOCALSTATE__API_TOKENS":
           f"{SECRET}:read:asset_watcher:|dag:etl/ , other-token-0123456789:read-write:*"}
    tokens = Settings.resolve(environ=env).api_tokens
    assert tokens == (
        ApiToken(secret=SECRET, role="read", owners=("asset_watcher:", "dag:etl/"),
                 name="token 1"),
        ApiToken(secret="other-token-0123456789", role="read-write", owners=("",),
                 name="token 2"),
    )
    assert tokens[0].allows("asset_watcher:orders")
    assert not tokens[0].allows("dag:other")
    assert not tokens[0].can_write
    assert tokens[1].allows("anything")
    assert tokens[1].can_write


def test_json_form_from_airflow_cfg(tmp_path: Path) -> None:
    (tmp_path / "airflow.cfg").write_text(
        "[localstate]\napi_tokens = [{\"token\": \"" + SECRET + "\", \"role\": \"read-write\", "
        "\"owners\": [\"dag:a,b\"], \"name\": \"oncall\"}]\nstatsd_host = 127.0.0.1\n"
        "statsd_prefix = airflow.localstate\notel = true\n")
    s = Settings.resolve(environ={"AIRFLOW_HOME": str(tmp_path)})
    assert s.api_tokens == (ApiToken(secret=SECRET, role="read-write", owners=("dag:a,b",),
                                     name="oncall"),)
    assert (s.statsd_host, s.statsd_prefix, s.otel) == ("127.0.0.1", "airflow.localstate", True)


@pytest.mark.parametrize(("raw", "message"), [
    ("short:read:*", "at least 16"),
    (f"{SECRET}:admin:*", "role 'admin'"),
    (f"{SECRET}:read", "TOKEN:ROLE:PREFIXES"),
    (f"{SECRET}:read:a||b", "non-empty list"),
    (f"{SECRET}:read:*, {SECRET}:read-write:*", "listed twice"),
    ('[{"token": "' + SECRET + '", "role": "read"}]', "owners"),
    ('[{"token": "' + SECRET + '", "role": "read", "owners": ["*"], "scope": 1}]', "unknown"),
    ('[{"token": "' + SECRET + '", ', "not valid JSON"),
    ('[{"token": "has space 0123456789", "role": "read", "owners": ["*"]}]', "printable"),
])
def test_bad_tokens_name_the_setting_but_never_the_token(raw: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        Settings.resolve({"api_tokens": raw})
    text = str(info.value)
    assert "'api_tokens'" in text
    assert message in text
    assert SECRET not in text
    assert "<hidden>" in text


def test_tokens_never_show_in_repr_or_describe() -> None:
    s = Settings.resolve({"api_tokens": f"{SECRET}:read:*"})
    assert SECRET not in repr(s)
    assert all(SECRET not in value for _, value, _ in s.describe())
    assert "read" in {n: v for n, v, _ in s.describe()}["api_tokens"]


@pytest.mark.parametrize(("name", "raw"), [
    ("api_port", "0"), ("api_port", "70000"), ("api_port", "http"), ("statsd_port", "-1"),
    ("api_host", "a b"), ("statsd_prefix", "bad prefix!"), ("otel", "maybe"),
    ("metrics_interval", "0"),
])
def test_bad_api_and_metric_settings(name: str, raw: str) -> None:
    with pytest.raises(ConfigError, match=name):
        Settings.resolve({name: raw})
