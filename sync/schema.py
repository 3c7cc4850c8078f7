"""The central schema and its versioned migrations.

Two tables, named so they can live beside Airflow's own in its metadata database:

``localstate_state_variable``
    one row per state variable: owner, key (the primary key), value (JSON text; NULL marks a
    deletion, kept as a tombstone so a late writer cannot bring the key back unseen), version,
    prev_version (the version this write replaced: the flush's fencing condition compares it),
    updated_at, updated_by, writer (the local cache file whose sync worker wrote the row, NULL
    for any other write: see `localstate.sync.central_store` on replays).
``localstate_schema``
    one row per migration applied.

`upgrade()` applies what is missing, each migration in its own transaction, under a lock
(PostgreSQL: an advisory lock; SQLite: the write lock of ``BEGIN IMMEDIATE``) so that many
triggerers starting at once migrate once. A database whose schema is newer than this code is
refused, never downgraded.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Final

from sqlalchemy import (
    BigInteger,
    Column,
    Connection,
    DateTime,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    func,
    inspect,
    select,
    text,
)
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from localstate.errors import SchemaError

__all__ = [
    "FILLFACTOR",
    "LATEST_VERSION",
    "MIGRATIONS",
    "STATE_TABLE",
    "Migration",
    "current_version",
    "metadata",
    "require_current",
    "schema_table",
    "state_variable",
    "upgrade",
]

STATE_TABLE: Final = "localstate_state_variable"
_LOCK_KEY: Final = 0x4C5354_0001  # pg_advisory_xact_lock key: "LST" + 1

metadata = MetaData()

state_variable = Table(
    STATE_TABLE,
    metadata,
    Column("owner", String(250), primary_key=True),
    Column("key", String(250), primary_key=True),
    Column("value", Text, nullable=True),
    Column("version", BigInteger, nullable=False),
    Column("prev_version", BigInteger, nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
    Column("updated_by", String(250), nullable=False),
    Column("writer", String(64), nullable=True),
)

schema_table = Table(
    "localstate_schema",
    metadata,
    Column("version", Integer, primary_key=True),
    Column("description", String(200), nullable=False),
    Column("applied_at", DateTime(timezone=True), nullable=False),
)


@dataclass(frozen=True)
class Migration:
    version: int
    description: str
    apply: Callable[[Connection], None]


def _v1_create_state_variable(conn: Connection) -> None:
    # Pinned DDL: later migrations alter this, they never re-create it from `state_variable`.
    pinned = MetaData()
    Table(
        STATE_TABLE,
        pinned,
        Column("owner", String(250), primary_key=True),
        Column("key", String(250), primary_key=True),
        Column("value", Text, nullable=True),
        Column("version", BigInteger, nullable=False),
        Column("prev_version", BigInteger, nullable=False),
        Column("updated_at", DateTime(timezone=True), nullable=False),
        Column("updated_by", String(250), nullable=False),
    ).create(conn)


#: Space PostgreSQL leaves free in each heap page of the state table, in percent.
FILLFACTOR: Final = 50


def _v2_state_variable_fillfactor(conn: Connection) -> None:
    # The table is a set of watermarks each overwritten every flush: nearly all its writes are
    # UPDATEs that change no indexed column. With free room on the row's own page PostgreSQL
    # makes them HOT updates (no new primary-key index entry, dead versions pruned in-page),
    # which cut a 10,000-row flush by ~30 % here and keep the index from bloating between
    # vacuums. Half a page free lets every row of a page be rewritten once before a prune
    # (measured: 100 % HOT from the first full rewrite; 70: 43 % at first, 97 % after six;
    # 100: 1 %); the price, a table twice as large, is small for rows of a few hundred bytes.
    # Pages written before this migration get the room as they are rewritten.
    if conn.dialect.name == "postgresql":
        conn.execute(text(f"ALTER TABLE {STATE_TABLE} SET (fillfactor = {FILLFACTOR})"))


def _v3_state_variable_writer(conn: Connection) -> None:
    # The identity of the write itself: a flush recognises a replay of its own file's chain by
    # it, not by updated_by (which restarts and misconfigured hosts share). Rows written
    # before this migration have none: their replays are settled by the conflict policy.
    conn.execute(text(f"ALTER TABLE {STATE_TABLE} ADD COLUMN writer VARCHAR(64)"))


MIGRATIONS: Final[tuple[Migration, ...]] = (
    Migration(1, "create localstate_state_variable", _v1_create_state_variable),
    Migration(2, "state table fillfactor for HOT updates", _v2_state_variable_fillfactor),
    Migration(3, "state table writer column", _v3_state_variable_writer),
)
LATEST_VERSION: Final = MIGRATIONS[-1].version


async def current_version(conn: AsyncConnection) -> int:
    """The schema version of the database (0: never migrated)."""
    has_table = await conn.run_sync(lambda c: inspect(c).has_table(schema_table.name))
    if not has_table:
        return 0
    value = (await conn.execute(select(func.max(schema_table.c.version)))).scalar()
    return int(value or 0)


def _refuse_newer(version: int, url: str) -> None:
    if version > LATEST_VERSION:
        raise SchemaError(
            f"the central DB {url} has localstate schema version {version}, newer than this "
            f"code ({LATEST_VERSION}); upgrade localstate on this machine: it never "
            "downgrades a schema"
        )


async def require_current(engine: AsyncEngine) -> None:
    """Raise `SchemaError` unless the schema is exactly the one this code uses."""
    async with engine.connect() as conn:
        version = await current_version(conn)
    url = engine.url.render_as_string(hide_password=True)
    _refuse_newer(version, url)
    if version < LATEST_VERSION:
        raise SchemaError(
            f"the central DB {url} has localstate schema version {version}, this code needs "
            f"{LATEST_VERSION}: run `localstate db upgrade --central-url ...` (or open the "
            "store with upgrade_schema=True)"
        )


async def upgrade(engine: AsyncEngine) -> list[Migration]:
    """Apply every missing migration; return those applied (empty when up to date)."""
    applied: list[Migration] = []
    url = engine.url.render_as_string(hide_password=True)
    while True:
        async with engine.begin() as conn:
            if conn.dialect.name == "postgresql":
                await conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _LOCK_KEY})
            await conn.run_sync(lambda c: schema_table.create(c, checkfirst=True))
            version = await current_version(conn)
            _refuse_newer(version, url)
            pending = [m for m in MIGRATIONS if m.version > version]
            if not pending:
                return applied
            migration = pending[0]
            await conn.run_sync(migration.apply)
            await conn.execute(
                schema_table.insert().values(
                    version=migration.version,
                    description=migration.description,
                    applied_at=datetime.now(timezone.utc),
                )
            )
            applied.append(migration)
