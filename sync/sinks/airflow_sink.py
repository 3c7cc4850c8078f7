"""`AirflowSink`: flushes into Airflow 3.3's asset state store, through a triggerer's accessors.

In an Airflow 3.3 triggerer, each watcher trigger is given ``self.asset_state_store``: accessors
whose ``aget``/``aset``/``adelete`` send a request over the trigger runner's supervisor socket,
which the supervisor turns into an Execution API call and one transaction on Airflow's
``asset_state_store`` table. This sink makes those calls on behalf of the store: one ``aset``
per dirty key per flush (a watermark set 10,000 times between flushes is one call), and one
``aget`` per cache miss. It never opens a database connection itself: the trigger runner may
not (Airflow's ADR 0005), and it does not need to.

Owners map to accessors through an `AccessorRegistry` that the trigger mixin
(`localstate.airflow.trigger`) fills when a trigger starts running. A dirty key whose owner has
no accessor yet (its trigger has not started in this process) stays dirty until one registers.

The accessors talk over the trigger loop's comms, so this sink runs on that loop: the store
uses it directly, never through `localstate._sync.sinks.sink_thread.ThreadedSink`.

Pipelining: the runner's comms (``TriggerCommsDecoder.asend``) tag each request with an id and
match the answers as they come, so up to `AirflowSink.in_flight` calls are sent without waiting
for the previous answer, and the trigger loop never waits on one. The supervisor serializes them
all the same: ``TriggerRunnerSupervisor.run_once`` reads at most one request frame per
iteration of its loop, and each iteration also runs ``load_triggers`` (metadata-DB queries), the
event handling and the heartbeat. So Airflow answers about one request per supervisor iteration
(tens of ms), whatever the runner does: that is this sink's throughput limit (README,
"Measured limits of sink = airflow"). A deep pipeline would only queue the runner's own state
messages (``TriggerStateChanges``) behind the sink's, so `IN_FLIGHT` is small.

Batched reads (`AirflowSink.use_batch_reads`; the store sets it up when ``api_url`` is set):
a batch of misses of owners registered by asset name (``asset_watcher:<name>``, one accessor
addressing the asset by that name) is read in ONE request from localstate's app in Airflow's
API server, which reads Airflow's own ``asset_state_store`` rows
(`localstate._sync.sinks.asset_states`: the records the accessors' ``aget`` would give, since this
sink writes through those accessors), and no supervisor round trip is spent on it; so are the values
a flush under ``max`` compares with. Other owners, and every write, still go through the accessors.
A batch read that fails is made through the accessors instead
(`localstate._sync.sinks.asset_batch_reads` decides when to try again).

A flush is bounded: rows are taken oldest-dirty first (the order `write_batch` gets them in), and
no new row is started after `AirflowSink.flush_budget` seconds; the rest stay dirty, at the head
of the next flush. Each lane always writes its first row, so every flush makes progress.

Fencing: Airflow's table has no version column, so a write cannot be made conditional on the
record it was based on. Under a ``max`` policy the sink reads the stored value first and skips
the write when the stored one is not smaller (read-compare-write); between that read and the
write another writer's larger value can still be overwritten (the window is one ``aget`` plus
one ``aset`` round trip). With batch reads, a flush reads the stored values of its rows in one
request before its first write instead of one ``aget`` each, halving the supervisor requests of
a flush; the window is then the flush itself (at most `flush_budget` plus one ``aset``). A
greater value overwritten in the window comes back with that writer's next flush of the key,
which finds a smaller value that is not its own and writes its own again. The table keeps no
writer either: a stored value that is the one this sink last wrote for the key, at the version
the row is based on, counts as this writer's own record, and a sequential write on top of it
lands whatever the order says (as in the SQL sink).
Other policies write unconditionally: ``reject`` cannot be enforced and behaves as
``last_writer_wins``.

Nothing here imports Airflow: the accessors are duck-typed, so this module is importable (and
testable) without it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import Any, Final, Protocol

from localstate._cache.entry import StateKey
from localstate._core.codec import decode, encode
from localstate._core.conflicts import ConflictPolicy, PolicyMap
from localstate._core.lanes import in_lanes
from localstate._core.model import ASSET_OWNER_PREFIX
from localstate._core.rows import CentralRow, DirtyRow, FlushOutcome
from localstate._sync.sinks.asset_batch_reads import AssetBatchReader, BatchReads
from localstate.errors import CentralUnavailable, ConfigError

__all__ = ["AccessorRegistry", "AirflowSink", "AssetAccessor", "process_sink"]

log = logging.getLogger("localstate.sync.airflow_sink")

#: `updated_by` of records read from Airflow's store: it keeps no writer id localstate can use
AIRFLOW_WRITER: Final = "airflow"
#: the version given to a record read from Airflow's store, which keeps no version
READ_VERSION: Final = 1
#: accessor calls kept in flight at once by a flush or a batch of reads
IN_FLIGHT: Final = 4
#: seconds after which a flush starts no new row (the rest wait for the next flush)
FLUSH_BUDGET: Final = 2.0


class AssetAccessor(Protocol):
    """What the sink needs of Airflow's ``AssetStateStoreAccessor`` (one asset's store)."""

    async def aget(self, key: str, default: Any = None) -> Any: ...

    async def aset(self, key: str, value: Any) -> None: ...

    async def adelete(self, key: str) -> None: ...


class AccessorRegistry:
    """Which accessors hold the state of each owner (several: written to each, read from the
    first). Filled when triggers start; entries stay, so a key written by a trigger that has
    since stopped is still flushed."""

    def __init__(self) -> None:
        self._by_owner: dict[str, tuple[AssetAccessor, ...]] = {}
        #: owners ``asset_watcher:<name>`` whose one accessor is Airflow's by that asset name
        self._by_name: set[str] = set()

    def register(self, owner: str, accessors: Sequence[AssetAccessor], *,
                 asset: str | None = None) -> None:
        """`asset`: the name the one accessor addresses its asset by (None: by URI, several
        accessors, or values that do not live in ``asset_state_store`` as they are)."""
        if not accessors:
            return
        self._by_owner[owner] = tuple(accessors)
        if asset is not None and len(accessors) == 1 and owner == ASSET_OWNER_PREFIX + asset:
            self._by_name.add(owner)
        else:
            self._by_name.discard(owner)

    def lookup(self, owner: str) -> tuple[AssetAccessor, ...]:
        return self._by_owner.get(owner, ())

    def by_asset_name(self, owner: str) -> bool:
        """Whether `owner`'s records are Airflow's rows of the asset its name names: what
        `read_asset_states` reads (an owner hashed from a long name, or of an asset
        addressed by URI, is not)."""
        return owner in self._by_name

    def owners(self) -> list[str]:
        return sorted(self._by_owner)


class AirflowSink:
    """A `localstate._sync.sinks.sink.Sink` over Airflow's asset state store accessors."""

    url = "airflow:asset_state_store"

    def __init__(self, registry: AccessorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else AccessorRegistry()
        self._writes = 0
        #: aget calls made (read-through and the max policy's read-compare-write)
        self.reads = 0
        #: dirty rows left for a later flush because their owner had no accessor yet
        self.unroutable = 0
        self._warned: set[str] = set()
        #: under max, what this sink last wrote of each key: (local version, JSON text)
        self._own: dict[StateKey, tuple[int, str]] = {}
        #: accessor calls kept in flight at once (pipelined over the supervisor's socket)
        self.in_flight = IN_FLIGHT
        #: seconds after which a flush starts no new row
        self.flush_budget = FLUSH_BUDGET
        #: dirty rows a flush left for the next one because its budget ran out
        self.deferred = 0
        #: reads of asset owners' keys in one request instead of by aget (`use_batch_reads`)
        self._batch = BatchReads()

    @property
    def batch_reads(self) -> int:
        """Batch reads made (`use_batch_reads`)."""
        return self._batch.reads

    @property
    def batch_fallbacks(self) -> int:
        """Batches read through the accessors because a batch read failed."""
        return self._batch.fallbacks

    @property
    def transactions(self) -> int:
        """aset/adelete calls: each is one transaction on Airflow's side."""
        return self._writes

    @property
    def rows_written(self) -> int:
        return self._writes

    def _accessors(self, owner: str) -> tuple[AssetAccessor, ...]:
        accessors = self.registry.lookup(owner)
        if not accessors and owner not in self._warned:
            self._warned.add(owner)
            log.warning(
                "no Airflow asset state store accessor is registered for owner %r in this "
                "process; its writes stay in the local cache until a trigger of that owner "
                "starts here (use the localstate trigger mixin on a watcher trigger)", owner,
            )
        return accessors

    async def write_batch(
        self, rows: Sequence[DirtyRow], policies: PolicyMap, *, writer: str | None = None
    ) -> list[FlushOutcome]:
        # `writer` is not kept: Airflow's table has no column for it (nor for versions)
        outcomes = [FlushOutcome(row, "retry", None) for row in rows]  # until written
        attempted = 0
        failed: list[CentralUnavailable] = []
        deadline = asyncio.get_running_loop().time() + self.flush_budget
        stored = await self._read_stored(rows, policies)

        async def write(i: int, row: DirtyRow) -> None:
            nonlocal attempted
            accessors = self._accessors(row.owner)
            if not accessors:
                self.unroutable += 1
                return
            attempted += 1
            try:
                outcomes[i] = await self._write_row(row, accessors, policies, stored)
            except CentralUnavailable as exc:
                # one asset's failure (deleted, inactive) must not hold back the others' keys
                failed.append(exc)

        self.deferred += await in_lanes(rows, write, self.in_flight, deadline)
        if failed and len(failed) == attempted:
            raise failed[-1]  # nothing got through: the worker backs off and retries
        if failed:
            log.warning("%d of %d keys could not be written to Airflow's asset state store "
                        "and stay dirty (last error: %s)", len(failed), attempted, failed[-1])
        return outcomes

    async def _read_stored(self, rows: Sequence[DirtyRow], policies: PolicyMap
                           ) -> dict[StateKey, str | None]:
        """The stored values the ``max`` policy compares with, for the rows of asset owners,
        read in ONE batch request where batch reads are on (an empty answer otherwise, or when
        it fails: each row's ``aget`` reads its own). Each saves the flush one supervisor
        request of its two; see the module docstring for the fence's window."""
        if not self._batch.ready:
            return {}
        keys = [(r.owner, r.key) for r in rows if r.data is not None
                and self.registry.by_asset_name(r.owner) and policies.for_owner(r.owner).is_max]
        found: dict[StateKey, CentralRow] = {}
        if not keys or not await self._batch.read(keys, found):
            return {}
        return {k: (found[k].data if k in found else None) for k in keys}

    async def _write_row(self, row: DirtyRow, accessors: tuple[AssetAccessor, ...],
                         policies: PolicyMap, stored: dict[StateKey, str | None]
                         ) -> FlushOutcome:
        policy = policies.for_owner(row.owner)
        if policy.is_max:
            if row.data is not None:
                k = (row.owner, row.key)
                now = stored[k] if k in stored else await self._get(accessors[0], row.key)
                return await self._write_max(row, row.data, now, policy, accessors)
            self._own.pop((row.owner, row.key), None)
        for accessor in accessors:
            await self._put(accessor, row.key, row.data)
        return self._written(row)

    async def _write_max(self, row: DirtyRow, data: str, stored: str | None,
                         policy: ConflictPolicy, accessors: tuple[AssetAccessor, ...]
                         ) -> FlushOutcome:
        """Compare-write: `row` (not a deletion) goes in unless Airflow holds (`stored`, as
        read before) another writer's value that it does not exceed."""
        k = (row.owner, row.key)
        if stored is not None and self._own.get(k) != (row.base_version, stored) and (
                not policy.exceeds(row.owner, data, stored, strictly=False)):
            # Airflow holds a greater watermark (another triggerer moved it on): keep it, as
            # the SQL sink's max policy does
            self._own.pop(k, None)
            central = CentralRow(row.owner, row.key, stored, row.version, time.time(),
                                 AIRFLOW_WRITER)
            return FlushOutcome(row, "adopted", central, conflict=True, policy=policy.spec)
        if stored != data:  # else already there: no write needed
            for accessor in accessors:
                await self._put(accessor, row.key, data)
        self._own[k] = (row.version, data)
        return self._written(row)

    @staticmethod
    def _written(row: DirtyRow) -> FlushOutcome:
        # Airflow keeps no version: the record is at whatever version the local write had
        return FlushOutcome(row, "written", CentralRow(
            row.owner, row.key, row.data, row.version, row.updated_at, row.updated_by,
        ))

    async def _get(self, accessor: AssetAccessor, key: str) -> str | None:
        self.reads += 1
        try:
            value = await accessor.aget(key, None)
        except Exception as exc:
            raise CentralUnavailable(
                f"Airflow's asset state store did not answer a read of {key!r} through "
                f"{accessor!r}: {exc}; the triggerer's supervisor or the Execution API is "
                "down, the write stays in the local cache and is retried"
            ) from exc
        # Airflow's accessors cannot store None: None means "no record"
        return None if value is None else encode(value)

    async def _put(self, accessor: AssetAccessor, key: str, data: str | None) -> None:
        try:
            if data is None:
                await accessor.adelete(key)
            else:
                await accessor.aset(key, decode(data))
        except Exception as exc:
            raise CentralUnavailable(
                f"Airflow's asset state store did not take {key!r} through {accessor!r}: "
                f"{exc}; the write stays in the local cache and is retried at the next flush"
            ) from exc
        self._writes += 1

    def use_batch_reads(self, reader: AssetBatchReader | None) -> None:
        """Read the misses of owners registered by asset name through `reader`, one call per
        batch of misses, instead of one ``aget`` each (None: accessors only). Writes always go
        through the accessors. The sink closes `reader` (`close`)."""
        self._batch.use(reader)

    async def read_many(self, keys: Sequence[StateKey]) -> dict[StateKey, CentralRow]:
        found: dict[StateKey, CentralRow] = {}
        if self._batch.ready:
            batched = [k for k in keys if self.registry.by_asset_name(k[0])]
            if batched and await self._batch.read(batched, found):
                taken = set(batched)
                keys = [k for k in keys if k not in taken]

        async def read(_i: int, k: StateKey) -> None:
            accessors = self.registry.lookup(k[0])
            if not accessors:
                return  # no accessor: nothing Airflow could tell us, the key is new here
            data = await self._get(accessors[0], k[1])
            if data is not None:
                found[k] = CentralRow(k[0], k[1], data, READ_VERSION, time.time(),
                                      AIRFLOW_WRITER)

        await in_lanes(keys, read, self.in_flight, None)
        return found

    async def read_owner(self, owner: str) -> list[CentralRow]:
        """Airflow's store cannot list an asset's keys: this sink reports none (`load(owner)`
        refreshes nothing; misses still read through key by key)."""
        return []

    async def write_direct(
        self, owner: str, key: str, data: str | None, *, updated_at: float, updated_by: str,
        writer: str | None = None,
    ) -> CentralRow:
        accessors = self.registry.lookup(owner)
        if not accessors:
            raise CentralUnavailable(
                f"no Airflow asset state store accessor is registered for owner {owner!r}: "
                "with the cache off every write goes straight to Airflow, which needs the "
                "trigger of that owner running in this process (the localstate trigger mixin)"
            )
        for accessor in accessors:
            await self._put(accessor, key, data)
        return CentralRow(owner, key, data, READ_VERSION, updated_at, updated_by)

    async def delete_current(self, owner: str, key: str, *, updated_by: str,
                             writer: str | None = None) -> bool:
        """Airflow's store keeps no versions: a read, then an unconditional delete (two
        concurrent deletes may both answer True)."""
        found = (await self.read_many([(owner, key)])).get((owner, key))
        if found is None or found.data is None:
            return False
        await self.write_direct(owner, key, None, updated_at=time.time(), updated_by=updated_by)
        return True

    async def write_if_version(
        self, owner: str, key: str, data: str | None, expected_version: int, *,
        updated_by: str, updated_at: float | None = None, writer: str | None = None,
    ) -> CentralRow:
        raise ConfigError(
            f"compare_and_set of {owner}/{key} with the cache off needs a central DB that keeps "
            "versions: Airflow's asset state store has none (sink = airflow). Turn the cache on "
            "(enabled = true), or use sink = sql"
        )

    async def close(self) -> None:
        """Close the batch reader, if any (the accessors belong to the triggerer)."""
        await self._batch.close()


_PROCESS_SINK: AirflowSink | None = None


def process_sink() -> AirflowSink:
    """The sink (and registry) of this process: one trigger runner, one registry."""
    global _PROCESS_SINK
    if _PROCESS_SINK is None:
        _PROCESS_SINK = AirflowSink()
    return _PROCESS_SINK
