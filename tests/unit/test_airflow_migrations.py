"""localstate's Alembic revisions (what ``airflow db migrate`` runs, through
`localstate.airflow.db_manager.LocalStateDBManager`), run by Alembic itself on each backend.

* one revision per schema migration, chained as the versions are, with one head;
* a fresh database: the revisions create the schema `localstate db upgrade` would, and record
  it where that does (``localstate_schema``); again: nothing changes;
* a database `localstate db upgrade` migrated first: the revisions change nothing but
  Alembic's version table; and the other way round, `upgrade` finds nothing to do.

The real ``airflow db migrate`` runs in `tests/airflow/test_airflow_plugin.py`.
"""

from __future__ import annotations

from alembic.script import ScriptDirectory
from alembic_revisions import alembic_config, run_revisions, schema_state, sync_engine

from localstate._sync.central.engine import make_engine
from localstate._sync.central.schema import LATEST_VERSION, MIGRATIONS, STATE_TABLE, upgrade
from localstate.airflow._migrations import VERSION_TABLE, revision_id


def test_one_revision_per_migration_chained_like_the_versions() -> None:
    script = ScriptDirectory.from_config(alembic_config())
    revisions = {r.revision: r for r in script.walk_revisions()}
    assert set(revisions) == {revision_id(m.version) for m in MIGRATIONS}, (
        "every migration in sync/central/schema.py MIGRATIONS needs its revision file in "
        "localstate/airflow/_migrations/versions (see that package's docstring)")
    for m in MIGRATIONS:
        down = revisions[revision_id(m.version)].down_revision
        assert down == (None if m.version == 1 else revision_id(m.version - 1))
    assert script.get_heads() == [revision_id(LATEST_VERSION)]


def test_the_revisions_migrate_a_fresh_db_and_twice_change_nothing(central_url: str) -> None:
    engine = sync_engine(central_url)
    try:
        run_revisions(engine)
        first = schema_state(engine)
        assert first["tables"] == {STATE_TABLE, "localstate_schema", VERSION_TABLE}
        assert [r[0] for r in first["schema"]] == [m.version for m in MIGRATIONS]
        assert first["heads"] == [revision_id(LATEST_VERSION)]
        assert "writer" in first["columns"]
        run_revisions(engine)
        assert schema_state(engine) == first
    finally:
        engine.dispose()


async def test_either_path_is_current_for_the_other(central_url: str) -> None:
    # localstate's own upgrade first, then the revisions: they only record the head
    aengine = make_engine(central_url)
    try:
        assert [m.version for m in await upgrade(aengine)] == [m.version for m in MIGRATIONS]
    finally:
        await aengine.dispose()
    engine = sync_engine(central_url)
    try:
        before = schema_state(engine)
        run_revisions(engine)
        after = schema_state(engine)
        assert after["schema"] == before["schema"]
        assert after["heads"] == [revision_id(LATEST_VERSION)]
    finally:
        engine.dispose()
    # and localstate's upgrade after the revisions: nothing to apply
    aengine = make_engine(central_url)
    try:
        assert await upgrade(aengine) == []
    finally:
        await aengine.dispose()
