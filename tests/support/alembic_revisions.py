"""localstate's Alembic revisions run by Alembic itself, as ``airflow db migrate`` runs them,
on a synchronous engine over a central DB; and what they leave there (the tables, the schema
history, Alembic's heads, the state table's columns)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from sqlalchemy import create_engine, inspect, text
from sqlalchemy.engine import Engine, make_url

from localstate._sync.central.schema import STATE_TABLE
from localstate.airflow._migrations import VERSION_TABLE

MIGRATIONS_DIR = Path(__file__).parents[2] / "localstate" / "airflow" / "_migrations"
_SYNC_DRIVERS = {"postgresql": "postgresql+psycopg", "mysql": "mysql+pymysql",
                 "sqlite": "sqlite"}


def alembic_config() -> Config:
    config = Config(str(MIGRATIONS_DIR / "alembic.ini"))
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    return config


def sync_engine(central_url: str) -> Engine:
    """A synchronous engine on the central URL (Alembic's drivers: psycopg, PyMySQL)."""
    url = make_url(central_url)
    return create_engine(url.set(drivername=_SYNC_DRIVERS[url.get_backend_name()]))


def run_revisions(engine: Engine) -> None:
    config = alembic_config()
    with engine.begin() as conn:
        config.attributes["connection"] = conn
        command.upgrade(config, "heads")


def schema_state(engine: Engine) -> dict[str, Any]:
    with engine.connect() as conn:
        tables = set(inspect(conn).get_table_names())
        schema = [tuple(r) for r in conn.execute(text(
            "SELECT version, description, applied_at FROM localstate_schema ORDER BY version"))]
        heads = [r[0] for r in conn.execute(text(f"SELECT version_num FROM {VERSION_TABLE}"))] \
            if VERSION_TABLE in tables else []
        columns = sorted(c["name"] for c in inspect(conn).get_columns(STATE_TABLE))
    return {"tables": tables & {STATE_TABLE, "localstate_schema", VERSION_TABLE},
            "schema": schema, "heads": heads, "columns": columns}
