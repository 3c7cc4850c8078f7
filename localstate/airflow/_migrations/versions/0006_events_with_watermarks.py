"""localstate schema migration 6: events committed with watermarks.

Its step is `localstate._sync.central.schema.MIGRATIONS` entry 6.
"""

from localstate.airflow._migrations import step

revision = "localstate_0006"
down_revision = "localstate_0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    step(6)


def downgrade() -> None:
    raise NotImplementedError("localstate never downgrades a schema")
