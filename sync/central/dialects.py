"""The only dialect-specific SQL: a many-row conditional upsert, a many-key lookup, the
byte-wise collation that every ordered or range read over owner and key uses, and the fleet
row a flush records (`fleet_statement`, or inside the upsert: `upsert_with_fleet`).

Both dialects get one statement with a fixed number of parameters however many rows it carries,
so SQLAlchemy compiles it once and no driver parameter limit is ever reached:

* PostgreSQL: the rows travel as one JSON array and are spread out by
  ``jsonb_array_elements`` (measured faster than one array per column through ``unnest``,
  itself 1.7× asyncpg's executemany of the same rows);
* SQLite: the rows travel as one JSON array and are spread out by ``json_each``;
* MySQL (8.0+, MariaDB 10.6+): the rows travel as one JSON array and are spread out by
  ``JSON_TABLE`` (see `_MysqlSql` for its fence and its row count).

The upsert's ``WHERE`` is the fence: a row replaces the central one only when the central
version is the one the write was based on (``prev_version``), or when the central row was
written by the same local cache file (``writer``) at a version above that base and no higher
than this write's: a write of this file's own chain whose outcome it never recorded (see
`localstate._sync.central.fenced_write` for why that is sound). Rows the ``WHERE`` refuses are not
counted in the statement's row count; when it falls short, the caller looks up which rows they
were (the conflicts). The writer travels once per statement (``:writer``), not once per row.
No RETURNING: on the common path (no conflict) decoding one returned row per written row cost
more than the write.

The claim fence (`CentralStore.claim`): each row carries the claim epoch its writer holds on
the owner, and the upsert's ``SELECT`` keeps only rows whose epoch is at least the owner's
epoch in the claim table (0 when the owner has no claim row), or that come from the local
cache file that made the current claim (``writer``: its own writes, whichever process on the
file made them, e.g. before a restart), whatever the version fence and the policy would say;
the rows it drops are refused like the version fence's, and the caller tells them apart by
the claim table. The claim row is read with a share lock (PostgreSQL,
MySQL; SQLite's write lock serializes everything): a claim waits for a flush that read the
old epoch to commit, and a flush waits for a claim in progress and then sees its epoch. So
every write is ordered before or after each claim, and none of a lower epoch goes in after it.

Order: owners and keys are ordered and compared byte-wise (their UTF-8 bytes) on every
backend, never by the database's default collation, which in a real installation is a
language's (ICU ``en-US``, libc ``en_US.UTF-8``: ``a`` < ``B`` < ``b``, and
``asset:294`` < ``Asset/039``) and differs from one database to the next. Keyset pagination
is only correct when the SQL ``ORDER BY``, the cursor's ``>`` and Python's ``sorted()``
agree; UTF-8 byte order is code-point order, which is how Python compares ``str`` (names
hold no lone surrogates: `localstate._core.model.check_name` refuses them), so Python needs no key
function.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timezone
from functools import cache
from typing import Any, Final

import orjson
from sqlalchemy import ColumnElement, TextClause, text

from localstate._cache.entry import StateKey
from localstate._sync.central.fleet import FleetStatus
from localstate._sync.central.schema import (
    CLAIM_TABLE,
    FLEET_TABLE,
    HISTORY_TABLE,
    MARIADB_NAME_COLLATION,
    MYSQL_NAME_COLLATION,
    STATE_TABLE,
)

__all__ = [
    "BatchSql",
    "batch_sql_for",
    "claim_many",
    "claim_with_history",
    "event_history_insert",
    "fleet_params",
    "fleet_statement",
    "prefix_upper_bound",
    "upsert_with_fleet",
    "upsert_with_history",
]

_SET: Final = (
    'value = EXCLUDED.value, version = EXCLUDED.version, prev_version = EXCLUDED.prev_version, '
    'updated_at = EXCLUDED.updated_at, updated_by = EXCLUDED.updated_by, '
    'writer = EXCLUDED.writer'
)
_FENCE: Final = (
    "{t}.version = EXCLUDED.prev_version OR ({t}.writer = EXCLUDED.writer "
    "AND {t}.version > EXCLUDED.prev_version AND {t}.version <= EXCLUDED.version)"
)
_COLUMNS: Final = 'owner, "key", value, version, prev_version, updated_at, updated_by, writer'
# a direct write (the cache off, a compare-and-set on the central DB) records the writer id it
# is given: the store's own (its cache file's, so that a later flush of that file sees its own
# chain), or NULL for a writer with no file (the CLI, the REST API)
_DIRECT_COLUMNS: Final = (
    'owner, "key", value, version, prev_version, updated_at, updated_by, writer')

#: one row for the upsert: owner, key, value text, version, prev_version, updated_at, by,
#: claim epoch
UpsertRow = tuple[str, str, str | None, int, int, float, str, int]


class BatchSql:
    """Statements and parameter packing for one dialect."""

    upsert: TextClause
    select_keys: TextClause
    select_keys_locked: TextClause
    #: one unconditional write (the cache-off path): params owner, key, value, at, by
    direct_upsert: TextClause
    #: where `direct_upsert` returns nothing (no RETURNING): the written row's version, read
    #: back in the same transaction (params owner, key)
    direct_version: TextClause | None = None
    #: with `direct_version`: a first write of a key, or over its tombstone, as one statement
    #: (`CentralStore.write_if_version` at expected version 0; params as `direct_upsert`)
    cas_insert: TextClause | None = None
    #: bump an owner's claim epoch (1 for a first claim): params owner, by, at, writer; returns
    #: the epoch unless `claim_epoch` is set (no RETURNING: read it back in the transaction)
    claim: TextClause
    claim_epoch: TextClause | None = None
    #: whether concurrent flushes take row locks, so that the order of a batch's rows is the
    #: order they lock in (`localstate._sync.central.fenced_write` sorts them); False where the
    #: transaction's write lock serializes whole flushes (SQLite's BEGIN IMMEDIATE)
    row_locks: bool = True

    def upsert_complete(self, rowcount: int, rows: Sequence[UpsertRow]) -> bool:
        """Whether `upsert`'s row count proves every row went through the fence (False: look
        the rows up). PostgreSQL and SQLite count exactly the rows written."""
        return rowcount == len(rows)

    #: the collation that compares text by its UTF-8 bytes (MySQL's would be utf8mb4_bin);
    #: None where owner and key compare byte-wise in every database of the dialect already
    bytewise_collation: str | None

    def bytewise(self, column: ColumnElement[str]) -> ColumnElement[str]:
        """`column` compared and ordered byte-wise, whatever the database's own collation.

        Equality needs none: a PostgreSQL database's default collation is deterministic
        (equal only when byte-equal), SQLite's is BINARY. A MySQL dialect must declare the
        columns binary (``utf8mb4_bin``): its default collation is case-insensitive, which
        would make ``Asset`` and ``asset`` one primary key.
        """
        if self.bytewise_collation is None:
            return column
        return column.collate(self.bytewise_collation)

    def timestamp(self, ts: float) -> Any:
        """A POSIX time as this dialect's driver takes `updated_at`."""
        raise NotImplementedError

    def upsert_params(self, rows: Sequence[UpsertRow], writer: str | None) -> dict[str, Any]:
        raise NotImplementedError

    def key_params(self, keys: Sequence[StateKey]) -> dict[str, Any]:
        raise NotImplementedError


class _PostgresSql(BatchSql):
    bytewise_collation = "C"
    # The rows travel as one JSON array, spread out by jsonb_array_elements, as on SQLite.
    # Measured against one array per column through unnest (10,000 rows): 15-20 % less time,
    # since asyncpg checks and encodes every element of seven arrays in Python, while one
    # string goes as it is and PostgreSQL parses it in C. updated_at travels as epoch seconds
    # (to_timestamp): building and encoding 10,000 datetimes cost ~8 ms of such a flush.
    upsert = text(
        f"INSERT INTO {STATE_TABLE} AS t ({_COLUMNS}) "
        "SELECT r->>0, r->>1, r->>2, (r->>3)::bigint, (r->>4)::bigint, "
        "to_timestamp((r->>5)::float8), r->>6, CAST(:writer AS TEXT) "
        "FROM jsonb_array_elements(CAST(:rows AS JSONB)) AS r "
        "WHERE (r->>7)::bigint >= COALESCE((SELECT CASE WHEN c.writer = CAST(:writer AS TEXT) "
        f"THEN 0 ELSE c.epoch END FROM {CLAIM_TABLE} AS c WHERE c.owner = r->>0 FOR SHARE), 0) "
        f'ON CONFLICT (owner, "key") DO UPDATE SET {_SET} WHERE {_FENCE.format(t="t")} '
    )
    _select = (
        f'SELECT t.owner, t."key", t.value, t.version, t.updated_at, t.updated_by, t.writer '
        f"FROM {STATE_TABLE} AS t JOIN unnest(CAST(:owners AS TEXT[]), CAST(:keys AS TEXT[])) "
        'AS k(owner, "key") ON t.owner = k.owner AND t."key" = k."key"'
    )
    select_keys = text(_select)
    # ORDER BY before FOR UPDATE: PostgreSQL locks the rows as the sort returns them, so
    # every flush locks its keys in one order and two flushes of the same keys queue rather
    # than deadlock (40P01); a hash join would otherwise lock in the table's physical order
    # and a nested loop in the order of the arrays.
    select_keys_locked = text(_select + ' ORDER BY t.owner, t."key" FOR UPDATE OF t')
    direct_upsert = text(
        f"INSERT INTO {STATE_TABLE} AS t ({_DIRECT_COLUMNS}) "
        "VALUES (:owner, :key, :value, 1, 0, :at, :by, :writer) "
        'ON CONFLICT (owner, "key") DO UPDATE SET value = EXCLUDED.value, '
        "version = t.version + 1, prev_version = t.version, "
        "updated_at = EXCLUDED.updated_at, updated_by = EXCLUDED.updated_by, "
        "writer = EXCLUDED.writer RETURNING t.version"
    )
    claim = text(
        f"INSERT INTO {CLAIM_TABLE} AS c (owner, epoch, claimant, claimed_at, writer) "
        "VALUES (:owner, 1, :by, :at, :writer) ON CONFLICT (owner) DO UPDATE SET "
        "epoch = c.epoch + 1, claimant = EXCLUDED.claimant, claimed_at = EXCLUDED.claimed_at, "
        "writer = EXCLUDED.writer RETURNING c.epoch"
    )

    def timestamp(self, ts: float) -> datetime:
        return datetime.fromtimestamp(ts, tz=timezone.utc)

    def upsert_params(self, rows: Sequence[UpsertRow], writer: str | None) -> dict[str, Any]:
        return {"rows": orjson.dumps(rows).decode(), "writer": writer}

    def key_params(self, keys: Sequence[StateKey]) -> dict[str, Any]:
        return {"owners": [k[0] for k in keys], "keys": [k[1] for k in keys]}


class _SqliteSql(BatchSql):
    # The columns are BINARY (declared without COLLATE; SQLite has no database-wide default to
    # change that), and so is every comparison with them. Naming it would only cost: SQLite
    # seeks `(owner, key) > (?, ?)` in the primary key only without an explicit COLLATE
    # (with one: a scan of the whole index for each page).
    bytewise_collation = None
    row_locks = False
    _cols = ", ".join(f"json_extract(j.value, '$[{i}]')" for i in range(7))
    # the claim fence's WHERE also keeps SQLite from reading ON CONFLICT as part of the join
    upsert = text(
        f"INSERT INTO {STATE_TABLE} ({_COLUMNS}) SELECT {_cols}, :writer "
        "FROM json_each(:rows) AS j "
        "WHERE json_extract(j.value, '$[7]') >= COALESCE((SELECT CASE WHEN c.writer = "
        f":writer THEN 0 ELSE c.epoch END FROM {CLAIM_TABLE} AS c "
        "WHERE c.owner = json_extract(j.value, '$[0]')), 0) "
        f'ON CONFLICT (owner, "key") DO UPDATE SET {_SET} '
        f"WHERE {_FENCE.format(t=STATE_TABLE)} "
    )
    claim = text(
        f"INSERT INTO {CLAIM_TABLE} (owner, epoch, claimant, claimed_at, writer) "
        "VALUES (:owner, 1, :by, :at, :writer) ON CONFLICT (owner) DO UPDATE SET "
        f"epoch = {CLAIM_TABLE}.epoch + 1, claimant = excluded.claimant, "
        "claimed_at = excluded.claimed_at, writer = excluded.writer RETURNING epoch"
    )
    # CROSS JOIN: SQLite keeps the left side as the outer loop, so each key is one PK lookup
    select_keys = text(
        'SELECT t.owner, t."key", t.value, t.version, t.updated_at, t.updated_by, t.writer '
        f"FROM json_each(:keys) AS j CROSS JOIN {STATE_TABLE} AS t "
        "ON t.owner = json_extract(j.value, '$[0]') AND t.\"key\" = json_extract(j.value, '$[1]')"
    )
    # the write lock of BEGIN IMMEDIATE already serializes every writer
    select_keys_locked = select_keys
    direct_upsert = text(
        f"INSERT INTO {STATE_TABLE} ({_DIRECT_COLUMNS}) "
        "VALUES (:owner, :key, :value, 1, 0, :at, :by, :writer) "
        'ON CONFLICT (owner, "key") DO UPDATE SET value = excluded.value, '
        f"version = {STATE_TABLE}.version + 1, prev_version = {STATE_TABLE}.version, "
        "updated_at = excluded.updated_at, updated_by = excluded.updated_by, "
        "writer = excluded.writer RETURNING version"
    )

    def timestamp(self, ts: float) -> str:
        # the text form SQLAlchemy's SQLite DateTime reads back
        return datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")

    def upsert_params(self, rows: Sequence[UpsertRow], writer: str | None) -> dict[str, Any]:
        packed = [(o, k, v, ver, prev, self.timestamp(at), by, epoch)
                  for o, k, v, ver, prev, at, by, epoch in rows]
        return {"rows": orjson.dumps(packed).decode(), "writer": writer}

    def key_params(self, keys: Sequence[StateKey]) -> dict[str, Any]:
        return {"keys": orjson.dumps(keys).decode()}


def _if_fenced(fence: str, columns: Sequence[str]) -> str:
    """MySQL's ``ON DUPLICATE KEY UPDATE`` list: each column takes the JSON row's value where
    `fence` holds, else keeps its own, assigned in the order given."""
    t = STATE_TABLE
    return ", ".join(f"{t}.{c} = IF({fence}, j.{c}, {t}.{c})" for c in columns)


class _MysqlSql(BatchSql):
    """MySQL 8.0+ and MariaDB 10.6+ (SQL both accept: no RETURNING, no row alias).

    The rows travel as one JSON array spread out by ``JSON_TABLE``, whose columns carry the
    table's own names, so the fence is `_FENCE` itself with the JSON row (``j``) in place of
    ``EXCLUDED``. MySQL has no ``ON DUPLICATE KEY UPDATE … WHERE``: each column is set to
    ``IF(fence, new, old)``. MySQL applies the assignments left to right, each later one
    seeing the columns already set, so the order is an invariant: the columns the fence reads
    from the central row (``writer``, then ``version``) are set last, ``version`` the very
    last. The others see the fence on the old row. ``writer`` changes only when the fence
    holds, and then to the value that keeps its clause true, so ``version`` sees the same
    verdict. A column added to `_FENCE` goes into `_FENCED_LAST`, before ``version``.

    The row count (the engine turns CLIENT_FOUND_ROWS off, `localstate._sync.central.engine`): 1 per
    row inserted, 2 per row updated, 0 per row left as it was (refused by the fence, or a
    replay identical to the central row). A row based on a central version (base > 0) that
    goes through updates an existing row and changes its version: 2. So a batch with no new
    key went through entirely iff the count is 2 per row; with new keys (base 0: 1 inserted,
    2 if it met a row, 0 refused) the count cannot tell and the caller looks the rows up.
    """

    _FENCED_LAST: Final = ("updated_by", "writer", "version")
    # the columns are declared in a binary NO PAD collation
    # (`localstate._sync.central.schema._name`), which orders and compares by the UTF-8 bytes:
    # naming it again would change nothing
    bytewise_collation = None

    def __init__(self, name_collation: str) -> None:
        """`name_collation`: the binary NO PAD collation of owners and keys on this server
        (`localstate._sync.central.schema.name_collation`); the JSON rows' names must have the
        table's, or MySQL refuses to compare them."""
        t = STATE_TABLE
        fence = _FENCE.format(t=STATE_TABLE).replace("EXCLUDED.", "j.")
        name = f"VARCHAR(250) CHARACTER SET utf8mb4 COLLATE {name_collation}"
        # updated_at travels as epoch seconds, FROM_UNIXTIME in the session's UTC (see the
        # engine): formatting 10,000 datetimes in Python cost more than parsing the JSON
        rows = (
            "(SELECT jt.owner, jt.`key`, jt.value, jt.version, jt.prev_version, "
            "FROM_UNIXTIME(jt.at) AS updated_at, jt.updated_by, "
            # the writer travels once per statement; ids are ASCII, compared byte-wise
            "CONVERT(:writer USING ascii) COLLATE ascii_bin AS writer FROM "
            "JSON_TABLE(:rows, '$[*]' COLUMNS ("
            f"owner {name} PATH '$[0]', `key` {name} PATH '$[1]', "
            "value LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$[2]', "
            "version BIGINT PATH '$[3]', prev_version BIGINT PATH '$[4]', "
            f"at DECIMAL(20, 6) PATH '$[5]', updated_by {name} PATH '$[6]', "
            "epoch BIGINT PATH '$[7]')) AS jt"
            # the claim fence: LOCK IN SHARE MODE (MySQL and MariaDB both take it), since a
            # READ COMMITTED INSERT ... SELECT reads other tables without locks
            " WHERE jt.epoch >= COALESCE((SELECT IF(c.writer = CONVERT(:writer USING ascii) "
            f"COLLATE ascii_bin, 0, c.epoch) FROM {CLAIM_TABLE} AS c "
            "WHERE c.owner = jt.owner LOCK IN SHARE MODE), 0)) AS j"
        )
        columns = "owner, `key`, value, version, prev_version, updated_at, updated_by"
        assign = _if_fenced(fence, ("value", "prev_version", "updated_at", *self._FENCED_LAST))
        self.upsert = text(
            f"INSERT INTO {t} ({columns}, writer) "
            "SELECT j.owner, j.`key`, j.value, j.version, j.prev_version, j.updated_at, "
            f"j.updated_by, j.writer FROM {rows} ON DUPLICATE KEY UPDATE {assign}"
        )
        keys = (
            "JSON_TABLE(:keys, '$[*]' COLUMNS ("
            f"owner {name} PATH '$[0]', `key` {name} PATH '$[1]')) AS k"
        )
        select = (
            "SELECT t.owner, t.`key`, t.value, t.version, t.updated_at, t.updated_by, t.writer "
            f"FROM {keys} JOIN {t} AS t ON t.owner = k.owner AND t.`key` = k.`key`"
        )
        self.select_keys = text(select)
        # InnoDB locks rows as the nested loop driven by JSON_TABLE meets them, in the order
        # of the array: `write_fenced` sorts the rows so that every flush locks in one order
        self.select_keys_locked = text(select + " FOR UPDATE")
        # prev_version takes the old version before version moves on (left to right)
        self.direct_upsert = text(
            f"INSERT INTO {t} ({columns}, writer) "
            "VALUES (:owner, :key, :value, 1, 0, :at, :by, :writer) "
            "ON DUPLICATE KEY UPDATE value = :value, prev_version = version, "
            "version = version + 1, updated_at = :at, updated_by = :by, writer = :writer"
        )
        self.direct_version = text(
            f"SELECT version FROM {t} WHERE owner = :owner AND `key` = :key")
        self.claim = text(
            f"INSERT INTO {CLAIM_TABLE} (owner, epoch, claimant, claimed_at, writer) "
            "VALUES (:owner, 1, :by, :at, :writer) ON DUPLICATE KEY UPDATE epoch = epoch + 1, "
            "claimant = :by, claimed_at = :at, writer = :writer")
        self.claim_epoch = text(f"SELECT epoch FROM {CLAIM_TABLE} WHERE owner = :owner")
        # a write over a tombstone only; `value` is read by every condition: set last
        self.cas_insert = text(
            f"INSERT INTO {t} ({columns}, writer) "
            "VALUES (:owner, :key, :value, 1, 0, :at, :by, :writer) "
            "ON DUPLICATE KEY UPDATE prev_version = IF(value IS NULL, version, prev_version), "
            "version = IF(value IS NULL, version + 1, version), "
            "updated_at = IF(value IS NULL, :at, updated_at), "
            "updated_by = IF(value IS NULL, :by, updated_by), "
            "writer = IF(value IS NULL, :writer, writer), "
            "value = IF(value IS NULL, :value, value)"
        )

    def upsert_complete(self, rowcount: int, rows: Sequence[UpsertRow]) -> bool:
        return rowcount == 2 * len(rows) and all(row[4] > 0 for row in rows)

    def timestamp(self, ts: float) -> str:
        # DATETIME(6) text in UTC (the session time zone is UTC, see the engine)
        return datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")

    def upsert_params(self, rows: Sequence[UpsertRow], writer: str | None) -> dict[str, Any]:
        return {"rows": orjson.dumps(rows).decode(), "writer": writer}

    def key_params(self, keys: Sequence[StateKey]) -> dict[str, Any]:
        return {"keys": orjson.dumps(keys).decode()}


_BY_DIALECT: Final[dict[str, BatchSql]] = {
    "postgresql": _PostgresSql(), "sqlite": _SqliteSql(),
    "mysql": _MysqlSql(MYSQL_NAME_COLLATION), "mariadb": _MysqlSql(MARIADB_NAME_COLLATION),
}


_MAX_CODE_POINT: Final = 0x10FFFF
_SURROGATES: Final = range(0xD800, 0xE000)


def prefix_upper_bound(prefix: str) -> str | None:
    """The least string above every string that starts with `prefix`, in byte-wise order.

    So ``prefix <= s < bound`` (byte-wise) holds exactly for the `s` starting with `prefix`:
    a prefix filter as a range, which an index on the column serves and in which no
    character is special (a ``LIKE`` pattern has ``%``, ``_`` and its escape character).
    None when no string is above them all (`prefix` is only U+10FFFF characters).
    """
    kept = prefix.rstrip(chr(_MAX_CODE_POINT))
    if not kept:
        return None
    nxt = ord(kept[-1]) + 1
    if nxt in _SURROGATES:  # not encodable: the next character is the first after them
        nxt = _SURROGATES.stop
    return kept[:-1] + chr(nxt)


def batch_sql_for(dialect: str) -> BatchSql:
    try:
        return _BY_DIALECT[dialect]
    except KeyError:
        raise NotImplementedError(
            f"central DB dialect {dialect!r} is not supported: use postgresql, mysql or sqlite"
        ) from None


# -- the fleet row of a flush (`localstate._sync.central.fleet`)
# --------------------------------------

_FLEET_COLUMNS: Final = ("triggerer, host, pid, last_flush_at, dirty_keys, "
                          "oldest_unflushed_at, rows_per_s, flush_interval")
_FLEET_UPDATE: Final = ("host", "pid", "last_flush_at", "dirty_keys", "oldest_unflushed_at",
                        "rows_per_s", "flush_interval")


def _fleet_values(dialect: str) -> str:
    if dialect == "postgresql":
        ts = "to_timestamp(CAST({} AS float8))"
    elif dialect in ("mysql", "mariadb"):
        ts = "FROM_UNIXTIME({})"
    else:
        ts = "{}"  # SQLite: the text form, packed by `fleet_params`
    return (f"(:f_id, :f_host, :f_pid, {ts.format(':f_at')}, :f_dirty, "
            f"{ts.format(':f_oldest')}, :f_rate, :f_interval)")


@cache
def fleet_statement(dialect: str) -> TextClause:
    """The fleet row's upsert as a statement of its own."""
    if dialect in ("mysql", "mariadb"):
        sets = ", ".join(f"{c} = VALUES({c})" for c in _FLEET_UPDATE)
        return text(f"INSERT INTO {FLEET_TABLE} ({_FLEET_COLUMNS}) VALUES {_fleet_values(dialect)} "
                    f"ON DUPLICATE KEY UPDATE {sets}")
    sets = ", ".join(f"{c} = excluded.{c}" for c in _FLEET_UPDATE)
    return text(f"INSERT INTO {FLEET_TABLE} ({_FLEET_COLUMNS}) VALUES {_fleet_values(dialect)} "
                f"ON CONFLICT (triggerer) DO UPDATE SET {sets}")


@cache
def upsert_with_fleet(dialect: str, upsert: TextClause) -> TextClause | None:
    """`upsert` with the fleet row's upsert in the same statement; None where the dialect
    cannot (the caller runs `fleet_statement` first, in the same transaction)."""
    if dialect != "postgresql":
        return None
    return text(f"WITH fleet AS ({fleet_statement(dialect).text}) {upsert.text}")


def fleet_params(dialect: str, status: FleetStatus,
                 timestamp: Any = None) -> dict[str, Any]:
    """The statement's parameters; `timestamp`: the dialect's packing of a POSIX time
    (SQLite's text form), None where the SQL converts it."""
    at, oldest = status.flushed_at, status.oldest_unflushed
    if timestamp is not None:
        at = timestamp(at)
        oldest = None if oldest is None else timestamp(oldest)
    return {"f_id": status.triggerer, "f_host": status.host, "f_pid": status.pid,
            "f_at": at, "f_dirty": status.dirty_keys, "f_oldest": oldest,
            "f_rate": status.rows_per_s, "f_interval": status.flush_interval}


# -- the history rows of a flush (`localstate._sync.central.history`)
# --------------------------------

_RETURNING: Final = ' RETURNING t.owner, t."key", t.value, t.version, t.updated_at, t.updated_by'


@cache
def upsert_with_history(dialect: str, fleet: bool, some: bool = False) -> TextClause | None:
    """The batch upsert (PostgreSQL's) returning the rows it wrote into the insert of their
    ``watermark`` history rows, one statement (with the fleet row's upsert too, `fleet`);
    the statement's row count is the upsert's. `some`: only the rows of the owners in the
    text array ``:history_owners``. None where the dialect cannot (the caller inserts the
    rows written after the upsert, `localstate._sync.central.history.record_watermarks`).
    """
    if dialect != "postgresql":
        return None
    ctes = f"fleet AS ({fleet_statement(dialect).text}), " if fleet else ""
    return text(
        f"WITH {ctes}up AS ({_PostgresSql.upsert.text}{_RETURNING}) "
        f'INSERT INTO {HISTORY_TABLE} (owner, kind, at, "key", value, version, triggerer, '
        "writer) SELECT up.owner, 'watermark', up.updated_at, up.\"key\", up.value, "
        "up.version, up.updated_by, CAST(:writer AS TEXT) FROM up"
        + (" WHERE up.owner = ANY(CAST(:history_owners AS TEXT[]))" if some else ""))


#: PostgreSQL: a claim and its ``claim`` history row, one statement returning the epoch
_CLAIM_WITH_HISTORY_PG: Final = text(
    f"WITH c AS ({_PostgresSql.claim.text}) "
    f"INSERT INTO {HISTORY_TABLE} (owner, kind, at, epoch, triggerer, writer) "
    "SELECT CAST(:owner AS TEXT), 'claim', CAST(:at AS TIMESTAMPTZ), c.epoch, "
    "CAST(:by AS TEXT), CAST(:writer AS TEXT) FROM c RETURNING epoch")


def claim_with_history(dialect: str) -> TextClause | None:
    """The claim (`BatchSql.claim`, its params) with the insert of its ``claim`` history row,
    one statement that returns the new epoch: two round trips fewer in a claim's transaction
    than two statements. None where the dialect cannot (the caller inserts the row after the
    claim, `localstate._sync.central.history.record_claim`)."""
    return _CLAIM_WITH_HISTORY_PG if dialect == "postgresql" else None


#: PostgreSQL: many owners claimed in one statement (`claim_many`)
_CLAIM_MANY_PG: Final = (
    f"INSERT INTO {CLAIM_TABLE} AS c (owner, epoch, claimant, claimed_at, writer) "
    "SELECT r.o, 1, r.b, CAST(:at AS TIMESTAMPTZ), r.w FROM unnest(CAST(:owners AS TEXT[]), "
    "CAST(:claimants AS TEXT[]), CAST(:writers AS TEXT[])) AS r(o, b, w) ORDER BY r.o "
    "ON CONFLICT (owner) DO UPDATE SET epoch = c.epoch + 1, claimant = EXCLUDED.claimant, "
    "claimed_at = EXCLUDED.claimed_at, writer = EXCLUDED.writer "
    "RETURNING c.owner, c.epoch, c.claimant, c.writer")
_CLAIMS_PG: Final = {
    False: text(_CLAIM_MANY_PG),
    True: text(f"WITH c AS ({_CLAIM_MANY_PG}), h AS (INSERT INTO {HISTORY_TABLE} "
               "(owner, kind, at, epoch, triggerer, writer) SELECT c.owner, 'claim', "
               "CAST(:at AS TIMESTAMPTZ), c.epoch, c.claimant, c.writer FROM c) "
               "SELECT c.owner, c.epoch FROM c"),
}


def claim_many(dialect: str, history: bool) -> TextClause | None:
    """The claim of many owners in one statement (params: the text arrays ``owners`` (each
    once), ``claimants`` and ``writers``, and ``at``), their rows locked in the order of
    their names; returns each owner with its new epoch, and with `history` inserts their
    ``claim`` history rows too. None where the dialect claims one owner per statement."""
    return _CLAIMS_PG[history] if dialect == "postgresql" else None


#: PostgreSQL: a flush's ``event`` history rows as one JSON array, one statement (SQLAlchemy's
#: many-row insert of the same rows built and bound a parameter per column per row in Python)
_EVENT_HISTORY_PG: Final = text(
    f'INSERT INTO {HISTORY_TABLE} (owner, kind, at, "key", outcome, asset_event, epoch, '
    "triggerer, writer) SELECT r->>0, 'event', CAST(:at AS TIMESTAMPTZ), r->>1, r->>2, "
    "(r->>3)::bigint, (r->>4)::bigint, CAST(:triggerer AS TEXT), CAST(:writer AS TEXT) "
    "FROM jsonb_array_elements(CAST(:rows AS JSONB)) AS r")


def event_history_insert(dialect: str) -> TextClause | None:
    """The one-statement insert of a flush's event history rows (params ``rows``: a JSON
    array of [owner, key, outcome, asset event id, epoch], ``at``, ``triggerer``, ``writer``);
    None where the rows go through SQLAlchemy's many-row insert."""
    return _EVENT_HISTORY_PG if dialect == "postgresql" else None
