"""localstate schema migration 8: history of each owner's watermarks, events and claims.

Its step is `localstate._sync.central.schema.MIGRATIONS` entry 8.
"""

from localstate.airflow._migrations import step

revision = "localstate_0008"
down_revision = "localstate_0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    step(8)


def downgrade() -> None:
    raise NotImplementedError("localstate never downgrades a schema")
