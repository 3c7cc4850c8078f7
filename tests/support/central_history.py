"""Every write the central DB ever took, recorded by the database itself.

`install` puts a trigger on ``localstate_state`` (PostgreSQL, MySQL, SQLite) that appends
each row an INSERT or UPDATE leaves, ``(owner, key, value, version, prev_version, updated_by)``,
to ``fault_history`` under an increasing id. A write the flush's fence refused changes no row,
so it leaves no history (on MySQL the fence's ``IF()``s rewrite a refused row with its own values:
the trigger skips an update that changed nothing). For one key, row locks (PostgreSQL, MySQL)
or the database write lock
(SQLite) serialize the writes, so the ids of a key's rows are in the order the writes took
effect: the evidence the fault tests check monotonic watermarks and reported conflicts against,
without trusting the store's own counters.
"""

from __future__ import annotations

import contextlib
import itertools
import sqlite3
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import asyncpg
from sqlalchemy import select
from sqlalchemy.engine import make_url

from localstate._cache.entry import StateKey
from localstate._core.codec import decode
from localstate._sync.central.central_store import CentralStore
from localstate._sync.central.engine import make_engine
from localstate._sync.central.schema import state_variable

__all__ = [
    "ClaimEvent", "HistoryRow", "by_key", "current_rows", "install", "install_claims", "read",
    "read_claims", "regressions",
]

_PG_INSTALL = """
CREATE TABLE fault_history (
    id bigserial PRIMARY KEY, owner text NOT NULL, "key" text NOT NULL, value text,
    version bigint NOT NULL, prev_version bigint NOT NULL, updated_by text NOT NULL);
CREATE FUNCTION fault_history_append() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO fault_history (owner, "key", value, version, prev_version, updated_by)
    VALUES (NEW.owner, NEW."key", NEW.value, NEW.version, NEW.prev_version, NEW.updated_by);
    RETURN NEW;
END $$;
CREATE TRIGGER fault_history_append AFTER INSERT OR UPDATE ON localstate_state
    FOR EACH ROW EXECUTE FUNCTION fault_history_append();
"""
_SQLITE_INSTALL = [
    'CREATE TABLE fault_history (id INTEGER PRIMARY KEY AUTOINCREMENT, owner TEXT NOT NULL, '
    '"key" TEXT NOT NULL, value TEXT, version INTEGER NOT NULL, prev_version INTEGER NOT NULL, '
    "updated_by TEXT NOT NULL)",
] + [
    f"CREATE TRIGGER fault_history_{event.lower()} AFTER {event} ON localstate_state "
    'BEGIN INSERT INTO fault_history (owner, "key", value, version, prev_version, updated_by) '
    'VALUES (NEW.owner, NEW."key", NEW.value, NEW.version, NEW.prev_version, NEW.updated_by); '
    "END"
    for event in ("INSERT", "UPDATE")
]
_MY_COLUMNS = "owner, `key`, value, version, prev_version, updated_by"
_MY_NEW = "NEW.owner, NEW.`key`, NEW.value, NEW.version, NEW.prev_version, NEW.updated_by"
_MYSQL_INSTALL = [
    "CREATE TABLE fault_history (id BIGINT AUTO_INCREMENT PRIMARY KEY, "
    "owner VARCHAR(250) NOT NULL, `key` VARCHAR(250) NOT NULL, value LONGTEXT, "
    "version BIGINT NOT NULL, prev_version BIGINT NOT NULL, updated_by VARCHAR(250) NOT NULL) "
    "CHARACTER SET utf8mb4 COLLATE utf8mb4_bin",
    "CREATE TRIGGER fault_history_insert AFTER INSERT ON localstate_state "
    f"FOR EACH ROW INSERT INTO fault_history ({_MY_COLUMNS}) VALUES ({_MY_NEW})",
    "CREATE TRIGGER fault_history_update AFTER UPDATE ON localstate_state "
    "FOR EACH ROW BEGIN IF NOT (NEW.version <=> OLD.version AND NEW.value <=> OLD.value "
    "AND NEW.prev_version <=> OLD.prev_version AND NEW.updated_by <=> OLD.updated_by "
    "AND NEW.updated_at <=> OLD.updated_at) THEN "
    f"INSERT INTO fault_history ({_MY_COLUMNS}) VALUES ({_MY_NEW}); END IF; END",
]
# Claims, numbered from the history's own sequence (PostgreSQL): a flush holds a share lock
# on its owner's claim row from before its first write of that owner until it commits, and a
# claim updates the row (an exclusive lock), so for one owner each claim's id falls between
# the ids of the flushes that went in before it and of those after it.
_PG_CLAIMS = """
CREATE TABLE fault_claims (id bigint PRIMARY KEY, owner text NOT NULL, epoch bigint NOT NULL,
    claimant text NOT NULL);
CREATE FUNCTION fault_claims_append() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO fault_claims VALUES (nextval('fault_history_id_seq'), NEW.owner, NEW.epoch,
                                     NEW.claimant);
    RETURN NEW;
END $$;
CREATE TRIGGER fault_claims_append AFTER INSERT OR UPDATE ON localstate_owner_claim
    FOR EACH ROW EXECUTE FUNCTION fault_claims_append();
"""
_SELECT = (
    'SELECT id, owner, "key", value, version, prev_version, updated_by FROM fault_history '
    "ORDER BY id"
)


@dataclass(frozen=True)
class HistoryRow:
    id: int
    owner: str
    key: str
    value: str | None  # JSON text; None: a deletion
    version: int
    prev_version: int
    updated_by: str

    @property
    def decoded(self) -> Any:
        return None if self.value is None else decode(self.value)


@dataclass(frozen=True)
class ClaimEvent:
    id: int
    owner: str
    epoch: int
    claimant: str


def _sqlite_path(url: str) -> str:
    database = make_url(url).database
    assert database, url
    return database


def _dsn(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


async def install(url: str) -> None:
    """Create the central schema (as a store's open would) and the history trigger."""
    await (await CentralStore.open(url)).close()
    if make_url(url).get_backend_name() == "mysql":
        engine = make_engine(url)
        try:
            async with engine.begin() as my_conn:
                for statement in _MYSQL_INSTALL:
                    await my_conn.exec_driver_sql(statement)
        finally:
            await engine.dispose()
        return
    if make_url(url).get_backend_name() == "sqlite":
        with contextlib.closing(sqlite3.connect(_sqlite_path(url))) as conn, conn:
            for statement in _SQLITE_INSTALL:
                conn.execute(statement)
        return
    conn = await asyncpg.connect(_dsn(url))
    try:
        await conn.execute(_PG_INSTALL)
    finally:
        await conn.close()


async def read(url: str) -> list[HistoryRow]:
    """Every row the central table ever held, in the order the writes took effect."""
    if make_url(url).get_backend_name() == "mysql":
        engine = make_engine(url)
        try:
            async with engine.connect() as my_conn:
                result = await my_conn.exec_driver_sql(_SELECT.replace('"key"', "`key`"))
                rows: list[tuple[Any, ...]] = [tuple(row) for row in result]
                return [HistoryRow(*row) for row in rows]
        finally:
            await engine.dispose()
    if make_url(url).get_backend_name() == "sqlite":
        with contextlib.closing(sqlite3.connect(_sqlite_path(url), timeout=30)) as conn:
            return [HistoryRow(*row) for row in conn.execute(_SELECT)]
    conn = await asyncpg.connect(_dsn(url))
    try:
        return [HistoryRow(*row) for row in await conn.fetch(_SELECT)]
    finally:
        await conn.close()


async def install_claims(url: str) -> None:
    """On PostgreSQL, after `install`: record every claim in ``fault_claims``, numbered in
    the history's order."""
    assert make_url(url).get_backend_name() == "postgresql", url
    conn = await asyncpg.connect(_dsn(url))
    try:
        await conn.execute(_PG_CLAIMS)
    finally:
        await conn.close()


async def read_claims(url: str) -> list[ClaimEvent]:
    """Every claim the central DB took, in history order (`install_claims`)."""
    conn = await asyncpg.connect(_dsn(url))
    try:
        return [ClaimEvent(*row) for row in await conn.fetch(
            "SELECT id, owner, epoch, claimant FROM fault_claims ORDER BY id")]
    finally:
        await conn.close()


async def current_rows(url: str, owner_prefix: str) -> list[tuple[str, str, str, int]]:
    """(owner, key, value, version) of the central rows of owners starting with the prefix,
    read with a plain query (not through the store under test)."""
    t = state_variable.c
    engine = make_engine(url)
    try:
        async with engine.connect() as conn:
            result = await conn.execute(select(t.owner, t.key, t.value, t.version)
                                        .where(t.owner.startswith(owner_prefix)))
            return [(r[0], r[1], r[2], int(r[3])) for r in result]
    finally:
        await engine.dispose()


def by_key(history: list[HistoryRow]) -> dict[StateKey, list[HistoryRow]]:
    keyed: dict[StateKey, list[HistoryRow]] = defaultdict(list)
    for row in history:
        keyed[row.owner, row.key].append(row)
    return dict(keyed)


def regressions(history: list[HistoryRow], *, values: bool) -> list[str]:
    """Where a key's central version went down, or (`values`) its value went down.

    A version may repeat only as a replay: the same writer rewriting its own version (a flush
    that committed but whose mark-clean a crash lost, sent again by the restarted process).
    """
    found: list[str] = []
    for k, rows in by_key(history).items():
        for before, after in itertools.pairwise(rows):
            replay = after.version == before.version and after.updated_by == before.updated_by
            if after.version <= before.version and not replay:
                found.append(f"{k}: version {before.version} -> {after.version} "
                             f"(history ids {before.id}, {after.id})")
            if values and after.decoded < before.decoded:
                found.append(f"{k}: value {before.value} -> {after.value} by "
                             f"{after.updated_by} (history ids {before.id}, {after.id})")
    return found
