"""localstate schema migration 7: earlier releases' rows marked, their writers fenced out.

Its step is `localstate._sync.central.schema.MIGRATIONS` entry 7.
"""

from localstate.airflow._migrations import step

revision = "localstate_0007"
down_revision = "localstate_0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    step(7)


def downgrade() -> None:
    raise NotImplementedError("localstate never downgrades a schema")
