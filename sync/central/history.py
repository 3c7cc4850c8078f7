"""Each owner's history in the central DB: what its writers did, bounded per owner.

One row per thing done (``localstate_history``, `localstate._sync.central.schema`), written in the
transaction that did it, so the record and the state never disagree:

* ``watermark``: a state row a flush committed (key, value, central version, triggerer,
  cache file), one per key per flush, as the flush coalesced it. On PostgreSQL the upsert
  returns its rows into the insert of the history rows, one statement
  (`localstate._sync.central.dialects.upsert_with_history`): no row travels twice, no round trip is
  added. Elsewhere the rows written are inserted after the upsert, in its transaction.
* ``event``: every event a flush carried, with its outcome: ``committed`` (and the id of the
  Airflow asset event it made, if any), ``duplicate`` (its key was committed before: a replay),
  ``refused`` (its claim epoch is below its owner's: a zombie's), or ``rejected`` (the central
  side refused it as malformed; recorded in a transaction of its own, since the flush that
  carried it rolled back).
* ``claim``: a claim of the owner (its new epoch, the claimant triggerer, its cache file).
* ``release``: the owner left a store that held its claim (its trigger moved away, was
  removed or ended): the epoch that store held, its triggerer and cache file. Recorded in a
  transaction of its own once the release has flushed the owner's writes (a release's one
  central round trip, as a claim's). A release at an epoch below the latest claim's is a
  zombie's, after its trigger was taken over.

Bounds. `HistoryPolicy` (settings ``history``, ``history_max_rows``, ``history_max_age``):
each owner keeps its newest ``max_rows`` rows, none older than ``max_age``. The writer that
adds rows trims them (`HistoryTrim`): an owner is trimmed once it had a tenth of its bound
added since its last trim, and rows past the age every `TRIM_INTERVAL` seconds, each in a
transaction of its own after the write's, so an owner holds at most ``max_rows`` plus a tenth
between trims (plus what other writers added since their own trims). ``localstate db prune``
trims every owner to the bounds.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Final, NamedTuple

import orjson
from sqlalchemy import Select, delete, func, insert, select
from sqlalchemy.ext.asyncio import AsyncConnection

from localstate._core.rows import HISTORY_KINDS, EventRow, FlushOutcome, HistoryKind, posix_time
from localstate._sync.central.dialects import event_history_insert
from localstate._sync.central.schema import history, state_variable
from localstate.errors import InvalidInput

__all__ = [
    "DEFAULT_MAX_AGE",
    "DEFAULT_MAX_ROWS",
    "DEFAULT_WATERMARK_EVERY",
    "HISTORY_KINDS",
    "TRIM_INTERVAL",
    "HistoryKind",
    "HistoryPolicy",
    "HistoryRow",
    "HistoryTrim",
    "OwnerSummary",
    "event_rows",
    "history_query",
    "record_claim",
    "record_events",
    "record_release",
    "record_watermarks",
    "summary",
    "trim",
]

#: rows each owner keeps by default
DEFAULT_MAX_ROWS: Final = 1000
#: how long a row stays by default: 7 days
DEFAULT_MAX_AGE: Final = 7 * 86_400.0
#: seconds between two trims by age from one writer
TRIM_INTERVAL: Final = 60.0
#: the default window of `HistoryPolicy.watermark_every`: 10 s
DEFAULT_WATERMARK_EVERY: Final = 10.0
#: owners per trim statement
_TRIM_CHUNK: Final = 200
#: rows per delete by age
_AGE_BATCH: Final = 5000


@dataclass(frozen=True)
class HistoryPolicy:
    """Whether history is written, and its bounds per owner."""

    enabled: bool = True
    max_rows: int = DEFAULT_MAX_ROWS
    max_age: float = DEFAULT_MAX_AGE
    #: seconds within which an owner's watermark advances after its last recorded one are
    #: coalesced into the next recorded one (0: every flush's): see `HistoryTrim.marks_due`
    watermark_every: float = DEFAULT_WATERMARK_EVERY

    def __post_init__(self) -> None:
        if isinstance(self.max_rows, bool) or not isinstance(self.max_rows, int) \
                or self.max_rows < 1:
            raise InvalidInput(f"history_max_rows must be a whole number above 0, not "
                               f"{self.max_rows!r}")
        if not self.max_age > 0:
            raise InvalidInput(f"history_max_age must be above zero seconds, not "
                               f"{self.max_age!r}")
        if not 0 <= self.watermark_every < float("inf"):
            raise InvalidInput(f"history_watermark_every must be 0 or more seconds, not "
                               f"{self.watermark_every!r}")

    @classmethod
    def of(cls, settings: Any) -> HistoryPolicy:
        """The policy the resolved `settings` (`localstate._core.config.Settings`) name."""
        return cls(settings.history, settings.history_max_rows, settings.history_max_age,
                   settings.history_watermark_every)


class HistoryRow(NamedTuple):
    """One row of an owner's history (see the module docstring)."""

    id: int
    owner: str
    kind: str
    #: POSIX time: a watermark's write time, an event's, claim's or release's commit time
    at: float
    key: str | None = None
    #: a watermark's value (JSON text; None: a deletion)
    value: str | None = None
    version: int | None = None
    #: an event's outcome: committed, duplicate, refused or rejected
    outcome: str | None = None
    #: the id of the Airflow asset event a committed event made
    asset_event: int | None = None
    #: a claim's epoch, the epoch a release gave up; an event's claim epoch
    epoch: int | None = None
    triggerer: str | None = None
    writer: str | None = None

    def as_json(self) -> dict[str, Any]:
        return self._asdict()


_COLUMNS: Final = (history.c.id, history.c.owner, history.c.kind, history.c.at, history.c.key,
                   history.c.value, history.c.version, history.c.outcome,
                   history.c.asset_event, history.c.epoch, history.c.triggerer,
                   history.c.writer)


def _row(r: Sequence[Any]) -> HistoryRow:
    (id_, owner, kind, at, key, value, version, outcome, asset_event, epoch, triggerer,
     writer) = r
    return HistoryRow(int(id_), owner, kind, posix_time(at), key, value,
                      None if version is None else int(version), outcome,
                      None if asset_event is None else int(asset_event),
                      None if epoch is None else int(epoch), triggerer, writer)


def history_query(owner: str, *, before: int | None = None, limit: int = 100,
                  kinds: Iterable[str] = ()) -> Select[Any]:
    """The query of `owner`'s rows, newest first, older than row id `before` (a page's
    cursor), at most `limit`, of `kinds` (empty: every kind)."""
    t = history.c
    query = select(*_COLUMNS).where(t.owner == owner)
    if before is not None:
        query = query.where(t.id < before)
    wanted = list(kinds)
    if wanted:
        query = query.where(t.kind.in_(wanted))
    return query.order_by(t.id.desc()).limit(limit)


def rows_of(result: Iterable[Sequence[Any]]) -> list[HistoryRow]:
    """`HistoryRow`s of a `history_query`'s result."""
    return [_row(r) for r in result]


@dataclass(frozen=True)
class OwnerSummary:
    """The counts that answer the usual questions about one watcher at a glance."""

    owner: str
    #: events in the last hour by outcome (every outcome present, 0 when none)
    events_last_hour: dict[str, int]
    last_event_at: float | None
    last_watermark_at: float | None
    last_claim_at: float | None
    #: the current claim's epoch, as the history holds it (None: no claim recorded)
    epoch: int | None
    #: rows held
    rows: int
    #: seconds since the last event and the last watermark advance (None: none recorded)
    since_event: float | None = None
    since_watermark: float | None = None
    #: how far the watermark trails the events: last event's time minus the last advance's,
    #: 0 when the watermark moved since (None: either never recorded)
    lag: float | None = None
    outcomes: tuple[str, ...] = field(default=("committed", "duplicate", "refused", "rejected"))

    def as_json(self) -> dict[str, Any]:
        return {"owner": self.owner, "events_last_hour": self.events_last_hour,
                "last_event_at": self.last_event_at,
                "last_watermark_at": self.last_watermark_at,
                "last_claim_at": self.last_claim_at, "epoch": self.epoch, "rows": self.rows,
                "since_event": self.since_event, "since_watermark": self.since_watermark,
                "lag": self.lag}


OUTCOMES: Final = ("committed", "duplicate", "refused", "rejected")


async def summary(conn: AsyncConnection, owner: str, now: float, timestamp: Any
                  ) -> OwnerSummary:
    """`owner`'s `OwnerSummary` at `now`; `timestamp`: a POSIX time as the column takes it."""
    t = history.c
    counts = dict.fromkeys(OUTCOMES, 0)
    for outcome, n in await conn.execute(
            select(t.outcome, func.count()).where(
                t.owner == owner, t.kind == "event", t.at >= timestamp(now - 3600.0))
            .group_by(t.outcome)):
        counts[str(outcome)] = int(n)
    last: dict[str, Any] = {}
    rows = 0
    for kind, at, n in await conn.execute(
            select(t.kind, func.max(t.at), func.count()).where(t.owner == owner)
            .group_by(t.kind)):
        last[str(kind)] = posix_time(at)
        rows += int(n)
    # the last advance as the state table holds it: exact, whatever the history coalesced
    v = state_variable.c
    written = (await conn.execute(select(func.max(v.updated_at)).where(v.owner == owner))
               ).scalar()
    if written is not None:
        last["watermark"] = max(last.get("watermark", 0.0), posix_time(written))
    epoch = (await conn.execute(
        select(t.epoch).where(t.owner == owner, t.kind == "claim")
        .order_by(t.id.desc()).limit(1))).scalar()
    event_at, mark_at = last.get("event"), last.get("watermark")
    lag = None if event_at is None or mark_at is None else max(0.0, event_at - mark_at)
    return OwnerSummary(
        owner, counts, event_at, mark_at, last.get("claim"),
        None if epoch is None else int(epoch), rows,
        None if event_at is None else max(0.0, now - event_at),
        None if mark_at is None else max(0.0, now - mark_at), lag)


# -- writing (inside the caller's transaction) ----------------------------------------------


async def record_watermarks(conn: AsyncConnection, outcomes: Sequence[FlushOutcome],
                            writer: str | None, timestamp: Any, owners: set[str] | None
                            ) -> int:
    """Insert a ``watermark`` row per outcome that wrote, of `owners` (None: all), where the
    upsert did not (not PostgreSQL); the rows inserted."""
    rows = [{"owner": o.row.owner, "kind": "watermark", "at": timestamp(o.row.updated_at),
             "key": o.row.key, "value": o.row.data, "version": o.central.version,
             "triggerer": o.row.updated_by, "writer": writer}
            for o in outcomes if o.resolution == "written" and o.central is not None
            and (owners is None or o.row.owner in owners)]
    if rows:
        await conn.execute(insert(history), rows)
    return len(rows)


def event_rows(events: Sequence[EventRow], outcomes: Sequence[str],
               asset_events: Sequence[int | None] | None, writer: str | None, at: Any,
               triggerer: str | None = None) -> list[dict[str, Any]]:
    """The ``event`` rows of `events` with their `outcomes` (and the asset event each
    committed one made, if known), committed at `at` (the column's form), flushed by
    `triggerer` (the writer's triggerer id, as the flush recorded it)."""
    ids = asset_events if asset_events is not None else [None] * len(events)
    return [{"owner": e.owner, "kind": "event", "at": at, "key": e.key, "outcome": s,
             "asset_event": a, "epoch": e.epoch, "triggerer": triggerer, "writer": writer}
            for e, s, a in zip(events, outcomes, ids, strict=True)]


async def record_events(conn: AsyncConnection, rows: Sequence[dict[str, Any]]) -> None:
    """Insert `event_rows` (on PostgreSQL as one JSON array, `event_history_insert`)."""
    if not rows:
        return
    packed = event_history_insert(conn.dialect.name)
    if packed is None:
        await conn.execute(insert(history), list(rows))
        return
    first = rows[0]
    if all(r["at"] == first["at"] and r["writer"] == first["writer"]
           and r["triggerer"] == first["triggerer"] for r in rows):
        await conn.execute(packed, {
            "at": first["at"], "writer": first["writer"], "triggerer": first["triggerer"],
            "rows": orjson.dumps(
                [(r["owner"], r["key"], r["outcome"], r["asset_event"], r["epoch"])
                 for r in rows]).decode()})
    else:
        await conn.execute(insert(history), list(rows))


async def record_claim(conn: AsyncConnection, owner: str, epoch: int, claimant: str,
                       writer: str | None, at: Any) -> None:
    """Insert the ``claim`` row of `owner`'s claim at `epoch`."""
    await conn.execute(insert(history).values(
        owner=owner, kind="claim", at=at, epoch=epoch, triggerer=claimant, writer=writer))


async def record_release(conn: AsyncConnection, owner: str, epoch: int, releaser: str,
                         writer: str | None, at: Any) -> None:
    """Insert the ``release`` row of `owner`, given up at `epoch` by `releaser`."""
    await conn.execute(insert(history).values(
        owner=owner, kind="release", at=at, epoch=epoch, triggerer=releaser, writer=writer))


# -- bounds ----------------------------------------------------------------------------------


class HistoryTrim:
    """When one writer trims (see the module docstring): the rows it added per owner since
    that owner's last trim, and the time of its last trim by age."""

    def __init__(self, policy: HistoryPolicy,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.policy = policy
        self._clock = clock
        self._added: Counter[str] = Counter()
        self._aged_at = clock()
        #: when each owner's watermark was last recorded (`marks_due`)
        self._marked: dict[str, float] = {}
        #: rows trimmed so far (for stats and tests)
        self.trimmed = 0

    def marks_due(self, owners: Iterable[str]) -> set[str] | None:
        """Which of `owners` get their watermarks recorded by the flush about to be made:
        those with none recorded within `HistoryPolicy.watermark_every` seconds (None: all
        of them). An owner's advances in between are coalesced into its next recorded one,
        so a flush of every watcher every second records each one's watermark once per
        window, not once per flush: an index entry per owner per flush cost a 10,000-owner
        flush on PostgreSQL half its throughput (benches/bench_history.py). Events and
        claims are always recorded."""
        every = self.policy.watermark_every
        if every <= 0:
            return None
        now = self._clock()
        marked = self._marked
        due = {o for o in owners if now - marked.get(o, -every) >= every}
        if len(marked) > 4 * max(len(due), 10_000):  # forget owners long quiet
            self._marked = marked = {o: t for o, t in marked.items() if now - t < every}
        return due

    def marked(self, owners: Iterable[str]) -> None:
        """`owners`' watermarks were recorded (their flush committed)."""
        now = self._clock()
        for o in owners:
            self._marked[o] = now

    @property
    def _step(self) -> int:
        return max(1, self.policy.max_rows // 10)

    def added(self, owners: Iterable[str]) -> None:
        """Count one row added per owner named (an owner named twice: two rows)."""
        self._added.update(owners)

    def due(self) -> tuple[list[str], bool]:
        """The owners due a trim by count, and whether a trim by age is due."""
        step = self._step
        owners = [o for o, n in self._added.items() if n >= step]
        return owners, self._clock() - self._aged_at >= TRIM_INTERVAL

    def done(self, owners: Sequence[str], aged: bool, trimmed: int) -> None:
        for o in owners:
            self._added.pop(o, None)
        if aged:
            self._aged_at = self._clock()
        self.trimmed += trimmed


async def trim(conn: AsyncConnection, owners: Sequence[str] | None, max_rows: int,
               cutoff: Any | None) -> int:
    """Delete, in `conn`'s transaction, each of `owners`' rows past its newest `max_rows`
    (None: every owner's) and, with `cutoff` (the column's form), every row older than it;
    the rows deleted."""
    t = history.c
    deleted = 0
    if owners is None:
        names = [o for (o,) in await conn.execute(
            select(t.owner).group_by(t.owner).having(func.count() > max_rows))]
    else:
        names = list(owners)
    for start in range(0, len(names), _TRIM_CHUNK):
        chunk = names[start:start + _TRIM_CHUNK]
        ranked = select(t.id, func.row_number().over(
            partition_by=t.owner, order_by=t.id.desc()).label("n")).where(
            t.owner.in_(chunk)).subquery()
        # the ids go through Python: MySQL refuses a DELETE whose subquery reads its table
        ids = [i for (i,) in await conn.execute(select(ranked.c.id).where(ranked.c.n > max_rows))]
        for at in range(0, len(ids), _AGE_BATCH):
            deleted += (await conn.execute(
                delete(history).where(t.id.in_(ids[at:at + _AGE_BATCH])))).rowcount
    if cutoff is not None:
        while True:
            ids = [i for (i,) in await conn.execute(
                select(t.id).where(t.at < cutoff).order_by(t.id).limit(_AGE_BATCH))]
            if not ids:
                break
            deleted += (await conn.execute(delete(history).where(t.id.in_(ids)))).rowcount
            if len(ids) < _AGE_BATCH:
                break
    return deleted


def column_time(dialect: str, ts: float) -> datetime:
    """`ts` as a timestamp column takes it: UTC, naive where the dialect keeps no offset."""
    moment = datetime.fromtimestamp(ts, tz=timezone.utc)
    return moment if dialect == "postgresql" else moment.replace(tzinfo=None)
