"""`LocalStateDBManager`: ``airflow db migrate`` creates and upgrades localstate's tables.

An external DB manager (``airflow.utils.db_manager.BaseDBManager``, as the FAB provider's): the
provider info declares it (``db-managers``), so Airflow runs it with every ``airflow db
migrate`` without configuration; ``[database] external_db_managers =
localstate.airflow.db_manager.LocalStateDBManager`` names it explicitly too.

Its Alembic revisions (`localstate.airflow._migrations`) each apply one migration of
`localstate._sync.central.schema.MIGRATIONS` through `localstate._sync.central.schema.apply_step`,
and their own version table is ``localstate_alembic_version``. What was applied is recorded where
``localstate db upgrade`` records it (``localstate_schema``): a database migrated by either
path is current for the other, and a revision whose step is already applied changes nothing
(it is only recorded in Alembic's table). So ``airflow db migrate`` twice changes nothing.

Unlike the base class, a fresh database is never created from the ORM metadata (which would
skip the steps' own DDL, e.g. PostgreSQL's fillfactor, and the ``localstate_schema`` rows):
every upgrade runs the revisions.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from airflow.utils.db_manager import BaseDBManager, command

from localstate._sync.central.schema import metadata
from localstate.airflow._migrations import VERSION_TABLE

__all__ = ["LocalStateDBManager"]

_MIGRATIONS = Path(__file__).with_name("_migrations")


class LocalStateDBManager(BaseDBManager):
    """localstate's tables in Airflow's metadata DB (see the module)."""

    metadata = metadata
    migration_dir = str(_MIGRATIONS)
    alembic_file = str(_MIGRATIONS / "alembic.ini")
    version_table_name = VERSION_TABLE
    # `airflow db reset` drops Airflow's tables, asset_state_store included: these go too
    supports_table_dropping = True

    def upgradedb(self, to_revision: str | None = None, from_revision: str | None = None,
                  show_sql_only: bool = False, use_migration_files: bool = False) -> None:
        self.log.info("Upgrading localstate's tables")
        self._release_metadata_locks_if_needed()
        command.upgrade(self.get_alembic_config(), revision=to_revision or "heads",
                        sql=show_sql_only)

    def create_db_from_orm(self) -> None:
        self.upgradedb()

    def initdb(self, use_migration_files: bool = False) -> None:
        self.upgradedb()

    def downgrade(self, to_revision: Any, from_revision: Any = None,
                  show_sql_only: bool = False) -> None:
        raise NotImplementedError("localstate never downgrades a schema")
