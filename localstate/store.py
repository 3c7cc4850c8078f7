"""`StateStore`: the public store. Local-first get/set in front of the sync worker.

The hot path is a dict: `get` of a known key and `set` in ``memory`` durability touch nothing
but memory; ``local`` waits for the group commit that carries the write; ``central`` waits for
the flush that puts it in the central DB. With the cache turned off (``enabled=False``) every
call goes straight to the central DB, one transaction per `set`, as Airflow's own
``Variable.set`` does.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable
from typing import TYPE_CHECKING, Any

from localstate.codec import IMMUTABLE_TYPES, decode, encode
from localstate.entry import NOT_DECODED, StateKey, entry_from_row, record_of
from localstate.errors import CentralUnavailable, EventsUnsupported, InvalidInput
from localstate.model import (
    Durability,
    Record,
    check_durability,
    check_key,
    check_name,
    refuse_unhashable_names,
)
from localstate.modes import Unflushed
from localstate.outbox import OwnerEvents
from localstate.release import ReleaseReport, release_owner
from localstate.store_core import StoreCore
from localstate.sync.asset_events import NO_ASSET_EVENTS
from localstate.sync.asset_mirror import asset_name
from localstate.sync.claims import claim_owner, claiming_sink
from localstate.sync.settle import FlushReport
from localstate.sync.sink_thread import ThreadedSink
from localstate.sync.sinks import ClaimingSink, carries_events

if TYPE_CHECKING:
    from localstate.variable import StateVariable

__all__ = ["WATERMARK_KEY", "StateStore", "event_key"]

#: the key a watermark is kept under by default (`StateEnabledTrigger.watermark_key`'s too)
WATERMARK_KEY = "watermark"


def event_key(watermark: Any) -> str:
    """The default idempotency key of an event emitted with `watermark`: the string itself,
    or the JSON text of any other value (``42`` -> ``"42"``, ``{"id": 7}`` -> ``'{"id":7}'``)."""
    return check_name("key", watermark if isinstance(watermark, str) else encode(watermark))


class StateStore(StoreCore):
    """A local-first state store. ``store = await StateStore.open(...)`` or ``async with``.

    Every option may also come from the environment or ``airflow.cfg`` (see
    `localstate.config`); explicit arguments win.

    What it owns, and how it opens, closes and is reconfigured: `StoreCore`. Its calls read
    that state; a call not served from memory goes to the mode in force, inside the gate.
    """

    # -- reading -------------------------------------------------------------------------

    async def get(self, owner: str, key: str, default: Any = None) -> Any:
        """The value of ``(owner, key)``, or `default` when it has none."""
        if self._closed:
            raise self._closed_error()
        try:
            e = self._entries.get((owner, key))
        except TypeError:  # an unhashable owner or key (a list, say): no name at all
            refuse_unhashable_names(owner, key)
        if e is not None:
            self._hits += 1
            e.used = True  # its second chance at the next eviction pass
            data = e.data
            if data is None:
                return default
            obj = e.obj
            return obj if obj is not NOT_DECODED else decode(data)
        self._misses += 1
        async with self._gate.call():
            e = await self._mode.read((owner, key))
        if e is None or e.data is None:
            return default
        return e.obj if e.obj is not NOT_DECODED else decode(e.data)

    async def get_many(self, owner: str, keys: Iterable[str]) -> dict[str, Any]:
        """The values of the keys of `owner` that have one (missing keys are left out)."""
        if self._closed:
            raise self._closed_error()
        keys = list(keys)
        async with self._gate.call():
            read = self._mode.read
            found = await asyncio.gather(*(read((owner, k)) for k in keys))
        return {
            k: (e.obj if e.obj is not NOT_DECODED else decode(e.data))
            for k, e in zip(keys, found, strict=True)
            if e is not None and e.data is not None
        }

    async def record(self, owner: str, key: str) -> Record | None:
        """The full record (value, version, stamps, flush state), or None."""
        if self._closed:
            raise self._closed_error()
        async with self._gate.call():
            e = await self._mode.read((owner, key))
            if e is None or e.data is None:
                return None
            return record_of((owner, key), e, self._mode.conflicted())

    async def read_committed(self, owner: str, key: str) -> Record | None:
        """The record the central DB holds now (None: no value), read with a query of its own.

        Linearizable with every write acknowledged centrally (``central`` durability, a
        compare-and-set in ``central`` durability, any write in direct mode): a call that starts
        after such a write returned sees it or a later one. Writes this store still owes the
        central DB are not shown. The row also refreshes this store's entry when the entry is
        clean and older (it never lowers an entry).
        """
        if self._closed:
            raise self._closed_error()
        k = (owner, key)
        check_key(k)
        async with self._gate.call():
            row = await self._mode.read_central(k)
            if row is None or row.data is None:
                return None
            return record_of(k, entry_from_row(row), ())

    async def items(self, owner: str) -> AsyncIterator[Record]:
        """The records of `owner` this store holds (call `load(owner)` first to refresh)."""
        if self._closed:
            raise self._closed_error()
        check_name("owner", owner)
        async with self._gate.call():  # not held while the caller iterates
            records = await self._mode.records(owner)
        for record in records:
            yield record

    async def load(self, owner: str) -> int:
        """Refresh `owner`'s keys from the central DB in one query; return how many it has.

        Call it when this process takes over an owner (a trigger moved here): clean entries
        take the central records that are newer, dirty ones are left for the flush to
        reconcile. No entry ever goes back to an older version.
        """
        if self._closed:
            raise self._closed_error()
        check_name("owner", owner)
        async with self._gate.call():
            return await self._mode.load(owner)

    # -- writing -------------------------------------------------------------------------

    async def set(
        self, owner: str, key: str, value: Any, *, durability: Durability | None = None
    ) -> int:
        """Set ``(owner, key)`` to `value`; return the new version once `durability` holds."""
        if self._closed:
            raise self._closed_error()
        if self._lost:  # another writer claimed an owner from this store
            self._claims.check(owner)
        data = encode(value, self._max_value_bytes)
        if self._checks_values:  # some owner's max policy declares an order
            self._policies.check_value(owner, value, data)
        if durability is None:
            durability = self._durability
        elif durability != "memory" and durability != "local" and durability != "central":
            check_durability(durability)  # raises, before anything is written
        k = (owner, key)
        try:
            e = self._hot.get(k)
        except TypeError:  # an unhashable owner or key (a list, say)
            refuse_unhashable_names(owner, key)
        obj = value if type(value) in IMMUTABLE_TYPES else NOT_DECODED
        if e is None:  # a key not in memory, or direct mode: in one mode from start to end
            async with self._gate.call():
                return await self._mode.set(k, data, obj, durability)
        # the hot path: one call into the table, which makes the write in memory (inline there).
        # Looked up as the table's method each time: CPython specializes that lookup, not the
        # call of a bound method kept in an attribute of the store (~5% of a set on 3.11)
        version = self._table.write(k, e, data, obj, durability == "memory")
        if durability == "memory":
            return version
        return await self._mode.persist(k, e, version, durability)

    async def compare_and_set(
        self, owner: str, key: str, value: Any, *, expected_version: int,
        durability: Durability | None = None,
    ) -> int:
        """Set only if the record is at `expected_version` (0: it must not exist).

        Raises `VersionConflict` otherwise. Across processes the check is as strong as the
        flush's fencing: a write based on a stale central version is a conflict there too.
        """
        if self._closed:
            raise self._closed_error()
        if isinstance(expected_version, bool) or not isinstance(expected_version, int):
            raise InvalidInput(f"expected_version must be an int, not {expected_version!r}")
        if self._lost:
            self._claims.check(owner)
        data = encode(value, self._max_value_bytes)
        if self._checks_values:  # some owner's max policy declares an order
            self._policies.check_value(owner, value, data)
        mode = self._durability if durability is None else check_durability(durability)
        obj = value if type(value) in IMMUTABLE_TYPES else NOT_DECODED
        async with self._gate.call():
            return await self._mode.compare_and_set((owner, key), data, obj, expected_version,
                                                    mode)

    async def delete(
        self, owner: str, key: str, *, durability: Durability | None = None
    ) -> bool:
        """Delete ``(owner, key)``; return whether it had a value.

        False only when the store knows the key had no value. When it cannot know (the key is
        not in memory and the central DB cannot be read) the delete is recorded all the same
        (based on an unknown version, applied when the DB answers) and the answer is True.
        """
        if self._closed:
            raise self._closed_error()
        if self._lost:
            self._claims.check(owner)
        mode = self._durability if durability is None else check_durability(durability)
        async with self._gate.call():
            return await self._mode.delete((owner, key), mode)

    # -- events --------------------------------------------------------------------------

    async def emit(
        self, owner: str, payload: Any, *, watermark: Any, key: str | None = None,
        watermark_key: str = WATERMARK_KEY, durability: Durability | None = None,
        flush: bool = False,
    ) -> int:
        """Emit an event with `payload` and advance ``(owner, watermark_key)`` to `watermark`,
        as one: the central DB commits the event with the watermark in one transaction, once
        per `key` (default: `watermark`'s string form, see `event_key`). Returns the
        watermark's new version once `durability` holds (as `set`).

        The event and the watermark are one local commit (the outbox of the cache file). A
        flush carries the outbox with the dirty state; the central DB de-duplicates by
        ``(owner, key)`` (a replay is a no-op) and refuses the events of an owner this store
        lost (a zombie). For an asset's owner (``asset_watcher:<name>``) the event becomes
        Airflow asset events, as a yielded ``TriggerEvent`` does. Events of one owner reach
        the central DB in emit order. `flush`: start a flush now rather than within
        ``flush_interval``.

        Raises `ValueEncodingError` / `ValueTooLarge` for a payload that is not JSON or is
        larger than ``max_value_bytes``, `InvalidName` for a bad owner or key, and
        `EventsUnsupported` where the event cannot commit with its watermark (``sink =
        airflow``, the cache turned off): nothing is written then.
        """
        if self._closed:
            raise self._closed_error()
        check_name("owner", owner)
        if self._lost:
            self._claims.check(owner)
        data = encode(payload, self._max_value_bytes)
        encode(watermark, self._max_value_bytes)  # refused before the event is staged
        key = event_key(watermark) if key is None else check_name("key", key)
        check_name("watermark_key", watermark_key)
        await self._require_event_sink(owner)
        worker = self._mode.worker
        if worker is None:
            raise EventsUnsupported(
                "emit needs the local cache (enabled = true): with the cache off there is no "
                "outbox to commit the event with its watermark; turn the cache on, or yield a "
                "TriggerEvent and set the watermark (at least once)")
        # Staged before the watermark's write: the cache file commits the event in the same
        # transaction as the watermark or an earlier one, never after it (see Outbox).
        worker.outbox.add(owner, key, data)
        version = await self.set(owner, watermark_key, watermark, durability=durability)
        if flush:
            worker.kick()
        return version

    #: the central DB takes asset events (checked once, by the first emit of an asset)
    _asset_events_ready = False

    async def _require_event_sink(self, owner: str) -> None:
        sink = self.sink
        if sink is None or not carries_events(sink):
            raise EventsUnsupported(
                "emit cannot commit an event with its watermark through the sink "
                f"{self.settings.sink!r}: "
                "Airflow's state store and Airflow's event path are two transactions, so a "
                "crash between them loses or repeats the event. Use sink = api (localstate's "
                "plugin in Airflow's API server) or sink = sql with central_url set to "
                "Airflow's metadata DB; or, for at-least-once, yield a TriggerEvent and then "
                "set the watermark")
        central = self.central_store
        if central is None or asset_name(owner) is None or self._asset_events_ready:
            return
        check = central.asset_events_ready()
        try:
            ready = await (sink.call(check) if isinstance(sink, ThreadedSink) else check)
        except CentralUnavailable:
            return  # not known now: the emit goes on (the flush logs if none can be made)
        if not ready:
            raise EventsUnsupported(
                f"{NO_ASSET_EVENTS}, and {owner}'s central DB {central.url} is not (or Airflow "
                "is not importable here); use sink = api (localstate's plugin in Airflow's API "
                "server), or set central_url to Airflow's metadata DB")
        self._asset_events_ready = True

    def event_figures(self) -> dict[str, OwnerEvents]:
        """Each owner's events since the store opened: emitted, pending (in the outbox now),
        committed, duplicates, refused, and the oldest pending event's time."""
        worker = self._mode.worker
        return {} if worker is None else worker.outbox.by_owner()

    # -- claims --------------------------------------------------------------------------

    @property
    def can_claim(self) -> bool:
        """Whether this store's sink keeps claim epochs (the ``sql`` sink does; Airflow's
        state store, the ``airflow`` sink, does not)."""
        return isinstance(self.sink, ClaimingSink)

    async def claim(self, owner: str, *, unless_claimed_since: float | None = None) -> int:
        """Take `owner` over for this store: bump its claim epoch in the central DB (recording
        this store's ``triggerer_id``), then refresh its keys from there; return the epoch.

        From then on the central DB refuses any flushed write of `owner` from a store that
        holds a lower epoch (a zombie: a triggerer the trigger was moved away from), whatever
        the conflict policy; that store raises `OwnerLost` for its later writes of `owner`.
        Writes this store made before the claim are flushed first, under the claim they were
        made in. Within one claim the conflict policies apply as before.

        `unless_claimed_since` (POSIX time): claim only if nobody claimed `owner` after then;
        `OwnerLost` otherwise (a late claim never takes an owner back from its new holder).
        """
        if self._closed:
            raise self._closed_error()
        check_name("owner", owner)
        sink = claiming_sink(self.sink)
        async with self._gate.call():
            worker, cache = self._mode.worker, self._mode.cache
            return await claim_owner(
                self._claims, sink, owner, claimant=self.triggerer_id,
                writer=cache.writer_id if cache is not None else None, dirty=self._table.dirty,
                flush=worker.flush if worker is not None else None,
                load=self._mode.load if worker is not None else None,
                patience=2 * self.settings.central_transaction_timeout,
                unless_claimed_since=unless_claimed_since)

    def claim_epoch(self, owner: str) -> int:
        """The claim epoch this store holds on `owner` (0: none)."""
        return self._claims.epoch_of(owner)

    @property
    def claims_refused(self) -> int:
        """Flushed writes the central DB refused for their claim epoch."""
        return self._claims.refused

    # -- flushing and figures ------------------------------------------------------------

    async def flush(self) -> FlushReport:
        """Flush every dirty key now (waits for a flush in flight first); report what it did."""
        if self._closed:
            raise self._closed_error()
        async with self._gate.call():
            return await self._mode.flush()

    async def release(self, owner: str, *, timeout: float | None = None) -> ReleaseReport:
        """`owner` left this store: flush its writes, then drop its entries from memory and
        from the cache file once the central DB holds them (see `localstate.release`).

        Waits up to `timeout` seconds (default ``central_timeout``) for the flush; what the
        central DB does not hold by then stays, and is flushed as usual.
        """
        if self._closed:
            raise self._closed_error()
        check_name("owner", owner)
        async with self._gate.call():
            worker = self._mode.worker
            if worker is None:  # the cache is off: nothing is held
                return ReleaseReport()
            wait = self.settings.central_timeout if timeout is None else timeout
            return await release_owner(self._table, worker, owner, wait)

    def unflushed(self, keys: Iterable[StateKey] | None = None) -> list[Unflushed]:
        """The keys whose entry is dirty, or whose last flush lost a conflict, in key order
        (of `keys` only, when given).

        A snapshot (the entries are the store's own: read them, do not change them).
        """
        return self._mode.unflushed(keys)

    async def sync_local(self) -> None:
        """Wait until every write made so far is committed to the local cache file."""
        await self._mode.sync_local()

    def variable(self, key: str, *, owner: str) -> StateVariable:
        """A handle on one state variable: ``await sv.get()``, ``await sv.set(v)``."""
        from localstate.variable import StateVariable

        return StateVariable(key, owner=owner, store=self)
