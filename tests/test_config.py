"""Settings resolution: argument > environment > airflow.cfg > default; bad values named."""

from __future__ import annotations

from pathlib import Path

import pytest

from localstate import ConfigError, Settings


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
