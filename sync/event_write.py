"""The events of a flush (`StateStore.emit`), written inside the flush's transaction:
`CentralStore.write_with_events` calls `write_events` after the fenced state rows.

For each event, in emit order:

1. **Claim fence.** An event whose claim epoch is below its owner's central epoch (and whose
   cache file is not the claim's own) is "refused": a zombie's event, nothing is written. The
   owner's claim rows are read with a shared lock, so a claim committing meanwhile waits for
   this flush: the new holder then reads the watermark committed with these events.
2. **De-duplication.** An event whose ``(owner, key)`` the event table holds (or that came
   earlier in this batch) is a "duplicate": nothing is written. A replayed batch is a no-op.
3. Otherwise it is "committed": its de-duplication row, and for an asset's owner its asset
   events (`localstate.sync.asset_events`), in emit order.

Two flushes of the same new key at once (a zombie racing its successor) meet on the event
table's primary key: one commits, the other fails whole and is retried, and finds a duplicate.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import insert, select, tuple_
from sqlalchemy.ext.asyncio import AsyncConnection

from localstate.rows import EventRow, EventStatus
from localstate.sync.asset_events import AssetEvents
from localstate.sync.schema import event, owner_claim

__all__ = ["write_events"]

#: keys per IN list when looking up known keys
_CHUNK = 500


async def write_events(
    conn: AsyncConnection, events: Sequence[EventRow], writer: str | None,
    assets: AssetEvents, now: Any,
) -> tuple[list[EventStatus], list[Callable[[], Any]]]:
    """Write `events` in `conn`'s transaction (see the module docstring); one status per event,
    and the Airflow listener callbacks to run once the transaction committed. `now`: the
    commit time (an aware datetime)."""
    if not events:
        return [], []
    owners = {e.owner for e in events}
    c = owner_claim.c
    claims = {o: (int(ep), w) for o, ep, w in await conn.execute(
        select(c.owner, c.epoch, c.writer).where(c.owner.in_(owners))
        .with_for_update(read=True))}
    statuses: list[EventStatus] = []
    candidates: list[EventRow] = []
    for e in events:
        claim = claims.get(e.owner)
        if claim is not None and e.epoch < claim[0] and (writer is None or claim[1] != writer):
            statuses.append("refused")
        else:
            statuses.append("committed")
            candidates.append(e)
    known: set[tuple[str, str]] = set()
    t = event.c
    keys = list({(e.owner, e.key) for e in candidates})
    for start in range(0, len(keys), _CHUNK):
        chunk = keys[start:start + _CHUNK]
        known.update((o, k) for o, k in await conn.execute(
            select(t.owner, t.key).where(tuple_(t.owner, t.key).in_(chunk))))
    new: list[EventRow] = []
    for i, e in enumerate(events):
        if statuses[i] != "committed":
            continue
        k = (e.owner, e.key)
        if k in known:
            statuses[i] = "duplicate"
        else:
            known.add(k)
            new.append(e)
    if not new:
        return statuses, []
    counts, callbacks = await assets.apply(conn, new)
    await conn.execute(insert(event), [
        {"owner": e.owner, "key": e.key, "seq": e.seq, "writer": writer, "epoch": e.epoch,
         "asset_events": n, "committed_at": now}
        for e, n in zip(new, counts, strict=True)])
    return statuses, callbacks
