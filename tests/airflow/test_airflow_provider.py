"""The provider entry point, seen by the real ``airflow`` command; ``[localstate]`` through
Airflow's conf.

Each test runs a fresh process (Airflow's conf is loaded once per process, from the
``AIRFLOW_HOME`` it finds at import).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from localstate._core.config import Settings
from localstate._core.setting_specs import SETTING_NAMES
from localstate.airflow.provider import get_provider_info

AIRFLOW = Path(sys.executable).with_name("airflow")


def run(*args: str, home: Path, code: str | None = None) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW__")}
    env.update(AIRFLOW_HOME=str(home), AIRFLOW__CORE__LOAD_EXAMPLES="False",
               PYTHONWARNINGS="error")
    cmd = [sys.executable, "-c", code] if code is not None else [str(AIRFLOW), *args]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.fixture
def home() -> Path:
    """The test's own AIRFLOW_HOME (set by conftest's autouse isolation)."""
    return Path(os.environ["AIRFLOW_HOME"])


def test_providers_list_shows_localstate(home: Path) -> None:
    providers = json.loads(run("providers", "list", "-o", "json", home=home))
    mine = [p for p in providers if p["package_name"] == "localstate"]
    assert len(mine) == 1, providers
    assert mine[0]["version"]


def test_config_list_shows_every_setting(home: Path) -> None:
    out = run("config", "list", "--section", "localstate", "--show-values", home=home)
    assert "[localstate]" in out
    for name in SETTING_NAMES:
        assert f"{name} =" in out, name
    assert run("config", "get-value", "localstate", "flush_interval", home=home).strip() == "1.0"


def test_provider_options_come_from_the_settings_specs() -> None:
    options = get_provider_info()["config"]["localstate"]["options"]
    assert list(options) == list(SETTING_NAMES)
    defaults = Settings()
    for name, option in options.items():
        value = getattr(defaults, name)
        if option["default"] is not None:
            # the declared default parses back to the setting's default
            parsed = Settings.resolve({name: option["default"]})
            assert getattr(parsed, name) == value, name
    assert options["api_tokens"]["sensitive"] is True
    assert options["max_batch"]["type"] == "integer"
    assert options["enabled"]["type"] == "boolean"


def test_settings_read_through_airflows_conf(home: Path) -> None:
    token = "abcdefghijklmnop-0123"
    (home / "airflow.cfg").write_text(
        f"[localstate]\nmax_batch = 77\napi_tokens_cmd = echo {token}:read:*\n")
    code = (
        "import sys, json\n"
        "from localstate._core.config import Settings\n"
        "before = Settings.resolve()\n"
        "assert 'airflow' not in sys.modules  # localstate never imports Airflow itself\n"
        "import airflow.configuration\n"
        "after = Settings.resolve()\n"
        "print(json.dumps([before.max_batch, len(before.api_tokens), after.max_batch,\n"
        "                  [t.role for t in after.api_tokens], after.sources['api_tokens'],\n"
        "                  after.sources['max_batch']]))\n"
    )
    before_batch, before_tokens, batch, roles, token_source, batch_source = json.loads(
        run(home=home, code=code))
    # without Airflow the file is parsed directly, and localstate runs its _cmd options itself
    assert (before_batch, before_tokens) == (77, 1)
    # through Airflow's conf the command runs; the file's own values still apply
    assert batch == 77
    assert roles == ["read"]
    assert token_source.startswith("Airflow's conf")
    assert batch_source == f"{home / 'airflow.cfg'} [localstate] max_batch"
