"""`StateEnabledTrigger`: watermarks for Airflow event triggers, served by the local cache.

Put the mixin before ``BaseEventTrigger``::

    class OrdersTrigger(StateEnabledTrigger, BaseEventTrigger):
        async def run(self):
            last = await self.get_watermark(default=0)
            ...
            await self.set_watermark(new_last)   # a dict update plus the local commit

Inside ``run()``:

* ``await self.get_watermark(default=None)`` / ``await self.set_watermark(value)``;
* ``await self.emit(payload, watermark=v)``: an asset event committed with the watermark it
  advances, exactly once (instead of yielding a ``TriggerEvent`` and then setting it);
  ``await self.emit_many([(key, payload), ...], watermark=v)`` for a batch, one commit, and
  with ``routes=`` to send each event to some of the watched assets (fan-out);
* ``self.state``: the watermark as a `StateVariable` (``await self.state.get()``), and
  ``self.state_variable(key)`` for other keys of the same owner;
* ``self.asset_state_store``: code written against Airflow 3.3's own API keeps working, and its
  ``aget``/``aset`` (and ``get``/``set``, ``[asset]``) go through the local cache too.

The owner of the state is the watched asset (``asset_watcher:<asset name>``, the same owner the
drop-in uses, so both views share keys as Airflow's own store does); a trigger watching several
assets, or none (outside a watcher), is ``trigger:<classpath>:<sha256 of its kwargs>``: the same
trigger on another triggerer finds the same state.

Where the state lands is the ``sink`` setting: ``airflow`` flushes into Airflow's
``asset_state_store`` through the accessors the triggerer injected (registered here when the
trigger starts running); ``sql`` into localstate's own central table.

Handovers. When the state opens (the trigger starts on this triggerer), the trigger claims its
owner (`StateStore.claim`): a new claim epoch, after which the central DB refuses the writes of
the triggerer it was moved away from, should that one still be running (a zombie). A zombie's
store raises `OwnerLost`; ``run()`` then ends quietly (the trigger stops). A trigger watching
several assets also claims each asset's owner, at its first emit. The ``airflow`` sink
keeps no claims: there nothing is claimed and a zombie is not fenced (see the README).

A claim the central DB cannot complete now (down, or slow: every claim is bounded by
``central_transaction_timeout`` and retried for twice that), the owner's or an asset's, never
fails the trigger: it runs on from its cache, as in an outage, and claims again in the
background with backoff, *unless another triggerer claimed the owner since this one first
tried* (the claim is conditional, in one transaction): a late claim never takes a trigger, or
an asset, back from the triggerer it moved to. Meanwhile the owner's writes (and events) stay
in this store (`StateStore.claim`'s ``hold``): they go out under the claim once it is made,
never under the previous holder's, which would refuse them while the run goes on past them.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import json
import logging
import time
import weakref
from collections.abc import AsyncGenerator, Callable, Collection, Coroutine, Sequence
from typing import Any, ClassVar, Final, TypeVar, cast

import greenback
from airflow.sdk.execution_time.context import AssetStateStoreAccessor, AssetStateStoreAccessors

import localstate.airflow._shutdown as shutdown
from localstate._core.backoff import Backoff
from localstate._core.model import MAX_NAME_LENGTH, Durability
from localstate._store import StateStore, StateVariable, process_store
from localstate._sync.sinks.airflow_sink import process_sink
from localstate.airflow._runner_gc import freeze_startup_heap
from localstate.errors import (
    CentralUnavailable,
    InvalidInput,
    LocalStateError,
    OwnerLost,
    reason,
)

__all__ = ["StateEnabledTrigger", "asset_owner", "trigger_owner", "trigger_store"]

log = logging.getLogger("localstate.airflow.trigger")

_T = TypeVar("_T")
_ASSET_PREFIX: Final = "asset_watcher:"


def asset_owner(name: str) -> str:
    """The owner of an asset's state: ``asset_watcher:<name>`` (hashed when too long)."""
    owner = _ASSET_PREFIX + name
    if len(owner) <= MAX_NAME_LENGTH and name.isprintable():
        return owner
    return f"{_ASSET_PREFIX}sha256:{hashlib.sha256(name.encode()).hexdigest()}"


def _worker_state_backend() -> str:
    """Airflow's ``[workers] state_store_backend`` (empty: values live in its own table)."""
    from airflow.configuration import conf

    return str(conf.get("workers", "state_store_backend", fallback="") or "")


def trigger_owner(classpath: str, kwargs: dict[str, Any]) -> str:
    """``trigger:<classpath>:<hash>``: stable across processes and triggerers (sorted JSON of
    the serialized kwargs, not Python's per-process ``hash``)."""
    text = json.dumps(kwargs, sort_keys=True, default=str, separators=(",", ":"))
    digest = hashlib.sha256(f"{classpath}\0{text}".encode()).hexdigest()[:32]
    owner = f"trigger:{classpath}:{digest}"
    if len(owner) > MAX_NAME_LENGTH:
        owner = f"trigger:sha256:{hashlib.sha256(owner.encode()).hexdigest()}"
    return owner


async def trigger_store() -> StateStore:
    """The process's store (`StateVariable`'s default), opened from the settings once."""
    return await process_store()


def _run_sync(coro: Coroutine[Any, Any, _T]) -> _T:
    """A sync accessor call inside ``run()``: as Airflow's own, through greenback's portal."""
    if not greenback.has_portal():
        coro.close()
        raise RuntimeError(
            "a synchronous asset_state_store call needs greenback's portal (the triggerer "
            "opens one unless AIRFLOW_DISABLE_GREENBACK_PORTAL is set); use aget/aset instead"
        )
    return greenback.await_(coro)


class LocalAssetStateStoreAccessor(AssetStateStoreAccessor):
    """One asset's state through the local cache; Airflow's accessor is what the sink uses."""

    def __init__(self, inner: AssetStateStoreAccessor, owner: str,
                 asset: str | None = None) -> None:
        # Airflow's accessor keeps its asset's name and uri private (no public reader)
        super().__init__(name=inner._name, uri=inner._uri)
        self.inner = inner
        self.owner = owner
        #: the asset's name when `inner` addresses it by name (None: by URI)
        self.asset = asset

    async def aget(self, key: str, default: Any = None) -> Any:
        await shutdown.gate()
        return await (await trigger_store()).get(self.owner, key, default)

    async def aset(self, key: str, value: Any) -> None:
        if value is None:
            raise ValueError("Cannot set value as None")  # Airflow's rule: use adelete
        await shutdown.gate()
        await (await trigger_store()).set(self.owner, key, value)

    async def adelete(self, key: str) -> None:
        await shutdown.gate()
        await (await trigger_store()).delete(self.owner, key)

    async def aclear(self) -> None:
        store = await trigger_store()
        keys = [record.key async for record in store.items(self.owner)]
        for key in keys:
            await store.delete(self.owner, key)
        await self.inner.aclear()  # keys this cache never saw live only in Airflow's store

    def get(self, key: str, default: Any = None) -> Any:
        return _run_sync(self.aget(key, default))

    def set(self, key: str, value: Any) -> None:
        _run_sync(self.aset(key, value))

    def delete(self, key: str) -> None:
        _run_sync(self.adelete(key))

    def clear(self) -> None:
        _run_sync(self.aclear())


class LocalAssetStateStoreAccessors(AssetStateStoreAccessors):
    """Airflow's ``AssetStateStoreAccessors`` (same API, ``isinstance`` holds), served locally."""

    def __init__(self, inner: AssetStateStoreAccessors) -> None:
        super().__init__(inlets=[])
        self.inner = inner
        # Airflow keeps a task's accessors only in these dicts (no public way to list them)
        by_name, by_uri = inner._by_name, inner._by_uri
        self._by_name = {
            name: LocalAssetStateStoreAccessor(acc, asset_owner(name), asset=name)
            for name, acc in by_name.items()
        }
        self._by_uri = {
            uri: LocalAssetStateStoreAccessor(acc, asset_owner(uri)) for uri, acc in by_uri.items()
        }
        self._total = len(self._by_name) + len(self._by_uri)

    def owners(self) -> dict[str, AssetStateStoreAccessor]:
        """Each asset's owner with Airflow's own accessor for it (what the sink writes to)."""
        return {local.owner: local.inner for local in self._locals()}

    def asset_names(self) -> dict[str, str]:
        """The owners whose accessor addresses its asset by name, with that name."""
        return {local.owner: local.asset for local in self._locals() if local.asset is not None}

    def _locals(self) -> list[LocalAssetStateStoreAccessor]:
        return [local for local in (*self._by_name.values(), *self._by_uri.values())
                if isinstance(local, LocalAssetStateStoreAccessor)]


class StateEnabledTrigger:
    """Mixin for ``BaseEventTrigger`` subclasses: local-first watermarks (see the module doc)."""

    #: the key `get_watermark`/`set_watermark`/`state` use
    watermark_key: ClassVar[str] = "watermark"
    #: seconds `cleanup()` spends flushing before the trigger leaves this triggerer
    cleanup_flush_timeout: ClassVar[float] = 5.0
    #: delete this trigger's ``trigger:`` state centrally when ``run()`` ends by itself (its
    #: last event fired: the task is done with it). At-least-once: a triggerer that dies
    #: after that but before Airflow has stored the event runs the trigger again elsewhere,
    #: from no state. Off by default; an ``asset_watcher:`` owner (the asset's) is never deleted
    forget_state_when_done: ClassVar[bool] = False

    _localstate_accessors: LocalAssetStateStoreAccessors | None = None
    _localstate_store: StateStore | None = None
    _localstate_owner: str | None = None
    #: the background claims (by owner) of the owners whose claim could not complete
    _localstate_claiming: dict[str, asyncio.Task[None]] | None = None
    #: the owners with a claim made, or in flight in the background
    _localstate_claimed: frozenset[str] = frozenset()

    # -- Airflow's attribute, intercepted ------------------------------------------------

    @property
    def asset_state_store(self) -> AssetStateStoreAccessors | None:
        return self._localstate_accessors

    @asset_state_store.setter
    def asset_state_store(self, accessors: AssetStateStoreAccessors | None) -> None:
        # BaseEventTrigger.__init__ sets None; the triggerer sets Airflow's accessors for the
        # watched assets before run(): keep those for the sink, hand out local ones
        if isinstance(accessors, LocalAssetStateStoreAccessors):
            accessors = accessors.inner
        self._localstate_accessors = (
            None if accessors is None else LocalAssetStateStoreAccessors(accessors)
        )
        self._localstate_owner = None
        if accessors is not None:
            self._register_accessors()

    def _register_accessors(self) -> None:
        """Tell the Airflow sink which of Airflow's accessors hold this trigger's owners."""
        accessors = self._localstate_accessors
        if accessors is None:
            return
        registry = process_sink().registry
        by_owner = accessors.owners()
        # a worker-side state backend keeps values elsewhere and only references in Airflow's
        # table: then only the accessors read them as they are
        names = {} if _worker_state_backend() else accessors.asset_names()
        for owner, inner in by_owner.items():
            registry.register(owner, [inner], asset=names.get(owner))
        if self.state_owner not in by_owner:  # several assets: the watermark goes to each
            registry.register(self.state_owner, list(by_owner.values()))

    # -- the owner -----------------------------------------------------------------------

    @property
    def state_owner(self) -> str:
        """``asset_watcher:<name>`` for one watched asset, else ``trigger:<classpath>:<hash>``."""
        if self._localstate_owner is None:
            accessors = self._localstate_accessors
            owners = list(accessors.owners()) if accessors is not None else []
            if len(owners) == 1:
                self._localstate_owner = owners[0]
            else:
                # serialize() comes from the trigger class this mixin is combined with
                classpath, kwargs = cast(Any, self).serialize()
                self._localstate_owner = trigger_owner(classpath, kwargs)
        return self._localstate_owner

    def event_owners(self) -> list[str]:
        """The owners this trigger's events and watermarks go to: its own and its watched
        assets'."""
        accessors = self._localstate_accessors
        assets = [] if accessors is None else list(accessors.owners())
        return [self.state_owner, *(a for a in assets if a != self.state_owner)]

    # -- opening -------------------------------------------------------------------------

    async def open_state(self) -> StateStore:
        """Open (once) the process's store and register this trigger's accessors for the sink.

        Runs by itself before the first event of ``run()``; call it to use the state earlier.
        """
        await shutdown.gate()  # a graceful stop holds every call from its start
        if self._localstate_store is not None and not self._localstate_store.closed:
            return self._localstate_store
        self._register_accessors()
        store = await trigger_store()
        self._localstate_claimed = frozenset()  # claims are the store's: none in this one yet
        if store.can_claim:
            await self._claim(store, [self.state_owner])
        self._localstate_store = store
        if shutdown.install(store):  # in Airflow's trigger runner: a graceful stop flushes
            freeze_startup_heap()  # and full collections skip the start-up heap
        return store

    async def _claim(self, store: StateStore, owners: Collection[str]) -> None:
        """Claim each of `owners` not claimed yet (this trigger's owner when it opens, the
        watched assets' at the first emit): now, or, where the central DB cannot complete the
        claim now, in the background (`_claim_later`), never failing the trigger.

        Held (`StateStore.claim`'s ``hold``): until an owner's claim is made, its writes and
        events stay in this store rather than go out under the previous holder's claim and
        be refused while the run goes on past them."""
        for owner in owners:
            if owner in self._localstate_claimed:
                continue
            started = time.time()
            try:
                await store.claim(owner, hold=True)
            except CentralUnavailable as exc:
                # local-first: the trigger runs from its cache and claims in the background;
                # the store's claim FailureLog says so (once per outage, not per trigger)
                log.debug("could not claim %s (%s); running from the local cache and claiming "
                          "again in the background", owner, reason(exc))
                if self._localstate_claiming is None:
                    self._localstate_claiming = {}
                self._localstate_claiming[owner] = asyncio.create_task(
                    self._claim_later(store, owner, started), name=f"claim {owner}")
            self._localstate_claimed |= {owner}

    async def _claim_later(self, store: StateStore, owner: str, started: float) -> None:
        """Claim `owner` once the central DB lets us, unless another triggerer claimed it
        after `started`, this trigger's first attempt (then this trigger's writes of it raise
        `OwnerLost` and ``run()`` ends)."""
        backoff = Backoff(base=1.0, cap=30.0)
        while not store.closed:
            await asyncio.sleep(backoff.next_delay())
            try:
                epoch = await store.claim(owner, unless_claimed_since=started)
            except CentralUnavailable:
                continue
            except OwnerLost as exc:
                log.warning("%s was claimed by another triggerer meanwhile (epoch %d): this "
                            "trigger's writes of it are refused", owner, exc.current)
                return
            except LocalStateError as exc:  # closed meanwhile, or a setting changed
                log.warning("gave up claiming %s: %s", owner, reason(exc))
                return
            log.debug("claimed %s (epoch %d) after %d tries", owner, epoch, backoff.failures)
            return

    def _open_store(self) -> StateStore:
        store = self._localstate_store
        if store is None or store.closed:
            raise LocalStateError(
                "the trigger's state opens when run() starts; before that, call "
                "`await self.open_state()`"
            )
        return store

    # -- the API -------------------------------------------------------------------------

    @property
    def state(self) -> StateVariable:
        """The watermark as a `StateVariable` of this trigger's owner."""
        return self.state_variable(self.watermark_key)

    def state_variable(self, key: str) -> StateVariable:
        return StateVariable(key, owner=self.state_owner, store=self._open_store())

    async def get_watermark(self, default: Any = None) -> Any:
        """The watermark (`default` when it has none). Not in the local cache and the central
        DB out of reach: waits for it, retrying with backoff, rather than fail the trigger or
        answer `default` for a watermark that exists (a watcher would start over)."""
        store = await self.open_state()
        backoff = Backoff(base=0.5, cap=30.0)
        while True:
            try:
                value = await store.get(self.state_owner, self.watermark_key, default)
            except CentralUnavailable as exc:
                if not backoff.failures:  # the read-through's FailureLog warns, once an outage
                    log.debug("cannot read %s's watermark (%s); waiting for the central DB",
                              self.state_owner, reason(exc))
                await asyncio.sleep(backoff.next_delay())
                continue
            if backoff.failures:
                log.debug("read %s's watermark after %d tries", self.state_owner,
                          backoff.failures)
            return value

    async def forget_state(self) -> int:
        """Delete every key of this trigger's ``trigger:`` owner, centrally (tombstones, which
        `localstate db prune` removes later); return how many had a value. An
        ``asset_watcher:`` owner is the asset's, shared with others: it is left alone (0)."""
        owner = self.state_owner
        if not owner.startswith("trigger:"):
            return 0
        store = await self.open_state()
        await store.load(owner)
        keys = [record.key async for record in store.items(owner)]
        for key in keys:
            await store.delete(owner, key)
        await store.release(owner, timeout=self.cleanup_flush_timeout)
        return len(keys)

    async def set_watermark(self, value: Any) -> int:
        """Set the watermark; returns its new local version once the store's durability holds."""
        store = await self.open_state()
        return await store.set(self.state_owner, self.watermark_key, value)

    async def emit(self, payload: Any, *, watermark: Any, key: str | None = None,
                   flush: bool = False) -> int:
        """Emit an asset event with `payload` and advance the watermark to `watermark`, as
        one (`StateStore.emit`): the event reaches Airflow exactly once, committed with the
        watermark, de-duplicated by `key` (default: the watermark's string form). Do not also
        yield a ``TriggerEvent`` for the item. `flush`: flush now, not within
        ``flush_interval``. Returns the watermark's new local version.

        A trigger watching several assets emits the event for each (each asset's owner keeps
        the watermark too), then sets its own watermark: a crash part-way re-emits the item
        after the restart, and the assets that had it see no duplicate."""
        store = await self.open_state()
        owner = self.state_owner
        accessors = self._localstate_accessors
        assets = [] if accessors is None else list(accessors.owners())
        if owner in assets or not assets:
            return await store.emit(owner, payload, watermark=watermark, key=key,
                                    watermark_key=self.watermark_key, flush=flush)
        if store.can_claim:  # their events and watermarks are fenced as the owner's are
            await self._claim(store, assets)
        for asset in assets:
            await store.emit(asset, payload, watermark=watermark, key=key,
                             watermark_key=self.watermark_key, flush=flush)
        return await store.set(owner, self.watermark_key, watermark)

    async def emit_many(
        self, events: Sequence[tuple[str, Any]], *, watermark: Any,
        routes: Sequence[Collection[str]] | None = None,
        durability: Durability | None = None, flush: bool = False,
    ) -> int:
        """Emit a batch of events, each ``(key, payload)``, and advance the watermark past
        them, as one local commit (`StateStore.emit_many`): a poll that returned many
        messages costs one commit, not one per message. Returns the watermark's new version.

        `routes`: fan-out, one entry per event, the names of the watched assets that get it
        (an empty one: none, the message is only passed; the trigger's `state_owner`: its
        own record, an asset event only when that owner is a watched asset's). Without it
        every watched asset gets every event. Each asset's events are committed with the
        watermark, de-duplicated by key, so a re-emit after a crash repeats nothing. An asset
        name this trigger does not watch is refused (`InvalidInput`) before anything is written.

        ``durability="central"``: returns once the central DB holds the events (see
        `StateStore.emit`), for a source that must be told (an SQS delete).
        """
        store = await self.open_state()
        owner = self.state_owner
        accessors = self._localstate_accessors
        assets = {} if accessors is None else accessors.owners()
        if routes is None and (owner in assets or not assets):
            return await store.emit_many(owner, events, watermark=watermark,
                                         watermark_key=self.watermark_key,
                                         durability=durability, flush=flush)
        by_owner = self._route(events, routes, list(assets))
        if store.can_claim:  # their events and watermarks are fenced as the owner's are
            await self._claim(store, assets)
        # each asset's events, staged (in memory) before the owner's watermark: the commit
        # that carries the watermark carries them too, or an earlier one did
        for asset, batch in by_owner.items():
            if asset != owner:
                await store.emit_many(asset, batch, watermark=watermark,
                                      watermark_key=self.watermark_key, durability="memory")
        own = by_owner.get(owner, [])
        writes = [store.emit_many(owner, own, watermark=watermark,
                                  watermark_key=self.watermark_key, durability=durability,
                                  flush=flush)]
        if durability == "central":  # and the assets' events are held centrally too
            writes += [store.set(asset, self.watermark_key, watermark, durability="central")
                       for asset in by_owner if asset != owner]
        versions = await asyncio.gather(*writes)
        return versions[0]

    def _route(self, events: Sequence[tuple[str, Any]],
               routes: Sequence[Collection[str]] | None, assets: list[str],
               ) -> dict[str, list[tuple[str, Any]]]:
        """The events of each watched asset's owner (`assets`: every one gets each event
        when `routes` is None)."""
        if routes is None:
            return {asset: list(events) for asset in assets}
        if len(routes) != len(events):
            raise InvalidInput(f"{len(routes)} routes for {len(events)} events: give one "
                               "collection of asset names per event")
        accessors = self._localstate_accessors
        names = {} if accessors is None else {
            name: owner for owner, name in accessors.asset_names().items()}
        out: dict[str, list[tuple[str, Any]]] = {}
        own = self.state_owner  # a route may name the trigger's own owner too
        for event, targets in zip(events, routes, strict=True):
            for name in targets:
                owner = names.get(name, own if name == own else None)
                if owner is None:
                    raise InvalidInput(
                        f"an event is routed to the asset {name!r}, which this trigger does "
                        f"not watch (it watches {sorted(names) or 'none'}): give the asset "
                        "an AssetWatcher with this trigger, or route to a watched one")
                out.setdefault(owner, []).append(event)
        return out

    async def cleanup(self) -> None:
        """Leaving this triggerer (moved, stopped, done): release the owner's state (flushed,
        so the next triggerer starts from here, then dropped from this one's memory and cache
        file: `StateStore.release`)."""
        claiming, self._localstate_claiming = self._localstate_claiming, None
        waited = [owner for owner, task in (claiming or {}).items() if not task.done()]
        for task in (claiming or {}).values():
            task.cancel()
        store = self._localstate_store
        if store is not None and not store.closed:
            # the watched assets' claims not made yet: their events held here wait for them no
            # longer, so they go out, fenced (the trigger's own owner: `release`, below)
            for owner in waited:
                if owner != self.state_owner:
                    store.abandon_claim(owner)
        # after a graceful stop's drain (`localstate.airflow._shutdown`) there is nothing left
        # to flush from the mixin's writes, and the airflow sink's channel is gone
        if store is not None and not store.closed and not shutdown.drained():
            try:
                report = await store.release(self.state_owner,
                                             timeout=self.cleanup_flush_timeout)
            except LocalStateError as exc:
                log.warning("could not release %s's state on cleanup (%s); it stays in the "
                            "local cache and is flushed later", self.state_owner, reason(exc))
            else:
                if report.refused:  # for good: no later flush will carry them
                    log.warning("%d writes of %s were refused: another triggerer claimed it "
                                "(epoch %s) and holds it now", report.refused,
                                self.state_owner, report.claimed_at_epoch)
                if report.unflushed:
                    log.warning("could not flush %d writes of %s on cleanup within %g s; they "
                                "stay in the local cache and are flushed later",
                                report.unflushed, self.state_owner,
                                self.cleanup_flush_timeout)
        parent: Any = super()
        if hasattr(parent, "cleanup"):
            await parent.cleanup()

    # -- run() opens the state first -----------------------------------------------------

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # the run() this class will use, its own or inherited (a mixed-in trigger class
        # written before the mixin has no run() of its own)
        run = getattr(cls, "run", None)
        if (run is not None and not getattr(run, "__isabstractmethod__", False)
                and run not in _OPENING_STATE):
            setattr(cls, "run", _opening_state(run))  # noqa: B010 (mypy: run is not ours)


def _opening_state(
    run: Callable[..., AsyncGenerator[Any, None]],
) -> Callable[..., AsyncGenerator[Any, None]]:
    @functools.wraps(run)
    async def wrapped(self: StateEnabledTrigger, *args: Any, **kwargs: Any
                      ) -> AsyncGenerator[Any, None]:
        await self.open_state()
        try:
            async with contextlib.aclosing(run(self, *args, **kwargs)) as events:
                async for event in events:
                    yield event
        except OwnerLost as exc:
            # another triggerer claimed this trigger's owner: this one is a zombie, stop
            log.warning("trigger of %s stops here: %s", exc.owner, exc)
            return
        if self.forget_state_when_done:  # run() ended by itself: the task is done with it
            try:
                await self.forget_state()
            except LocalStateError as exc:
                log.warning("could not delete %s's state (%s); it stays", self.state_owner, exc)

    _OPENING_STATE.add(wrapped)
    return wrapped


#: the run() methods wrapped by `_opening_state` (a subclass inheriting one is not rewrapped)
_OPENING_STATE: weakref.WeakSet[Callable[..., AsyncGenerator[Any, None]]] = weakref.WeakSet()
