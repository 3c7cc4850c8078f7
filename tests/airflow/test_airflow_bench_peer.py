"""The benchmark's Airflow peer: ``MetastoreBackend.aset`` on a real migrated Airflow DB."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import asyncpg
import pytest

from localstate._bench.airflow_peer import measure_metastore_aset
from localstate._testing.postgres_server import PostgresServer

AIRFLOW = Path(sys.executable).with_name("airflow")


async def test_reports_why_without_airflow_tables(central_url: str) -> None:
    rate, why = await measure_metastore_aset(central_url, 10)
    assert rate is None
    assert "airflow db migrate" in why


@pytest.fixture
def migrated_dsn(pg_server: PostgresServer) -> str:
    """A fresh database with Airflow 3.3's schema (``airflow db migrate``)."""
    pg_server.create_database(f"airflow_peer_{os.getpid()}")
    dsn = pg_server.dsn_for(f"airflow_peer_{os.getpid()}")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW__")}
    env.update(AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=dsn.replace("postgresql://",
                                                               "postgresql+psycopg://"),
               AIRFLOW__CORE__LOAD_EXAMPLES="False")
    migrate = subprocess.run([str(AIRFLOW), "db", "migrate"], env=env, capture_output=True,
                             text=True, timeout=180, check=False)
    assert migrate.returncode == 0, migrate.stdout[-2000:] + migrate.stderr[-2000:]
    return dsn


@pytest.mark.postgres
async def test_measures_metastore_aset_on_a_migrated_db(migrated_dsn: str) -> None:
    dsn = migrated_dsn
    rate, note = await measure_metastore_aset(dsn, 30)
    assert rate is not None, note
    assert rate > 0
    assert "30 calls" in note
    conn = await asyncpg.connect(dsn)
    try:  # the bench's asset and its state rows are gone again
        assert await conn.fetchval("SELECT count(*) FROM asset") == 0
        assert await conn.fetchval("SELECT count(*) FROM asset_state_store") == 0
    finally:
        await conn.close()
