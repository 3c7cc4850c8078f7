"""The reads of the central DB a local-first store makes for keys it does not hold in memory.

A key not in memory is read through (`known_entry`), a key written for the first time is based on
its central record (`first_write_base`), and `load_owner` adopts an owner's rows in one query.
Every row read goes into the `EntryTable` through `EntryTable.adopt`, which never lowers an
entry. None of this is on the hot path: a known key never gets here.
"""

from __future__ import annotations

import logging

from localstate.conflicts import ConflictPolicy
from localstate.entry import Entry, StateKey
from localstate.entry_table import EntryTable
from localstate.errors import CentralError
from localstate.model import Durability, check_name, refuse_unhashable_names
from localstate.rows import CentralRow
from localstate.sync.read_through import ReadThrough
from localstate.sync.sinks import Sink

__all__ = ["first_write_base", "known_entry", "load_owner", "set_reads_base"]

# the store's logger: what a first write logs is the store's, wherever the code lives
log = logging.getLogger("localstate.store")


async def load_owner(table: EntryTable, sink: Sink, owner: str) -> int:
    """Adopt `owner`'s central rows (none lowers an entry); return how many have a value."""
    since = table.read_epoch(owner)
    rows = await sink.read_owner(owner)
    for row in rows:  # a key dropped during the read is left to be read through
        table.adopt((row.owner, row.key), row, since)
    return sum(1 for r in rows if r.data is not None)


async def known_entry(table: EntryTable, reader: ReadThrough, k: StateKey) -> Entry | None:
    """The entry of `k`, reading through to the central DB on a miss."""
    try:
        e = table.entries.get(k)
    except TypeError:
        refuse_unhashable_names(*k)
    if e is not None:
        e.used = True
        return e
    check_name("owner", k[0])
    check_name("key", k[1])
    while True:  # again when a drop made the row read possibly stale
        if table.is_absent(k):
            return None
        since = table.read_epoch(k[0])
        row = await reader.fetch(k)
        e = table.entries.get(k)  # written meanwhile by a call of this store
        if row is not None:
            e = table.adopt(k, row, since)
            if e is not None:
                return e
        elif e is not None or table.mark_absent(k, since):
            return e


def set_reads_base(durability: Durability, policy: ConflictPolicy) -> bool:
    """Whether a `set` of a key this store does not hold reads its central record first.

    Only when the answer matters before the flush: a ``central`` write waits for the flush
    anyway, and under ``reject`` a write on an unknown base could only lose to an existing
    record. Any other ``local``/``memory`` set is based on "not yet known" (`UNKNOWN_BASE`)
    and never waits for the central DB; its flush settles it by the policy (``max`` compares
    the values, ``last_writer_wins`` the times, a row of this writer's own chain is replaced).
    """
    return durability == "central" or policy.name == "reject"


async def first_write_base(table: EntryTable, reader: ReadThrough, k: StateKey, *,
                           read: bool = True) -> Entry:
    """The entry a first write of `k` is based on: its central record, read now.

    When the central DB cannot be read, or `read` is False (see `set_reads_base`), the entry
    is based on "unknown" (`UNKNOWN_BASE`; on "none" while `k` is known to be absent); the
    caller decides whether the write may go ahead (a set may, a compare-and-set may not).
    Synchronous from the end of the read to the return: the caller writes before any await.
    """
    check_name("owner", k[0])
    check_name("key", k[1])
    if not read:  # no await: the caller writes in the same step
        return table.first_write_base(k, None, unknown=not table.is_absent(k))
    row: CentralRow | None = None
    unknown = False
    while k not in table.entries and not table.is_absent(k):
        since = table.read_epoch(k[0])
        try:
            row = await reader.fetch(k)
        except CentralError as exc:
            unknown = True
            # the reader's FailureLog tells of the outage; this key's fallback is detail
            log.debug("cannot read %s/%s from the central DB before writing it (%s); the "
                        "write is based on an unknown central version and settled by the "
                        "conflict policy at the flush", k[0], k[1], exc)
            break
        if since == table.read_epoch(k[0]):
            break
        row = None  # an entry was dropped during the read: `k` at a newer version, maybe
    return table.first_write_base(k, row, unknown=unknown)
