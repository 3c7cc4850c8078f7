"""`localstate bench` as a user runs it: the installed command, in a subprocess."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REQUIRED = ["scenario", "mode", "triggers", "sets_per_s", "set_p50_ms", "set_p99_ms",
            "central_txns", "central_rows", "lag_p99_ms", "rss_mb"]
MODES = ["bare", "direct", "memory", "local", "central"]


def localstate_command() -> list[str]:
    exe = shutil.which("localstate", path=str(Path(sys.executable).parent))
    assert exe is not None, "the localstate entry point is not installed in this venv"
    return [exe]


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*localstate_command(), *args], capture_output=True, text=True,
                          cwd=cwd, timeout=300)


def test_bench_writes_every_figure_for_every_mode(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    proc = run_cli("bench", "--triggers", "1,20", "--duration", "0.2", "--json", str(out),
                   "--folder", str(tmp_path / "work"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.read_text())
    assert {"machine", "settings", "rows"} <= result.keys()
    assert result["machine"]["python"]
    rows = result["rows"]
    for k in (1, 20):
        for mode in MODES:
            matches = [r for r in rows if r["scenario"] == "distinct" and r["mode"] == mode
                       and r["triggers"] == k]
            assert len(matches) == 1, (mode, k)
            row = matches[0]
            for name in REQUIRED:
                assert name in row, (mode, k, name)
            assert row["sets_per_s"] > 0
            assert row["set_p50_ms"] is not None
    for mode in ("aiosqlite_executemany", "central_bulk", "flush", "flush_api"):
        assert any(r["mode"] == mode for r in rows), mode
    # the same flush through sink = api (a localstate serve process), beside the sql sink's
    api = next(r for r in rows if r["mode"] == "flush_api")
    assert api["sets_per_s"] > 0, api["note"]
    assert "of the sql sink's flush" in api["note"]
    assert "Through sink = api" in proc.stdout
    direct = next(r for r in rows if r["mode"] == "direct" and r["triggers"] == 20)
    local = next(r for r in rows if r["mode"] == "local" and r["triggers"] == 20
                 and r["scenario"] == "distinct")
    # direct: one central transaction per set; local-first: a handful per run
    assert direct["central_txns"] >= direct["sets"]
    assert local["central_txns"] < local["sets"]
    assert "x direct" in proc.stdout  # the table
    assert "local-first" in proc.stdout  # the summary


@pytest.mark.parametrize(
    ("args", "message"),
    [(["--triggers", "0"], "above 0"), (["--modes", "fast"], "unknown mode"),
     (["--duration", "x"], "expected a number")],
)
def test_bench_bad_options_are_usage_errors(tmp_path: Path, args: list[str],
                                            message: str) -> None:
    proc = run_cli("bench", *args, cwd=tmp_path)
    assert proc.returncode == 2
    assert message in proc.stderr


def test_db_upgrade_creates_and_reports(tmp_path: Path, central_url: str) -> None:
    # plain mysql:// (as Airflow's sql_alchemy_conn may spell it) picks aiomysql
    url = central_url.replace("mysql+aiomysql://", "mysql://")
    first = run_cli("db", "upgrade", "--central-url", url, cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert "applied migration 1" in first.stdout
    again = run_cli("db", "upgrade", "--central-url", url, cwd=tmp_path)
    assert again.returncode == 0
    assert "already up to date" in again.stdout


def test_config_prints_settings_and_sources(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW__LOCALSTATE__FLUSH_INTERVAL", "2.5")
    proc = run_cli("config", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("flush_interval"))
    assert "2.5" in line
    assert "AIRFLOW__LOCALSTATE__FLUSH_INTERVAL" in line


def test_config_error_exit_code(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW__LOCALSTATE__MAX_BATCH", "none")
    proc = run_cli("config", cwd=tmp_path)
    assert proc.returncode == 1
    assert "max_batch" in proc.stderr
