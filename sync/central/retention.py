"""Central retention: `localstate db prune` deletes old rows and old tombstones, in small
batches.

What goes (at ``now``):

* a row with a value whose ``updated_at`` is older than its owner's age limit: the first
  ``retention`` rule (``trigger:*=7d, asset_watcher:*=never``) whose glob matches the owner,
  else the command's ``--older-than``; an owner with neither keeps its values;
* a tombstone (a deletion, value NULL) older than the *tombstone horizon* (and than the
  owner's age limit): a tombstone is what makes a late writer's write, based on the deleted
  version, a conflict instead of bringing the key back unseen, so it must outlive every write
  that can still arrive based on it. The horizon (default 30 days, at least one day) is far
  longer than any flush, backoff or handover window;
* nothing of an owner whose rule says ``never``;
* each owner's history rows past ``history_max_rows`` (the oldest) or older than
  ``history_max_age`` (the writers trim as they add rows; this is the sweep of owners no
  longer written), unless a dry run;
* an event's de-duplication row (`localstate._sync.central.fenced_write`) older than the *event
  horizon* (default 7 days, at least one hour) once its owner's state was written after it:
  that later write is the watermark at or past the event's key, from which a trigger that
  takes over resumes, so the key is never emitted again. The horizon covers the other replay,
  a flush whose answer was lost, sent again from the outbox when the central DB answers (an
  outage longer than the horizon could then repeat such a batch's events). ``never`` rules
  keep their owners' event rows too. A key no watermark covers, a redelivered message's
  (``sqs/<MessageId>``: an SQS queue redelivers a message it was not told of for up to 14
  days, its longest retention), stays at least `REDELIVERY_WINDOW` whatever the horizon.

A store that still holds a pruned row in memory keeps serving it and writes it again on its
next write (the upsert inserts it anew); a pruned tombstone can be written over by a writer
that is older than the horizon.

How, without long locks:

* the table is walked in primary-key order (keyset pagination: each batch continues after the
  last key of the one before), `batch_size` rows per read, filtered on ``updated_at`` (no
  index on it: one would make every flush's rewrite of a watermark a non-HOT update on
  PostgreSQL, see `localstate._sync.central.schema`); an owner prefix is a range on the primary key;
* each batch is deleted in a transaction of its own, by ``(owner, key, version)``: a row
  written since it was read (its version moved) is left alone, so a prune never deletes a
  write it did not see;
* a dry run reads the same batches and deletes nothing.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Final

from sqlalchemy import delete, or_, select, tuple_

from localstate._core.retention_rules import DAY, RetentionRule, parse_retention
from localstate._sync.central.central_store import CentralStore
from localstate._sync.central.dialects import prefix_upper_bound
from localstate._sync.central.schema import event, state_variable
from localstate.errors import InvalidInput

__all__ = ["DEFAULT_BATCH", "DEFAULT_EVENT_HORIZON", "DEFAULT_TOMBSTONE_HORIZON",
           "MIN_EVENT_HORIZON", "MIN_TOMBSTONE_HORIZON", "REDELIVERED_KEY_PREFIX",
           "REDELIVERY_WINDOW", "PruneReport", "prune"]

#: how long a tombstone stays by default: 30 days
DEFAULT_TOMBSTONE_HORIZON: Final = 30 * DAY
#: the shortest tombstone horizon accepted
MIN_TOMBSTONE_HORIZON: Final = DAY
#: how long an event's de-duplication row stays by default: 7 days
DEFAULT_EVENT_HORIZON: Final = 7 * DAY
#: the shortest event horizon accepted
MIN_EVENT_HORIZON: Final = 3600.0
#: event keys of messages a queue may redeliver at any time until its retention ends (SQS:
#: ``sqs/<MessageId>``); their de-duplication rows stay at least `REDELIVERY_WINDOW`
REDELIVERED_KEY_PREFIX: Final = "sqs/"
#: SQS's longest message retention (14 days) and a day's margin
REDELIVERY_WINDOW: Final = 15 * DAY
#: rows per read and per delete transaction
DEFAULT_BATCH: Final = 500
_MAX_BATCH: Final = 10_000


@dataclass(frozen=True)
class PruneReport:
    """What a prune deleted (a dry run: would delete)."""

    rows: int = 0
    tombstones: int = 0
    #: rows read (old enough to be looked at) and delete transactions made
    scanned: int = 0
    batches: int = 0
    dry_run: bool = False
    #: events' de-duplication rows deleted
    event_keys: int = 0
    #: history rows past their owner's bounds deleted (`localstate._sync.central.history`)
    history_rows: int = 0

    @property
    def deleted(self) -> int:
        return self.rows + self.tombstones


async def prune(
    central: CentralStore, *, older_than: float | None = None, owner_prefix: str = "",
    retention: str | Sequence[RetentionRule] | None = None,
    tombstone_horizon: float = DEFAULT_TOMBSTONE_HORIZON, dry_run: bool = False,
    batch_size: int = DEFAULT_BATCH, now: float | None = None,
    event_horizon: float = DEFAULT_EVENT_HORIZON,
) -> PruneReport:
    """Delete the central rows retention says are due (see the module docstring)."""
    rules = parse_retention(retention)
    _check(older_than, tombstone_horizon, batch_size, owner_prefix)
    if not event_horizon >= MIN_EVENT_HORIZON:
        raise InvalidInput(f"the event horizon must be at least {MIN_EVENT_HORIZON:g} s (far "
                           f"longer than any flush retry), not {event_horizon:g} s")
    now = datetime.now(timezone.utc).timestamp() if now is None else now
    ages = [r.older_than for r in rules if r.older_than is not None]
    if older_than is not None:
        ages.append(older_than)
    # nothing younger than this can go, whatever its owner
    youngest = min([*ages, tombstone_horizon])
    limits: dict[str, tuple[float, float] | None] = {}  # owner: (value cutoff, tomb cutoff)

    def cutoffs(owner: str) -> tuple[float, float] | None:
        if owner not in limits:
            rule = next((r for r in rules if fnmatch.fnmatchcase(owner, r.pattern)), None)
            if rule is not None and rule.older_than is None:
                limits[owner] = None  # never
            else:
                age = older_than if rule is None else rule.older_than
                value_cut = -1.0 if age is None else now - age
                limits[owner] = (value_cut, now - max(tombstone_horizon, age or 0.0))
        return limits[owner]

    t = state_variable.c
    rows = tombstones = scanned = batches = 0
    after: tuple[str, str] | None = None
    bound = prefix_upper_bound(owner_prefix) if owner_prefix else None
    while True:
        query = select(t.owner, t.key, t.version, t.value.is_(None), t.updated_at).where(
            t.updated_at < _timestamp(central, now - youngest))
        if owner_prefix:
            query = query.where(central.bytewise(t.owner) >= owner_prefix)
            if bound is not None:
                query = query.where(central.bytewise(t.owner) < bound)
        if after is not None:
            query = query.where(tuple_(t.owner, t.key) > tuple_(*after))
        query = query.order_by(t.owner, t.key).limit(batch_size)
        found = await central.run_read(query, "read rows to prune")
        if not found:
            break
        scanned += len(found)
        after = (found[-1][0], found[-1][1])
        due: list[tuple[str, str, int]] = []
        due_tombstones = 0
        for owner, key, version, deleted, updated_at in found:
            limit = cutoffs(owner)
            if limit is None:
                continue
            at = _epoch(updated_at)
            if deleted and at < limit[1]:
                due.append((owner, key, int(version)))
                due_tombstones += 1
            elif not deleted and at < limit[0]:
                due.append((owner, key, int(version)))
        if due and not dry_run:
            statement = delete(state_variable).where(
                tuple_(t.owner, t.key, t.version).in_(due))
            gone = await central.run_write(statement, "prune rows")
            # rows written since they were read are left: count what went, tombstones first
            # as read (a rewritten row is rare: the split is then approximate)
            due_tombstones = min(due_tombstones, gone)
            rows += gone - due_tombstones
            tombstones += due_tombstones
            batches += 1
        elif due:
            rows += len(due) - due_tombstones
            tombstones += due_tombstones
        if len(found) < batch_size:
            break
    never = [r.pattern for r in rules if r.older_than is None]
    event_keys, event_batches = await _prune_event_keys(
        central, cutoff=now - event_horizon, owner_prefix=owner_prefix, never=never,
        dry_run=dry_run, batch_size=batch_size,
        redelivery_cutoff=now - max(event_horizon, REDELIVERY_WINDOW))
    # each owner's history to its bounds (the store's policy: the history settings); a dry
    # run counts nothing there (the trim is one pass, not batches to count)
    history_rows = 0 if dry_run else await central.trim_history()
    return PruneReport(rows=rows, tombstones=tombstones, scanned=scanned,
                       batches=batches + event_batches, dry_run=dry_run, event_keys=event_keys,
                       history_rows=history_rows)


async def _prune_event_keys(
    central: CentralStore, *, cutoff: float, owner_prefix: str, never: Sequence[str],
    dry_run: bool, batch_size: int, redelivery_cutoff: float,
) -> tuple[int, int]:
    """Delete the de-duplication rows due (see the module docstring), `batch_size` per
    transaction; (rows, transactions)."""
    e, v = event.c, state_variable.c
    later = (select(v.owner).where(v.owner == e.owner, v.updated_at > e.committed_at)
             .exists())
    deleted = batches = 0
    after: tuple[str, str] | None = None
    bound = prefix_upper_bound(owner_prefix) if owner_prefix else None
    while True:
        query = select(e.owner, e.key).where(
            e.committed_at < _timestamp(central, cutoff), later,
            or_(~e.key.startswith(REDELIVERED_KEY_PREFIX, autoescape=True),
                e.committed_at < _timestamp(central, redelivery_cutoff)))
        if owner_prefix:
            query = query.where(central.bytewise(e.owner) >= owner_prefix)
            if bound is not None:
                query = query.where(central.bytewise(e.owner) < bound)
        if after is not None:
            query = query.where(tuple_(e.owner, e.key) > tuple_(*after))
        found = await central.run_read(query.order_by(e.owner, e.key).limit(batch_size),
                                       "read event keys to prune")
        if not found:
            break
        after = (found[-1][0], found[-1][1])
        due = [(o, k) for o, k in found
               if not any(fnmatch.fnmatchcase(o, pattern) for pattern in never)]
        if due and not dry_run:
            deleted += await central.run_write(
                delete(event).where(tuple_(e.owner, e.key).in_(due)), "prune event keys")
            batches += 1
        else:
            deleted += len(due)
        if len(found) < batch_size:
            break
    return deleted, batches


def _check(older_than: float | None, horizon: float, batch_size: int, owner_prefix: str
           ) -> None:
    if older_than is not None and not older_than > 0:
        raise InvalidInput(f"older_than must be above zero seconds, not {older_than!r}")
    if not horizon >= MIN_TOMBSTONE_HORIZON:
        raise InvalidInput(
            f"the tombstone horizon must be at least {MIN_TOMBSTONE_HORIZON / DAY:g} day "
            f"(far longer than any flush or handover), not {horizon:g} s")
    if isinstance(batch_size, bool) or not 0 < batch_size <= _MAX_BATCH:
        raise InvalidInput(f"batch_size must be 1 to {_MAX_BATCH}, not {batch_size!r}")
    if not isinstance(owner_prefix, str):
        raise InvalidInput(f"owner_prefix must be text, not {owner_prefix!r}")


def _timestamp(central: CentralStore, ts: float) -> datetime:
    """`ts` as the column takes it: UTC, naive where the dialect keeps no offset."""
    moment = datetime.fromtimestamp(ts, tz=timezone.utc)
    return moment if central.dialect == "postgresql" else moment.replace(tzinfo=None)


def _epoch(value: Any) -> float:
    if isinstance(value, str):  # SQLite
        value = datetime.fromisoformat(value)
    if value.tzinfo is None:  # stored in UTC
        value = value.replace(tzinfo=timezone.utc)
    return float(value.timestamp())
