"""localstate schema migration 4: owner claim epochs.

Its step is `localstate._sync.central.schema.MIGRATIONS` entry 4.
"""

from localstate.airflow._migrations import step

revision = "localstate_0004"
down_revision = "localstate_0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    step(4)


def downgrade() -> None:
    raise NotImplementedError("localstate never downgrades a schema")
