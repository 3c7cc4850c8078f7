"""Alembic migrations of localstate's tables, run by ``airflow db migrate``.

One thin revision per migration of `localstate._sync.central.schema.MIGRATIONS`, each calling
`localstate._sync.central.schema.apply_step` with its version: the schema's steps stay the one
source of truth, and ``localstate db upgrade`` (outside Airflow) applies the very same steps.

**Adding a migration.** Append it to ``MIGRATIONS`` in ``sync/central/schema.py``, then add
``versions/NNNN_<what>.py`` here, copying the last revision file and changing its three names:

    revision = "localstate_0004"          # this migration's version, 4 digits
    down_revision = "localstate_0003"     # the one before
    def upgrade() -> None: step(4)

`tests/unit/test_airflow_migrations.py` fails while a migration has no revision, or the chain of
revisions is not the chain of versions.
"""

from __future__ import annotations

from typing import Final

__all__ = ["VERSION_TABLE", "revision_id", "step"]

#: Alembic's version table for localstate's revisions (Airflow's own is ``alembic_version``)
VERSION_TABLE: Final = "localstate_alembic_version"


def revision_id(version: int) -> str:
    """The Alembic revision id of schema migration `version`."""
    return f"localstate_{version:04d}"


def step(version: int) -> None:
    """The body of a revision: apply migration `version` unless the schema has it."""
    from alembic import op

    from localstate._sync.central.schema import apply_step

    apply_step(op.get_bind(), version)
