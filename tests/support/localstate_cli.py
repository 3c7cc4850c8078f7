"""The installed `localstate` command, run as an operator runs it: in a subprocess, with the
test's environment (its isolated ``AIRFLOW_HOME``)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path


def localstate_command() -> str:
    exe = shutil.which("localstate", path=str(Path(sys.executable).parent))
    assert exe is not None, "the localstate entry point is not installed in this venv"
    return exe


def run(*args: str, url: str | None = None, stdin: str | None = None,
        env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    argv = [localstate_command(), *args]
    if url is not None:
        argv += ["--central-url", url]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, input=stdin,
                          env={**os.environ, **(env or {})})


def ok(proc: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert proc.returncode == 0, (proc.returncode, proc.stdout, proc.stderr)
    return proc


def cache_folder() -> Path:
    return Path(os.environ["AIRFLOW_HOME"]) / "localstate"
