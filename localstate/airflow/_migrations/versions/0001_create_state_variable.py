"""localstate schema migration 1: create localstate_state_variable.

Its step is `localstate._sync.central.schema.MIGRATIONS` entry 1.
"""

from localstate.airflow._migrations import step

revision = "localstate_0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    step(1)


def downgrade() -> None:
    raise NotImplementedError("localstate never downgrades a schema")
