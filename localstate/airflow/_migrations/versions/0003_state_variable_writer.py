"""localstate schema migration 3: state table writer column.

Its step is `localstate._sync.central.schema.MIGRATIONS` entry 3.
"""

from localstate.airflow._migrations import step

revision = "localstate_0003"
down_revision = "localstate_0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    step(3)


def downgrade() -> None:
    raise NotImplementedError("localstate never downgrades a schema")
