"""`localstate config` with the token in the _cmd and _secret forms the hardening page
recommends: the installed command (a process that never loads Airflow's configuration on its
own) shows the token as set, from that source, and never prints it."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from localstate_cli import localstate_command

TOKEN = "from-the-secret-store-0123456789abcdef"


def config(home: Path, env: dict[str, str]) -> str:
    done = subprocess.run([localstate_command(), "config"], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "AIRFLOW_HOME": str(home),
                                            "AIRFLOW__LOCALSTATE__SINK": "api",
                                            "AIRFLOW__LOCALSTATE__API_URL":
                                                "https://airflow-api-server:8080/localstate",
                                            **env})
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert TOKEN not in done.stdout + done.stderr
    return done.stdout


def shown(out: str, name: str) -> list[str]:
    [line] = [line for line in out.splitlines() if line.startswith(f"{name} ")]
    return line.split(None, 2)[1:]


def test_the_token_from_a_command(tmp_path: Path) -> None:
    secret = tmp_path / "api-token"
    secret.write_text(TOKEN + "\n")
    secret.chmod(0o600)
    out = config(tmp_path, {"AIRFLOW__LOCALSTATE__API_TOKEN_CMD": f"cat {secret}"})
    assert shown(out, "api_token") == [
        "<hidden>", "environment AIRFLOW__LOCALSTATE__API_TOKEN_CMD (command)"]
    assert "(with api_token)" in out


def test_the_token_from_airflows_secrets_backend(tmp_path: Path) -> None:
    """Airflow's LocalFilesystemBackend, configured as an operator configures a vault's."""
    configs = tmp_path / "configs.json"
    configs.write_text(json.dumps({"localstate_api_token": TOKEN}))
    out = config(tmp_path, {
        "AIRFLOW__SECRETS__BACKEND": "airflow.secrets.local_filesystem.LocalFilesystemBackend",
        "AIRFLOW__SECRETS__BACKEND_KWARGS": json.dumps({"configs_file_path": str(configs)}),
        "AIRFLOW__LOCALSTATE__API_TOKEN_SECRET": "localstate_api_token"})
    assert shown(out, "api_token") == [
        "<hidden>", "environment AIRFLOW__LOCALSTATE__API_TOKEN_SECRET "
                    "(LocalFilesystemBackend 'localstate_api_token')"]
    assert "(with api_token)" in out
