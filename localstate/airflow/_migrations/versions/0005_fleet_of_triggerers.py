"""localstate schema migration 5: fleet of triggerers.

Its step is `localstate._sync.central.schema.MIGRATIONS` entry 5.
"""

from localstate.airflow._migrations import step

revision = "localstate_0005"
down_revision = "localstate_0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    step(5)


def downgrade() -> None:
    raise NotImplementedError("localstate never downgrades a schema")
