"""Alembic environment of localstate's revisions (run by ``airflow db migrate``).

Runs online only, on the connection Airflow's DB manager gives (``config.attributes``), else on
Airflow's engine, with localstate's own version table; each revision in its own transaction.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection

from localstate._sync.central.schema import metadata
from localstate.airflow._migrations import VERSION_TABLE

config = context.config


def _migrate(connection: Connection) -> None:
    context.configure(connection=connection, target_metadata=metadata,
                      version_table=VERSION_TABLE, transaction_per_migration=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    given = config.attributes.get("connection")
    if given is not None:
        _migrate(given)
        return
    from airflow import settings

    assert settings.engine is not None, "Airflow's settings have no engine: not configured"
    with settings.engine.connect() as connection:
        _migrate(connection)


if context.is_offline_mode():
    raise SystemExit("localstate's migrations inspect the database they migrate: they cannot "
                     "be shown as SQL offline (--show-sql-only)")
run_migrations_online()
