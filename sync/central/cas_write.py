"""The compare-and-set write on the central DB: one conditional statement in the caller's
transaction (`CentralStore.write_if_version` owns the engine, the transaction and the counters).

Invariant: the check of the expected version and the write are one statement, so no other
writer slips in between; a record at another version is left as it is and reported by
`VersionConflict`. A CAS write records the writer id it is given: a store's own (its cache
file's, so a later flush of that file sees its own chain; see
`localstate._sync.central.fenced_write`), or None for a writer with no file (the CLI, the REST API).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import update
from sqlalchemy.dialects import postgresql as pg_dialect
from sqlalchemy.dialects import sqlite as sqlite_dialect
from sqlalchemy.ext.asyncio import AsyncConnection

from localstate._core.model import MAX_VERSION
from localstate._sync.central.dialects import BatchSql
from localstate._sync.central.fenced_write import select_rows
from localstate._sync.central.schema import state_variable
from localstate.errors import InvalidInput, VersionConflict, VersionExhausted

__all__ = ["check_expected_version", "compare_and_set"]


def check_expected_version(expected_version: object) -> int:
    """`expected_version` as an int from 0 to `MAX_VERSION`, or `InvalidInput`."""
    if isinstance(expected_version, bool) or not isinstance(expected_version, int) or not (
        0 <= expected_version <= MAX_VERSION
    ):
        # beyond 64 bits the drivers raise OverflowError (a crash, not an answer)
        raise InvalidInput(f"expected_version must be an int from 0 to {MAX_VERSION}, "
                           f"not {expected_version!r}")
    return expected_version


async def compare_and_set(
    conn: AsyncConnection, sql: BatchSql, dialect: str, owner: str, key: str,
    value: str | None, expected_version: int, when: datetime, updated_by: str,
    writer: str | None = None,
) -> int:
    """Write `value` (None: a tombstone) to `key` of `owner` if its central record is at
    `expected_version` (0: no value, never written or deleted); return the new version, or
    raise `VersionConflict` naming the version it is at, having written nothing."""
    t = state_variable.c
    stmt: Any = None  # where the dialect has RETURNING: the write, giving the new version
    if sql.direct_version is not None:
        pass  # MySQL: no RETURNING, see _write_returning_nothing
    elif expected_version == 0:
        insert = (pg_dialect.insert if dialect == "postgresql"
                  else sqlite_dialect.insert)(state_variable)
        stmt = insert.values(
            owner=owner, key=key, value=value, version=1, prev_version=0, updated_at=when,
            updated_by=updated_by, writer=writer,
        )
        stmt = stmt.on_conflict_do_update(
            index_elements=[t.owner, t.key],
            set_={"value": stmt.excluded.value, "version": t.version + 1,
                  "prev_version": t.version, "updated_at": stmt.excluded.updated_at,
                  "updated_by": stmt.excluded.updated_by, "writer": stmt.excluded.writer},
            where=t.value.is_(None),
        ).returning(t.version)
    else:
        stmt = (
            update(state_variable)
            .where(t.owner == owner, t.key == key, t.version == expected_version,
                   t.value.is_not(None))
            .values(value=value, version=t.version + 1, prev_version=t.version,
                    updated_at=when, updated_by=updated_by, writer=writer)
            .returning(t.version)
        )
    version = (
        (await conn.execute(stmt)).scalar_one_or_none() if stmt is not None
        else await _write_returning_nothing(
            conn, sql, owner, key, value, expected_version, when, updated_by, writer))
    if version is not None and (not isinstance(version, int) or version > MAX_VERSION):
        # SQLite's version + 1 past the ceiling is a REAL, not an error: the caller's
        # transaction rolls back on this
        raise VersionExhausted.at_ceiling(owner, key)
    if version is None:
        current = (await select_rows(conn, sql, [(owner, key)], lock=False)).get((owner, key))
        actual = 0 if current is None or current.data is None else current.version
        raise VersionConflict(
            f"owner {owner!r} key {key!r} is at version {actual} in the central DB, "
            f"not {expected_version}; nothing was written",
            expected=expected_version, actual=actual,
        )
    return int(version)


async def _write_returning_nothing(
    conn: AsyncConnection, sql: BatchSql, owner: str, key: str, value: str | None,
    expected_version: int, when: datetime, updated_by: str, writer: str | None,
) -> int | None:
    """`compare_and_set`'s write without RETURNING (MySQL): the new version, None if the
    record was not at `expected_version`. The row count tells (CLIENT_FOUND_ROWS off:
    0 when the condition kept the row as it was); the row stays locked by the write, so
    the version read back is the one written."""
    params = {"owner": owner, "key": key, "value": value,
              "at": sql.timestamp(when.timestamp()), "by": updated_by, "writer": writer}
    if expected_version == 0:
        assert sql.cas_insert is not None
        assert sql.direct_version is not None
        if (await conn.execute(sql.cas_insert, params)).rowcount == 0:
            return None
        return int((await conn.execute(sql.direct_version, params)).scalar_one())
    t = state_variable.c
    result = await conn.execute(
        update(state_variable)
        .where(t.owner == owner, t.key == key, t.version == expected_version,
               t.value.is_not(None))
        .values(value=value, version=t.version + 1, prev_version=t.version,
                updated_at=params["at"], updated_by=updated_by, writer=writer))
    return expected_version + 1 if result.rowcount == 1 else None
