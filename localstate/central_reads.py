"""The reads of the central DB a `StateStore` makes for keys it does not hold in memory.

A key not in memory is read through (`known_entry`), a key written for the first time is based on
its central record (`first_write_entry`), and `load_owner` adopts an owner's rows in one query. A
key the central DB lacks is remembered as absent for ``absent_ttl`` seconds. None of this is on
the hot path: a known key never gets here. The store's maps stay on the store.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from localstate.entry import Entry, StateKey, entry_from_row
from localstate.errors import CentralError
from localstate.model import check_name, refuse_unhashable_names
from localstate.sync.rows import CentralRow
from localstate.sync.worker import SyncWorker

if TYPE_CHECKING:
    from localstate.store import StateStore

__all__ = ["first_write_entry", "known_entry", "load_owner"]

# the store's logger: what a first write logs is the store's, wherever the code lives
log = logging.getLogger("localstate.store")


async def load_owner(store: StateStore, owner: str) -> int:
    """The body of `StateStore.load`: adopt `owner`'s central rows; return how many have a value."""
    rows = await store._require_sink().read_owner(owner)
    if store._direct:
        return sum(1 for r in rows if r.data is not None)
    for row in rows:
        k = (row.owner, row.key)
        store._absent.pop(k, None)
        e = store._entries.get(k)
        if e is None:
            e = store._entries[k] = entry_from_row(row)
        elif e.dirty or e.version == row.version:
            continue
        else:
            SyncWorker._adopt(e, row)
        store._stage(k, e)
    return sum(1 for r in rows if r.data is not None)


async def known_entry(store: StateStore, k: StateKey) -> Entry | None:
    """The entry of `k`, reading through to the central DB on a miss."""
    try:
        e = store._entries.get(k)
    except TypeError:
        refuse_unhashable_names(*k)
    if e is not None:
        return e
    check_name("owner", k[0])
    check_name("key", k[1])
    if store._direct:
        row = (await store._require_sink().read_many([k])).get(k)
        return None if row is None else entry_from_row(row)
    expiry = store._absent.get(k)
    if expiry is not None and expiry > time.monotonic():
        return None
    row = await store._require_reader().fetch(k)
    e = store._entries.get(k)  # another coroutine may have filled it meanwhile
    if e is not None:
        return e
    if row is None:
        store._absent[k] = time.monotonic() + store.settings.absent_ttl
        return None
    store._absent.pop(k, None)
    e = store._entries[k] = entry_from_row(row)
    store._stage(k, e)
    return e


async def first_write_entry(store: StateStore, k: StateKey) -> Entry:
    """A new entry for a key this store has not seen, based on the central record."""
    check_name("owner", k[0])
    check_name("key", k[1])
    row: CentralRow | None = None
    expiry = store._absent.get(k)
    if expiry is None or expiry <= time.monotonic():
        try:
            row = await store._require_reader().fetch(k)
        except CentralError as exc:
            # write anyway: the flush fences on "no central record" and the conflict
            # policy settles it if there was one
            log.warning("cannot read %s/%s from the central DB before writing it (%s); "
                        "writing locally", k[0], k[1], exc)
    e = store._entries.get(k)
    if e is None:
        e = store._entries[k] = (
            entry_from_row(row) if row is not None
            else Entry(None, None, 0, 0.0, store.triggerer_id, 0)
        )
    store._absent.pop(k, None)
    return e
