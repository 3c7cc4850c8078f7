"""localstate schema migration 2: state table fillfactor for HOT updates.

Its step is `localstate._sync.central.schema.MIGRATIONS` entry 2.
"""

from localstate.airflow._migrations import step

revision = "localstate_0002"
down_revision = "localstate_0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    step(2)


def downgrade() -> None:
    raise NotImplementedError("localstate never downgrades a schema")
