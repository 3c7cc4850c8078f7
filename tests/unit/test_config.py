"""Settings resolution: argument > environment > airflow.cfg > default; bad values named."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from localstate import ConfigError, Settings
from localstate._core.config import max_batch_body
from localstate._core.protocol import MAX_BATCH_BODY
from localstate._core.setting_specs import SPECS


def write_cfg(home: Path, body: str) -> Path:
    path = home / "airflow.cfg"
    path.write_text(body)
    return path


def test_defaults(tmp_path: Path) -> None:
    s = Settings.resolve(environ={"AIRFLOW_HOME": str(tmp_path)})
    assert s.durability == "local"
    assert s.flush_interval == 1.0
    assert s.enabled is True
    assert s.sources["durability"] == "default"
    assert s.resolved_central_url == f"sqlite:///{tmp_path}/localstate-central.db"
    assert s.resolved_cache_path.parent == tmp_path / "localstate"


def test_order_argument_then_environment_then_cfg_then_default(tmp_path: Path) -> None:
    write_cfg(tmp_path, "[localstate]\nflush_interval = 3\nmax_batch = 50\ndurability = memory\n")
    env = {"AIRFLOW_HOME": str(tmp_path), "AIRFLOW__LOCALSTATE__MAX_BATCH": "70",
           "AIRFLOW__LOCALSTATE__DURABILITY": "central"}
    s = Settings.resolve({"durability": "local"}, environ=env)
    assert (s.durability, s.max_batch, s.flush_interval, s.memory_window) == (
        "local", 70, 3.0, 0.05)
    assert s.sources["durability"] == "argument"
    assert s.sources["max_batch"] == "environment AIRFLOW__LOCALSTATE__MAX_BATCH"
    assert s.sources["flush_interval"].endswith("[localstate] flush_interval")
    assert s.sources["memory_window"] == "default"


def test_airflow_config_variable_points_at_another_file(tmp_path: Path) -> None:
    cfg = tmp_path / "elsewhere.cfg"
    cfg.write_text("[localstate]\ntriggerer_id = from-cfg\n")
    s = Settings.resolve(environ={"AIRFLOW_HOME": str(tmp_path), "AIRFLOW_CONFIG": str(cfg)})
    assert s.resolved_triggerer_id == "from-cfg"
    assert s.resolved_cache_path.name == "from-cfg.db"


@pytest.mark.parametrize(
    ("name", "raw", "allowed"),
    [
        ("flush_interval", "soon", "greater than 0"),
        ("flush_interval", "-1", "greater than 0"),
        ("flush_interval", "nan", "greater than 0"),
        ("max_batch", "0", "whole number"),
        ("max_batch", "1.5", "whole number"),
        ("durability", "disk", "central, local, memory"),
        ("enabled", "maybe", "true or false"),
        ("conflict_policy", "newest", "reject, last_writer_wins, max"),
        ("conflict_policy", "asset_watcher:*=min", "reject, last_writer_wins, max"),
        ("local_sync", "off", "full, normal"),
    ],
)
def test_bad_values_name_the_setting_the_source_and_what_is_allowed(
    tmp_path: Path, name: str, raw: str, allowed: str
) -> None:
    env = {"AIRFLOW_HOME": str(tmp_path), f"AIRFLOW__LOCALSTATE__{name.upper()}": raw}
    with pytest.raises(ConfigError) as info:
        Settings.resolve(environ=env)
    text = str(info.value)
    assert name in text
    assert f"AIRFLOW__LOCALSTATE__{name.upper()}" in text
    assert allowed in text


def test_bad_value_in_cfg_names_the_file(tmp_path: Path) -> None:
    path = write_cfg(tmp_path, "[localstate]\nmax_batch = lots\n")
    with pytest.raises(ConfigError, match=str(path)):
        Settings.resolve(environ={"AIRFLOW_HOME": str(tmp_path)})


def test_unknown_argument_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="flush_intervall"):
        Settings.resolve({"flush_intervall": 1}, environ={"AIRFLOW_HOME": str(tmp_path)})


def test_policy_mapping_from_text_and_from_a_dict(tmp_path: Path) -> None:
    env = {"AIRFLOW_HOME": str(tmp_path),
           "AIRFLOW__LOCALSTATE__CONFLICT_POLICY": "asset_watcher:*=max, *=reject"}
    assert Settings.resolve(environ=env).conflict_policy == {
        "asset_watcher:*": "max", "*": "reject"}
    s = Settings.resolve({"conflict_policy": {"trigger:*": "max:offset"}},
                         environ={"AIRFLOW_HOME": str(tmp_path)})
    assert s.conflict_policy == {"trigger:*": "max:offset"}


def test_replace_parses_like_an_argument(tmp_path: Path) -> None:
    s = Settings.resolve(environ={"AIRFLOW_HOME": str(tmp_path)})
    assert s.replace(flush_interval="0.25").flush_interval == 0.25
    with pytest.raises(ConfigError, match="flush_interval"):
        s.replace(flush_interval=0)


# -- the resolution order, every combination of sources --------------------------------

LAYERS = ("argument", "environment", "cfg")


@pytest.mark.parametrize(
    "present",
    [frozenset(c) for n in range(4) for c in itertools.combinations(LAYERS, n)],
    ids=lambda p: "+".join(sorted(p)) or "none",
)
def test_the_first_source_that_has_a_setting_wins(tmp_path: Path, present: frozenset[str]
                                                  ) -> None:
    values = {"argument": 11, "environment": 22, "cfg": 33}
    env = {"AIRFLOW_HOME": str(tmp_path)}
    if "environment" in present:
        env["AIRFLOW__LOCALSTATE__MAX_BATCH"] = str(values["environment"])
    if "cfg" in present:
        write_cfg(tmp_path, f"[localstate]\nmax_batch = {values['cfg']}\n")
    explicit = {"max_batch": values["argument"]} if "argument" in present else None
    s = Settings.resolve(explicit, environ=env)
    winner = next((layer for layer in LAYERS if layer in present), None)
    assert s.max_batch == (10_000 if winner is None else values[winner])
    source = s.sources["max_batch"]
    if winner is None:
        assert source == "default"
    elif winner == "environment":
        assert source == "environment AIRFLOW__LOCALSTATE__MAX_BATCH"
    elif winner == "cfg":
        assert source == f"{tmp_path / 'airflow.cfg'} [localstate] max_batch"
    else:
        assert source == "argument"


def test_a_cfg_without_a_localstate_section_leaves_the_defaults(tmp_path: Path) -> None:
    write_cfg(tmp_path, "[core]\nmax_batch = 3\n")
    s = Settings.resolve(environ={"AIRFLOW_HOME": str(tmp_path)})
    assert (s.max_batch, s.sources["max_batch"]) == (10_000, "default")


def test_an_unparsable_cfg_is_a_config_error_naming_the_file(tmp_path: Path) -> None:
    path = write_cfg(tmp_path, "[localstate\nmax_batch = 3\n")
    with pytest.raises(ConfigError, match="cannot parse") as info:
        Settings.resolve(environ={"AIRFLOW_HOME": str(tmp_path)})
    assert str(path) in str(info.value)


# -- every bad value of every setting -------------------------------------------------

TOKEN = "tok-0123456789abcdef"
_POLICIES = ("reject, last_writer_wins, max, max:<order>, max:<field> or max:<field>:<order> "
             "(orders: int, timestamp, text, position, or auto")
#: (setting, bad raw text, a phrase of what the error says is allowed)
BAD_VALUES = [
    ("enabled", "maybe", "true or false"),
    ("enabled", "2", "true or false"),
    ("durability", "disk", "central, local, memory"),
    ("durability", "", "central, local, memory"),
    ("sink", "kafka", "sql, airflow, api"),
    ("api_url", "ftp://state:8686", "http:// or https:// URL"),
    ("api_trusted_origins", "https://a.example/path", "scheme://host[:port]"),
    ("api_fleet_details", "maybe", "true or false"),
    ("api_max_batch_rows", "0", "greater than 0"),
    ("api_max_request_bytes", "-1", "greater than 0"),
    ("api_url", "http://state:8686/?token=x", "http:// or https:// URL"),
    ("api_url", "state.internal:8686", "http:// or https:// URL"),
    ("api_token", "tok en-0123456789", "printable ASCII"),
    ("triggerer_id", "../elsewhere", "A-Z a-z 0-9 _ . : @ -"),
    ("triggerer_id", "host/1", "A-Z a-z 0-9 _ . : @ -"),
    ("triggerer_id", "..", "A-Z a-z 0-9 _ . : @ -"),
    ("triggerer_id", "x" * 201, "A-Z a-z 0-9 _ . : @ -"),
    ("sink", "", "sql, airflow"),
    ("central_budget_rows_per_s", "lots", "greater than 0, or none"),
    ("central_budget_rows_per_s", "-5", "greater than 0, or none"),
    ("central_budget_rows_per_s", "nan", "greater than 0, or none"),
    ("central_budget_rows_per_s", "inf", "greater than 0, or none"),
    ("flush_interval", "soon", "greater than 0"),
    ("flush_interval", "0", "greater than 0"),
    ("flush_interval", "-1", "greater than 0"),
    ("flush_interval", "nan", "greater than 0"),
    ("flush_interval", "inf", "greater than 0"),
    ("max_batch", "0", "whole number greater than 0"),
    ("max_batch", "-3", "whole number greater than 0"),
    ("max_batch", "1.5", "whole number greater than 0"),
    ("max_batch", "lots", "whole number greater than 0"),
    ("max_value_bytes", "0", "whole number greater than 0"),
    ("max_value_bytes", "64k", "whole number greater than 0"),
    ("conflict_policy", "newest", _POLICIES),
    ("conflict_policy", "max:", _POLICIES),
    ("conflict_policy", "max::int", _POLICIES),
    ("conflict_policy", "reject:offset", _POLICIES),
    ("conflict_policy", "reject:int", _POLICIES),
    ("conflict_policy", "asset_watcher:*=min", _POLICIES),
    ("conflict_policy", "=max", "owner-glob=policy pairs"),
    ("conflict_policy", "a*=max, b*", "owner-glob=policy pairs"),
    ("local_sync", "off", "full, normal"),
    ("memory_window", "0", "greater than 0"),
    ("memory_window", "short", "greater than 0"),
    ("central_timeout", "-5", "greater than 0"),
    ("close_timeout", "never", "greater than 0"),
    ("flush_timeout", "0", "greater than 0"),
    ("central_transaction_timeout", "-1", "greater than 0"),
    ("absent_ttl", "0", "greater than 0"),
    ("max_keys_in_memory", "0", "greater than 0"),
    ("max_keys_in_memory", "lots", "greater than 0"),
    ("upgrade_schema", "perhaps", "true or false"),
    ("central_thread", "sometimes", "true or false"),
    ("api_tokens", "short:read:*", "at least 16"),
    ("api_tokens", f"{TOKEN}:admin:*", "read, read-write"),
    ("api_tokens", TOKEN, "TOKEN:ROLE:PREFIX"),
    ("api_tokens", f"{TOKEN}:read:*, {TOKEN}:read-write:dag:", "listed twice"),
    ("api_tokens", "[not json", "not valid JSON"),
    ("api_tokens", f'[{{"token": "{TOKEN}", "role": "read", "owners": []}}]', "non-empty list"),
    ("api_tokens", f'[{{"token": "{TOKEN}", "role": "read", "owners": ["*"], "x": 1}}]',
     "unknown field"),
    ("api_tokens", "[1]", "TOKEN:ROLE:PREFIX"),
    ("api_tokens", "tok en-0123456789abcdef:read:*", "printable ASCII"),
    ("api_host", "my host", "host name or an IP address"),
    ("api_host", "", "host name or an IP address"),
    ("api_host", "http://x/", "host name or an IP address"),
    ("api_port", "0", "port number from 1 to 65535"),
    ("api_port", "70000", "port number from 1 to 65535"),
    ("api_port", "http", "port number from 1 to 65535"),
    ("statsd_host", "stats d", "host name or an IP address"),
    ("statsd_port", "-1", "port number from 1 to 65535"),
    ("statsd_prefix", "bad prefix!", "letters, digits"),
    ("statsd_prefix", "..", "letters, digits"),
    ("otel", "yes please", "true or false"),
    ("statsd_tags", "dogstatsd", "true or false"),
    ("metrics_interval", "0", "greater than 0"),
    ("watch_config", "sometimes", "true or false"),
    ("api_open", "perhaps", "true or false"),
    ("asset_mirror", "sometimes", "auto, on, off"),
    ("history", "sometimes", "true or false"),
    ("history_max_rows", "0", "whole number greater than 0"),
    ("history_max_age", "soon", "an age"),
    ("history_max_age", "0s", "above zero"),
    ("history_watermark_every", "-1", "0 or more"),
    ("retention", "trigger:*=7x", "not an age"),
    ("retention", "trigger:*", "owner-glob=age"),
]
#: settings that take any text (names, paths, URLs: checked where they are used)
FREE_FORM = {"cache_dir", "cache_path", "central_url", "api_ca_bundle"}


def test_every_setting_with_a_format_has_bad_values_listed() -> None:
    from localstate._core.setting_specs import SETTING_NAMES

    missing = set(SETTING_NAMES) - FREE_FORM - {name for name, _, _ in BAD_VALUES}
    assert not missing, f"add rows to BAD_VALUES for {sorted(missing)}"


@pytest.mark.parametrize(("name", "raw", "allowed"), BAD_VALUES,
                         ids=[f"{n}={r[:20]!r}" for n, r, _ in BAD_VALUES])
@pytest.mark.parametrize("source", ["environment", "cfg", "argument"])
def test_each_bad_value_names_setting_source_and_what_is_allowed(
    tmp_path: Path, name: str, raw: str, allowed: str, source: str
) -> None:
    env = {"AIRFLOW_HOME": str(tmp_path)}
    explicit = None
    if source == "environment":
        env[f"AIRFLOW__LOCALSTATE__{name.upper()}"] = raw
        where = f"environment AIRFLOW__LOCALSTATE__{name.upper()}"
    elif source == "cfg":
        write_cfg(tmp_path, f"[localstate]\n{name} = {raw}\n")
        where = f"{tmp_path / 'airflow.cfg'} [localstate] {name}"
    else:
        explicit = {name: raw}
        where = "from argument"
    with pytest.raises(ConfigError) as info:
        Settings.resolve(explicit, environ=env)
    text = str(info.value)
    assert f"setting {name!r}" in text
    assert where in text
    assert allowed in text
    if name == "api_tokens":
        assert "<hidden>" in text
        assert TOKEN not in text  # a secret never shows in a message
    # Settings.replace checks a value the same way
    if source == "argument":
        with pytest.raises(ConfigError, match=name):
            Settings.resolve(environ={"AIRFLOW_HOME": str(tmp_path)}).replace(**{name: raw})


@pytest.mark.parametrize(
    ("name", "raw"),
    [("max_batch", True), ("max_batch", 2.5), ("api_port", False), ("enabled", None)],
)
def test_bad_native_arguments(tmp_path: Path, name: str, raw: object) -> None:
    env = {"AIRFLOW_HOME": str(tmp_path)}
    if raw is None:  # None means "not given": the next source decides
        assert Settings.resolve({name: raw}, environ=env).sources[name] == "default"
        return
    with pytest.raises(ConfigError, match=f"setting {name!r} from argument"):
        Settings.resolve({name: raw}, environ=env)


@pytest.mark.parametrize(
    ("name", "raw", "expected"),
    [("enabled", "Off", False), ("enabled", " yes ", True), ("durability", "MEMORY", "memory"),
     ("flush_interval", "0.25", 0.25), ("max_batch", " 7 ", 7), ("api_port", "8080", 8080),
     ("statsd_prefix", ".airflow.localstate.", "airflow.localstate"),
     ("conflict_policy", "max:offset", "max:offset"), ("conflict_policy", "max:int", "max:int"),
     ("conflict_policy", "asset_watcher:*=max:offset:int, *=reject",
      {"asset_watcher:*": "max:offset:int", "*": "reject"}), ("watch_config", "true", True),
     ("api_tokens", "", ())],
)
def test_good_values_in_their_text_forms(tmp_path: Path, name: str, raw: str,
                                         expected: object) -> None:
    write_cfg(tmp_path, f"[localstate]\n{name} = {raw}\n")
    assert getattr(Settings.resolve(environ={"AIRFLOW_HOME": str(tmp_path)}), name) == expected


def test_settings_fields_are_the_specs_in_order_with_their_defaults() -> None:
    import dataclasses

    from localstate._core.setting_specs import SETTING_NAMES, setting_specs

    named = [f for f in dataclasses.fields(Settings) if f.name not in ("sources", "home")]
    assert [f.name for f in named] == list(SETTING_NAMES)
    assert {f.name: f.default for f in named} == {
        name: default for name, (default, _help, _secret) in setting_specs().items()}


@pytest.mark.parametrize(("raw", "value"), [("500", 500.0), ("2.5", 2.5), ("none", None),
                                            ("", None), ("0", None)])
def test_the_central_budget_is_a_rate_or_none(raw: str, value: float | None) -> None:
    assert Settings.resolve({"central_budget_rows_per_s": raw}).central_budget_rows_per_s == (
        value)


def test_the_flush_body_limit_is_derived_from_the_row_limit_unless_set() -> None:
    default = Settings.resolve({})
    assert default.api_max_request_bytes is None
    assert default.resolved_max_request_bytes == MAX_BATCH_BODY + 64 * 1024
    assert str(default.resolved_max_request_bytes) in SPECS["api_max_request_bytes"].help
    # a lower row limit needs fewer bytes: its rows at their largest, and the body's fields
    few = Settings.resolve({"api_max_batch_rows": "10", "max_value_bytes": "1000"})
    assert few.resolved_max_request_bytes == 10 * (4 * 1000 + 4096) + 64 * 1024
    assert few.resolved_max_request_bytes == max_batch_body(10, 1000)
    # one value over the client's batch body: one row of it still fits
    huge = Settings.resolve({"max_value_bytes": str(16 * 1024 * 1024)})
    assert huge.resolved_max_request_bytes == 4 * 16 * 1024 * 1024 + 4096 + 64 * 1024
    assert Settings.resolve({"api_max_request_bytes": "5000"}).resolved_max_request_bytes == 5000


def test_secret_settings_take_the_cmd_form_from_the_environment_and_the_file(
        tmp_path: Path) -> None:
    """Read here, not through Airflow's conf: a process that never loaded Airflow (the CLI)
    gets them too. The plain setting wins over its _cmd form, the environment over the file."""
    token_file = tmp_path / "token"
    token_file.write_text("from-a-command-0123456789\n")
    cfg = tmp_path / "airflow.cfg"
    cfg.write_text(f"[localstate]\napi_token_cmd = cat {token_file}\n"
                   "api_tokens_cmd = echo 'other-token-0123456789:read:dag:'\n")
    s = Settings.resolve(environ={}, config_file=cfg)
    assert s.api_token == "from-a-command-0123456789"
    assert s.sources["api_token"] == f"{cfg} [localstate] api_token_cmd (command)"
    assert [t.owners for t in s.api_tokens] == [("dag:",)]
    env = {"AIRFLOW__LOCALSTATE__API_TOKEN_CMD": "echo env-token-0123456789"}
    s = Settings.resolve(environ=env, config_file=cfg)
    assert s.api_token == "env-token-0123456789"
    assert s.sources["api_token"] == ("environment AIRFLOW__LOCALSTATE__API_TOKEN_CMD "
                                      "(command)")
    s = Settings.resolve(environ={**env, "AIRFLOW__LOCALSTATE__API_TOKEN": "plain-0123456789ab"},
                         config_file=cfg)
    assert s.api_token == "plain-0123456789ab"
    # the value is never shown by `localstate config`
    assert ("api_token", "<hidden>", "environment AIRFLOW__LOCALSTATE__API_TOKEN") in (
        s.describe())


def test_a_failing_command_and_a_cmd_form_of_another_setting_are_refused(
        tmp_path: Path) -> None:
    cfg = tmp_path / "airflow.cfg"
    with pytest.raises(ConfigError, match=r"API_TOKEN_CMD: 'false' exited with 1"):
        Settings.resolve(environ={"AIRFLOW__LOCALSTATE__API_TOKEN_CMD": "false"},
                         config_file=cfg)
    with pytest.raises(ConfigError, match="cannot run"):
        Settings.resolve(environ={"AIRFLOW__LOCALSTATE__API_TOKEN_CMD": "/no/such/command"},
                         config_file=cfg)
    with pytest.raises(ConfigError, match=r"SINK_CMD: only the secret settings \(api_token, "
                                          r"api_tokens\) take the _cmd form; set sink itself"):
        Settings.resolve(environ={"AIRFLOW__LOCALSTATE__SINK_CMD": "echo api"},
                         config_file=cfg)
    cfg.write_text("[localstate]\ncentral_url_secret = db\n")
    with pytest.raises(ConfigError, match="central_url_secret: only the secret settings"):
        Settings.resolve(environ={}, config_file=cfg)
