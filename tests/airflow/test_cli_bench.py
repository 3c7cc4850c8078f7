"""`localstate bench` as a user runs it: the installed command, in a subprocess."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from localstate._testing.postgres_server import PostgresServer

REQUIRED = ["scenario", "mode", "triggers", "sets_per_s", "set_p50_ms", "set_p99_ms",
            "central_txns", "central_rows", "lag_p99_ms", "rss_mb"]
MODES = ["bare", "direct", "memory", "local", "central"]
ROOT = Path(__file__).resolve().parents[2]


def localstate_command() -> list[str]:
    exe = shutil.which("localstate", path=str(Path(sys.executable).parent))
    assert exe is not None, "the localstate entry point is not installed in this venv"
    return [exe]


def run_cli(*args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*localstate_command(), *args], capture_output=True, text=True,
                          cwd=cwd, timeout=timeout)


def test_bench_writes_every_figure_for_every_mode(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    proc = run_cli("bench", "--triggers", "1,20", "--duration", "0.2", "--json", str(out),
                   "--folder", str(tmp_path / "work"), "--churn-owners", "3000", cwd=tmp_path)
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
    # the sink = airflow row runs by default on PostgreSQL only: here the table says why not
    assert "skipped flush_airflow: runs by default with a PostgreSQL central DB" in proc.stdout
    assert not any(r["mode"] == "flush_airflow" for r in rows)
    direct = next(r for r in rows if r["mode"] == "direct" and r["triggers"] == 20)
    local = next(r for r in rows if r["mode"] == "local" and r["triggers"] == 20
                 and r["scenario"] == "distinct")
    # direct: one central transaction per set; local-first: a handful per run
    assert direct["central_txns"] >= direct["sets"]
    assert local["central_txns"] < local["sets"]
    assert "x direct" in proc.stdout  # the table
    assert "local-first" in proc.stdout  # the summary
    # RSS and the cache file under churn, measured in a process of its own
    churn = result["churn"]
    assert churn["owners"] == 3000
    assert len(churn["samples"]) == 20
    assert all(s["rss"] > 0 and s["cache_bytes"] > 0 for s in churn["samples"])
    assert "churn: 3,000 owners through 1,000 live triggers" in proc.stdout


AIRFLOW_KEYS = 40


def test_the_quick_start_runs_on_the_base_install_alone(tmp_path: Path) -> None:
    """The README's first command, in a venv of its own holding the project without any extra:
    the benchmark runs, and says which rows need what is not installed (the api row imported
    httpx at start-up once, and the command failed there)."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    pip = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "-e", str(ROOT)],
                         capture_output=True, text=True, timeout=600)
    assert pip.returncode == 0, pip.stderr
    proc = subprocess.run([str(venv / "bin" / "localstate"), "bench", "--quick"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "skipped flush_api: fastapi, uvicorn, httpx not installed" in proc.stdout
    assert "pip install 'localstate[api,client]'" in proc.stdout
    assert "baseline  flush " in proc.stdout


def test_bench_flushes_through_sink_airflow_in_a_real_triggerer(
        tmp_path: Path, pg_server: PostgresServer) -> None:
    """On a PostgreSQL central DB the flush_airflow row runs: a real Airflow 3.3 deployment
    (a metadata DB beside the central one, dropped after), a trigger with the mixin flushing
    its keys through the triggerer's supervisor, PostgreSQL's commits counted; the table, the
    JSON, the summary and the plot show it beside the sql and api sinks' rows."""
    out, plot = tmp_path / "bench.json", tmp_path / "bench.png"
    url = pg_server.create_database(f"bench_airflow_{os.getpid()}")
    proc = run_cli("bench", "--triggers", "1", "--duration", "0.1", "--modes", "direct,local",
                   "--churn-owners", "0", "--central-url", url, "--airflow-keys",
                   str(AIRFLOW_KEYS), "--json", str(out), "--plot", str(plot), "--folder",
                   str(tmp_path / "work"), cwd=tmp_path, timeout=900)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.read_text())
    by = {r["mode"]: r for r in result["rows"] if r["scenario"] == "baseline"}
    row = by["flush_airflow"]
    assert row["sets"] == row["central_rows"] == row["triggers"] == AIRFLOW_KEYS, row["note"]
    assert row["seconds"] > 0
    assert row["sets_per_s"] == pytest.approx(AIRFLOW_KEYS / row["seconds"])
    assert row["central_txns"] > 0, row["note"]
    assert "commits per key" in row["note"]
    detail = result["airflow_sink"]
    # under max, one aget and one aset per key, each through Airflow's supervisor
    assert (detail["agets"], detail["asets"]) == (AIRFLOW_KEYS, AIRFLOW_KEYS)
    assert detail["server"] == "the central PostgreSQL"
    assert by["flush"]["sets_per_s"] > row["sets_per_s"]
    assert by["flush_api"]["sets_per_s"] > 0
    assert "flush_airflow" not in result["skipped"]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("baseline  flush_airflow"))
    assert f"{row['central_txns']:>6}" in line
    assert f"Through sink = airflow (a real airflow triggerer, conflict_policy max) a flush of " \
           f"{AIRFLOW_KEYS} dirty keys took" in proc.stdout
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "flush through sink = airflow:" in proc.stderr  # the progress
    left = pg_server.psql("SELECT count(*) FROM pg_database WHERE datname LIKE "
                          "'localstate_bench_airflow_%'", dbname="postgres")
    assert left.strip() == "0"  # the metadata DB went with the run


@pytest.mark.parametrize(
    ("args", "message"),
    [(["--triggers", "0"], "above 0"), (["--modes", "fast"], "unknown mode"),
     (["--duration", "x"], "expected a number"), (["--churn-owners", "-1"], "0 or more")],
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


def test_config_never_prints_the_api_token(tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW__LOCALSTATE__API_TOKEN", "never-shown-0123456789")
    proc = run_cli("config", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "never-shown" not in proc.stdout + proc.stderr
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("api_token "))
    assert "<hidden>" in line


def test_config_error_exit_code(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW__LOCALSTATE__MAX_BATCH", "none")
    proc = run_cli("config", cwd=tmp_path)
    assert proc.returncode == 1
    assert "max_batch" in proc.stderr


FLEET_FIELDS = ["triggerers", "triggers", "central_txns_per_s", "central_rows_per_s",
                "budget_rows_per_s", "lag_p99_ms", "handovers", "regressions",
                "zombie_writes_accepted", "duplicate_window_ms"]


def test_the_fleet_bench_moves_triggers_and_fences_its_zombie(
        tmp_path: Path, pg_server: PostgresServer) -> None:
    """Three triggerer processes, a few triggers each, with a budget: every figure is there,
    the moves happened, and the DB's own history shows no regression and no zombie write."""
    out = tmp_path / "fleet.json"
    url = pg_server.create_database("bench_fleet")
    proc = run_cli("bench", "--fleet", "3", "--triggers", "4", "--budget", "50",
                   "--duration", "1", "--central-url", url, "--json", str(out),
                   "--folder", str(tmp_path / "work"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    [row] = json.loads(out.read_text())["rows"]
    assert set(FLEET_FIELDS) <= row.keys()
    assert row["scenario"] == "fleet"
    assert (row["triggerers"], row["triggers"], row["budget_rows_per_s"]) == (3, 4, 50.0)
    assert row["handovers"] == 4 + 6  # the zombie's 4, then the killed one's 4 + 2 of those
    assert (row["regressions"], row["zombie_writes_accepted"]) == (0, 0)
    assert row["zombie_triggers_stopped"] == 4
    assert row["central_rows_per_s"] > 0


def test_the_fleet_bench_needs_postgresql(tmp_path: Path) -> None:
    proc = run_cli("bench", "--fleet", "2", "--triggers", "2", "--central-url",
                   f"sqlite:///{tmp_path / 'c.db'}", cwd=tmp_path)
    assert proc.returncode == 1
    assert "PostgreSQL" in proc.stderr
