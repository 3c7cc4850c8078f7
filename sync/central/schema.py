"""The central schema and its versioned migrations.

Two tables, named so they can live beside Airflow's own in its metadata database:

``localstate_state`` (``localstate_state_variable`` before migration 7)
    one row per state variable: owner, key (the primary key), value (JSON text; NULL marks a
    deletion, kept as a tombstone so a late writer cannot bring the key back unseen), version,
    prev_version (the version this write replaced: the flush's fencing condition compares it),
    updated_at, updated_by, writer (the local cache file whose sync worker wrote the row, NULL
    for any other write: see `localstate._sync.central.fenced_write` on replays).
``localstate_owner_claim``
    one row per claimed owner: owner (the primary key), epoch (bumped by each claim), claimant
    (the claiming store's triggerer id), claimed_at, writer (the claiming store's local cache
    file, `LocalCache.writer_id`; NULL without one). A flushed write carrying a lower epoch
    than its owner's is refused unless it comes from the claim's own cache file
    (`localstate._sync.central.dialects`); an owner with no row is at epoch 0.
``localstate_fleet``
    one row per triggerer (its ``triggerer_id``): host, pid, and as of its last flush, that
    flush's time, the dirty keys it carried, the time of the oldest write among them, the rows
    per second the triggerer has been writing, and its flush interval. Written by each flush in
    its own transaction (`localstate._sync.central.fleet`).
``localstate_event``
    one row per event committed (``StateStore.emit``), keyed by (owner, key): the
    de-duplication of replays.
``localstate_history`` (migration 8)
    a bounded record of what each owner's writers did (`localstate._sync.central.history`): one row
    per watermark a flush committed (value, version, writer, triggerer), per event a flush carried
    (its outcome: committed, duplicate, refused or rejected, and the asset event it made), and
    per claim (epoch, triggerer). Written in the transaction that did the thing; kept within
    ``history_max_rows`` per owner and ``history_max_age``.
``localstate_schema``
    one row per migration applied.

`upgrade()` applies what is missing, each migration in its own transaction, under a lock
(PostgreSQL: an advisory lock; MySQL: ``GET_LOCK``; SQLite: the write lock of ``BEGIN
IMMEDIATE``) so that many triggerers starting at once migrate once. A database whose schema is
newer than this code is refused, never downgraded.

The rule of every migration: it never leaves an older writer able to corrupt newer state. A
process started under an older schema does not look at the schema again while it runs (it
checks at open), so a migration that adds a fence older code does not know (a column the
flush must set, a table it must consult) must also make that older code's statements fail,
loudly, in the same transaction as it adds the fence; the upgrade notes then say which
processes must stop first. Migration 7 is one: claims and writer ids came in with 3 to 5, and
a process of an earlier release kept flushing past a newer holder's claim, with no error on
either side. It renames the state table (``localstate_state_variable`` to
``localstate_state``), so such a process fails every read and write with "relation / table
does not exist" instead; and it marks the rows that process wrote as the earlier release's
(`LEGACY_WRITER`), so the files it leaves behind flush them as their own. A later migration
that needs to fence out the current code renames again, or adds a ``NOT NULL`` column with
no default that older statements leave out (PostgreSQL, SQLite and MySQL in strict mode
check it on the row an upsert proposes, before the conflict).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Final

from sqlalchemy import (
    BigInteger,
    Column,
    Connection,
    DateTime,
    Float,
    Index,
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
from sqlalchemy.dialects import mysql
from sqlalchemy.engine import Dialect
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.types import TypeEngine

from localstate.errors import SchemaError

__all__ = [
    "CLAIM_TABLE",
    "EVENT_TABLE",
    "FILLFACTOR",
    "FLEET_TABLE",
    "HISTORY_TABLE",
    "LATEST_VERSION",
    "LEGACY_WRITER",
    "MARIADB_NAME_COLLATION",
    "MIGRATIONS",
    "MYSQL_NAME_COLLATION",
    "STATE_TABLE",
    "Migration",
    "announce",
    "apply_step",
    "current_version",
    "event",
    "fleet",
    "history",
    "metadata",
    "name_collation",
    "owner_claim",
    "require_current",
    "schema_table",
    "state_variable",
    "upgrade",
]

log = logging.getLogger("localstate.sync.schema")

STATE_TABLE: Final = "localstate_state"
#: the state table's name until migration 7 (which renames it to fence older writers out)
_STATE_TABLE_BEFORE_7: Final = "localstate_state_variable"
CLAIM_TABLE: Final = "localstate_owner_claim"
FLEET_TABLE: Final = "localstate_fleet"
#: one row per event committed (`StateStore.emit`): its (owner, key) de-duplicates replays
EVENT_TABLE: Final = "localstate_event"
#: what each owner's writers did, bounded per owner (`localstate._sync.central.history`)
HISTORY_TABLE: Final = "localstate_history"
#: the ``writer`` migration 7 gives the rows of releases that wrote none (central schema
#: below 3): their identity is their ``updated_by`` (`localstate._sync.central.fenced_write`, 4). No
#: file's writer id (hex) is ever this.
LEGACY_WRITER: Final = "earlier-release"
_LOCK_KEY: Final = 0x4C5354_0001  # pg_advisory_xact_lock key: "LST" + 1
_MYSQL_LOCK: Final = "localstate_schema_upgrade"  # GET_LOCK name
_MYSQL_LOCK_WAIT_S: Final = 300


#: the binary, NO PAD collation of utf8mb4 names: MySQL 8.0.17+ and MariaDB 10.2+ spell it
#: differently, and neither has the other's (utf8mb4_bin is PAD SPACE on both: it would make
#: ``k`` and ``k `` one primary key)
MYSQL_NAME_COLLATION: Final = "utf8mb4_0900_bin"
MARIADB_NAME_COLLATION: Final = "utf8mb4_nopad_bin"


def name_collation(dialect: Dialect) -> str:
    """The collation of names on this MySQL-family server (known once connected)."""
    return MARIADB_NAME_COLLATION if getattr(dialect, "is_mariadb", False) else (
        MYSQL_NAME_COLLATION)


def _name(collation: str | None = None) -> TypeEngine[str]:
    """An owner, key or writer id: VARCHAR(250); on MySQL utf8mb4 with a binary NO PAD
    collation (`name_collation`), so names compare and sort byte-wise as on PostgreSQL ("C")
    and SQLite: ``a`` and ``A``, ``e`` and ``é``, ``k`` and ``k `` are different keys. The
    primary key (owner, key) is 2 x 1,000 bytes: within InnoDB's 3,072-byte limit of the
    DYNAMIC row format, which the table names (COMPACT would allow only 767 per column).
    `collation` None: the type for queries, not for DDL."""
    if collation is None:
        return String(250)
    return String(250).with_variant(
        mysql.VARCHAR(250, charset="utf8mb4", collation=collation), "mysql", "mariadb")


def _json_text() -> TypeEngine[str]:
    # MySQL's TEXT holds 65,535 bytes, less than max_value_bytes' default of 64 KiB
    return Text().with_variant(mysql.LONGTEXT(charset="utf8mb4", collation="utf8mb4_bin"),
                               "mysql", "mariadb")


def _timestamp() -> TypeEngine[datetime]:
    # MySQL's DATETIME keeps whole seconds unless told otherwise; the store writes UTC
    return DateTime(timezone=True).with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")


#: table options for MySQL (other dialects ignore mysql_* keywords)
_MYSQL_TABLE: Final[dict[str, Any]] = {"mysql_engine": "InnoDB", "mysql_charset": "utf8mb4",
                       "mysql_row_format": "DYNAMIC"}

metadata = MetaData()

state_variable = Table(
    STATE_TABLE,
    metadata,
    Column("owner", _name(), primary_key=True),
    Column("key", _name(), primary_key=True),
    Column("value", _json_text(), nullable=True),
    Column("version", BigInteger, nullable=False),
    Column("prev_version", BigInteger, nullable=False),
    Column("updated_at", _timestamp(), nullable=False),
    Column("updated_by", _name(), nullable=False),
    Column("writer", String(64), nullable=True),
    **_MYSQL_TABLE,
)

owner_claim = Table(
    CLAIM_TABLE,
    metadata,
    Column("owner", _name(), primary_key=True),
    Column("epoch", BigInteger, nullable=False),
    Column("claimant", _name(), nullable=False),
    Column("claimed_at", _timestamp(), nullable=False),
    Column("writer", String(64), nullable=True),
    **_MYSQL_TABLE,
)


def _fleet_table(meta: MetaData, names: str | None) -> Table:
    return Table(
        FLEET_TABLE,
        meta,
        Column("triggerer", _name(names), primary_key=True),
        Column("host", _name(names), nullable=False),
        Column("pid", Integer, nullable=False),
        Column("last_flush_at", _timestamp(), nullable=False),
        Column("dirty_keys", BigInteger, nullable=False),
        Column("oldest_unflushed_at", _timestamp(), nullable=True),
        Column("rows_per_s", Float, nullable=False),
        Column("flush_interval", Float, nullable=False),
        **_MYSQL_TABLE,
    )


fleet = _fleet_table(metadata, None)


def _event_table(meta: MetaData, names: str | None) -> Table:
    return Table(
        EVENT_TABLE,
        meta,
        Column("owner", _name(names), primary_key=True),
        Column("key", _name(names), primary_key=True),
        Column("seq", BigInteger, nullable=False),  # its place in its cache file's emit order
        Column("writer", String(64), nullable=True),  # that cache file (`LocalCache.writer_id`)
        Column("epoch", BigInteger, nullable=False),  # the claim epoch it was committed under
        Column("asset_events", Integer, nullable=False),  # the asset events it made
        Column("committed_at", _timestamp(), nullable=False, index=True),
        **_MYSQL_TABLE,
    )


event = _event_table(metadata, None)


def _history_table(meta: MetaData, names: str | None) -> Table:
    return Table(
        HISTORY_TABLE,
        meta,
        # the order rows were written in; SQLite autoincrements an INTEGER primary key only
        Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True,
               autoincrement=True),
        Column("owner", _name(names), nullable=False),
        Column("kind", String(16), nullable=False),  # watermark, event or claim
        Column("at", _timestamp(), nullable=False),
        Column("key", _name(names), nullable=True),  # the state key or the event's key
        Column("value", _json_text(), nullable=True),  # a watermark's value (NULL: deleted)
        Column("version", BigInteger, nullable=True),  # a watermark's central version
        Column("outcome", String(16), nullable=True),  # an event's: committed, duplicate, ...
        Column("asset_event", BigInteger, nullable=True),  # the Airflow asset event it made
        Column("epoch", BigInteger, nullable=True),  # a claim's epoch, an event's claim epoch
        Column("triggerer", _name(names), nullable=True),  # updated_by, or the claimant
        Column("writer", String(64), nullable=True),  # the local cache file that wrote it
        Index("localstate_history_owner", "owner", "id"),
        Index("localstate_history_at", "at"),
        **_MYSQL_TABLE,
    )


history = _history_table(metadata, None)

schema_table = Table(
    "localstate_schema",
    metadata,
    Column("version", Integer, primary_key=True),
    Column("description", String(200), nullable=False),
    Column("applied_at", _timestamp(), nullable=False),
    **_MYSQL_TABLE,
)


@dataclass(frozen=True)
class Migration:
    version: int
    description: str
    apply: Callable[[Connection], None]


def _v1_create_state_variable(conn: Connection) -> None:
    # Pinned DDL: later migrations alter this, they never re-create it from `state_variable`.
    # checkfirst: MySQL commits DDL at once, so a crash before the migration's row was written
    # leaves the table without its row; the next upgrade applies this again.
    pinned = MetaData()
    names = name_collation(conn.dialect)
    Table(
        _STATE_TABLE_BEFORE_7,
        pinned,
        Column("owner", _name(names), primary_key=True),
        Column("key", _name(names), primary_key=True),
        Column("value", _json_text(), nullable=True),
        Column("version", BigInteger, nullable=False),
        Column("prev_version", BigInteger, nullable=False),
        Column("updated_at", _timestamp(), nullable=False),
        Column("updated_by", _name(names), nullable=False),
        **_MYSQL_TABLE,
    ).create(conn, checkfirst=True)


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
        conn.execute(text(
            f"ALTER TABLE {_STATE_TABLE_BEFORE_7} SET (fillfactor = {FILLFACTOR})"))


def _v3_state_variable_writer(conn: Connection) -> None:
    # The identity of the write itself: a flush recognises a replay of its own file's chain by
    # it, not by updated_by (which restarts and misconfigured hosts share). Rows written
    # before this migration have none: their replays are settled by the conflict policy.
    table = _STATE_TABLE_BEFORE_7
    if "writer" in {c["name"] for c in inspect(conn).get_columns(table)}:
        return  # MySQL commits DDL at once: a crash before this migration's row was written
    # ids are ASCII (hex); on MySQL compared byte-wise, as everywhere else
    column = ("VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin"
              if conn.dialect.name in ("mysql", "mariadb") else "VARCHAR(64)")
    conn.execute(text(f"ALTER TABLE {table} ADD COLUMN writer {column}"))


def _v4_create_owner_claim(conn: Connection) -> None:
    # Pinned DDL, as in v1; checkfirst for MySQL's DDL that commits at once.
    pinned = MetaData()
    names = name_collation(conn.dialect)
    Table(
        CLAIM_TABLE,
        pinned,
        Column("owner", _name(names), primary_key=True),
        Column("epoch", BigInteger, nullable=False),
        Column("claimant", _name(names), nullable=False),
        Column("claimed_at", _timestamp(), nullable=False),
        # ids are ASCII (hex); on MySQL compared byte-wise, as the state table's writer
        Column("writer", String(64).with_variant(
            mysql.VARCHAR(64, charset="ascii", collation="ascii_bin"), "mysql", "mariadb"),
            nullable=True),
        **_MYSQL_TABLE,
    ).create(conn, checkfirst=True)


def _v5_create_fleet(conn: Connection) -> None:
    # Pinned here, where the model is still this one; checkfirst as in v5.
    _fleet_table(MetaData(), name_collation(conn.dialect)).create(conn, checkfirst=True)


def _v6_create_event(conn: Connection) -> None:
    # Pinned here, where the model is still this one; checkfirst as in v5.
    _event_table(MetaData(), name_collation(conn.dialect)).create(conn, checkfirst=True)


def _v7_fence_earlier_releases(conn: Connection) -> None:
    # See the module docstring: the rule of every migration.
    # 1. The rows of releases that wrote no writer id keep their identity (updated_by):
    #    marked, a file's own earlier flush is recognised as its own after the upgrade instead
    #    of becoming a conflict (`localstate._sync.central.fenced_write`, 4). Rows a current process
    #    wrote with no file behind it (writer NULL) become such rows too: they were written
    #    under that updated_by, the identity every release before writer ids fenced on.
    # 2. The rename: a process of an earlier release, still running, fails every statement
    #    from now on (it never re-reads the schema), instead of writing past claims it does
    #    not know. PostgreSQL's rename waits for its flush in progress (ACCESS EXCLUSIVE).
    tables = set(inspect(conn).get_table_names())
    if _STATE_TABLE_BEFORE_7 not in tables:
        return  # MySQL commits DDL at once: renamed before this migration's row was written
    conn.execute(text(f"UPDATE {_STATE_TABLE_BEFORE_7} SET writer = :w WHERE writer IS NULL"),
                 {"w": LEGACY_WRITER})
    rename = ("RENAME TABLE {old} TO {new}" if conn.dialect.name in ("mysql", "mariadb")
              else "ALTER TABLE {old} RENAME TO {new}")
    conn.execute(text(rename.format(old=_STATE_TABLE_BEFORE_7, new=STATE_TABLE)))


def _v8_create_history(conn: Connection) -> None:
    # Pinned here, where the model is still this one; checkfirst as in v5. No fence: the table
    # is a record, not a condition of any write. A process of the release before, still
    # running, keeps flushing correctly and only leaves no history rows (its flushes are
    # missing from the record until it restarts on this release); nothing it writes can
    # corrupt a row written here, since it never names this table.
    _history_table(MetaData(), name_collation(conn.dialect)).create(conn, checkfirst=True)


MIGRATIONS: Final[tuple[Migration, ...]] = (
    Migration(1, "create localstate_state_variable", _v1_create_state_variable),
    Migration(2, "state table fillfactor for HOT updates", _v2_state_variable_fillfactor),
    Migration(3, "state table writer column", _v3_state_variable_writer),
    Migration(4, "owner claim epochs", _v4_create_owner_claim),
    Migration(5, "fleet of triggerers", _v5_create_fleet),
    Migration(6, "events committed with watermarks", _v6_create_event),
    Migration(7, "earlier releases' rows marked, their writers fenced out",
              _v7_fence_earlier_releases),
    Migration(8, "history of each owner's watermarks, events and claims", _v8_create_history),
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


@contextlib.asynccontextmanager
async def _mysql_lock(conn: AsyncConnection, url: str) -> AsyncIterator[None]:
    """On MySQL, hold the named lock ``GET_LOCK`` takes (a session lock: released here, or by
    the server when the connection ends) around the migrating transactions; elsewhere nothing.

    Taken and released outside any transaction of `conn`, so the caller's transaction commits
    before the lock goes: released first, a waiting process would read the schema version
    before the insert recording the migration committed, apply it again and fail on that
    insert's primary key (seen in CI: "Duplicate entry '5' for key 'PRIMARY'")."""
    if conn.dialect.name != "mysql":
        yield
        return
    got = (await conn.execute(text("SELECT GET_LOCK(:n, :s)"),
                              {"n": _MYSQL_LOCK, "s": _MYSQL_LOCK_WAIT_S})).scalar()
    await conn.commit()  # end the transaction the SELECT began; the lock is the session's
    if got != 1:
        raise SchemaError(f"the central DB {url}: another process held the schema upgrade lock "
                          f"for over {_MYSQL_LOCK_WAIT_S} s; try again")
    try:
        yield
    finally:
        await conn.execute(text("SELECT RELEASE_LOCK(:n)"), {"n": _MYSQL_LOCK})
        await conn.commit()


async def upgrade(engine: AsyncEngine) -> list[Migration]:
    """Apply every missing migration; return those applied (empty when up to date).

    Logs one INFO line naming the versions applied, whichever entry point upgraded (a store's
    open, the CLI, the API server): a schema never changes unannounced."""
    url = engine.url.render_as_string(hide_password=True)
    applied = await _apply_missing(engine, url)
    if applied:
        announce(url, applied)
    return applied


def announce(url: str, applied: list[Migration]) -> None:
    """The one log line of a central schema upgrade."""
    log.info("upgraded the localstate schema of the central DB %s from version %d to %d: %s",
             url, applied[0].version - 1, applied[-1].version,
             "; ".join(f"{m.version} {m.description}" for m in applied))


async def _apply_missing(engine: AsyncEngine, url: str) -> list[Migration]:
    applied: list[Migration] = []
    while True:
        async with engine.connect() as conn, _mysql_lock(conn, url), conn.begin():
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


def apply_step(conn: Connection, version: int) -> bool:
    """Apply migration `version` on a synchronous connection, in its transaction, unless the
    schema has it already; True when applied.

    The step of the Alembic revision of each migration (`localstate.airflow._migrations`, run by
    ``airflow db migrate``): the same function `upgrade` applies, and the same row in
    ``localstate_schema``, so a database migrated by either path is current for the other
    (``localstate_schema`` is the one record of what was applied; Alembic's version table only
    says how far ``airflow db migrate`` went). Takes `upgrade`'s lock on PostgreSQL, so a
    triggerer upgrading at the same moment waits, then finds the step applied.
    """
    if conn.dialect.name == "postgresql":
        conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _LOCK_KEY})
    schema_table.create(conn, checkfirst=True)
    have = int(conn.execute(select(func.max(schema_table.c.version))).scalar() or 0)
    if have >= version:
        return False
    url = conn.engine.url.render_as_string(hide_password=True)
    if have != version - 1:
        raise SchemaError(f"the central DB {url} has localstate schema version {have}: "
                          f"migration {version} needs {version - 1} first")
    migration = next(m for m in MIGRATIONS if m.version == version)
    migration.apply(conn)
    conn.execute(schema_table.insert().values(
        version=migration.version, description=migration.description,
        applied_at=datetime.now(timezone.utc)))
    announce(url, [migration])
    return True
