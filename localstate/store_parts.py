"""`StoreParts`: what both of a store's modes share, opened once and closed once.

The parts: the sink to the central DB, the read-through in front of it, the store's
`EntryTable`, its name, conflict policies and conflict callback. They are fixed from the open to
the close; the mode in force (`localstate.modes`) reads them, and owns what it opens itself
(the local cache and the sync worker of local-first mode).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from localstate.config import Settings
from localstate.conflicts import PolicyMap
from localstate.entry_table import EntryTable
from localstate.errors import LocalStateError
from localstate.sync.asset_mirror import AssetMirror
from localstate.sync.central_store import CentralStore
from localstate.sync.claims import ClaimBook
from localstate.sync.read_through import ReadThrough
from localstate.sync.settle import ConflictInfo
from localstate.sync.sink_thread import ThreadedSink
from localstate.sync.sinks import Sink

__all__ = ["StoreParts", "open_central", "require_open"]

_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class StoreParts:
    table: EntryTable
    sink: Sink
    reader: ReadThrough
    triggerer_id: str
    policies: PolicyMap
    on_conflict: Callable[[ConflictInfo], None] | None
    #: the claim epochs the store holds and the owners it lost (see `StateStore.claim`)
    claims: ClaimBook
    #: the store opened the sink (and closes it); a sink given to the store is the caller's
    owns_sink: bool

    @classmethod
    async def open(
        cls, settings: Settings, *, table: EntryTable, sink: Sink | None, policies: PolicyMap,
        on_conflict: Callable[[ConflictInfo], None] | None, claims: ClaimBook,
    ) -> StoreParts:
        """Open the sink the settings name (unless one is given) and the read-through."""
        owns_sink = sink is None
        if sink is None:
            sink = await open_central(settings)
        return cls(table=table, sink=sink, reader=ReadThrough(sink),
                   triggerer_id=settings.resolved_triggerer_id, policies=policies,
                   on_conflict=on_conflict, claims=claims, owns_sink=owns_sink)

    async def close(self) -> None:
        """Close the read-through and (when the store opened it) the sink."""
        await self.reader.close()
        if self.owns_sink:
            await self.sink.close()


async def open_central(s: Settings) -> Sink:
    """The sink to the central DB that the settings `s` name."""
    if s.sink == "airflow":
        # Airflow's state store through the triggerer's accessors: they talk over the trigger
        # loop's comms, so this sink runs on the loop the store was opened on, not a thread
        from localstate.sync.airflow_sink import process_sink

        sink = process_sink()
        if s.api_url is not None:
            # with the plugin in Airflow's API server: misses of asset owners read there, one
            # request per batch, instead of one aget each through the supervisor
            sink.use_batch_reads(await _asset_state_reader(s, s.api_url))
        return sink
    if s.sink == "api":
        # a localstate API server over HTTP: no database credentials in this process
        from localstate.sync.api_sink import ApiSink

        return (await ThreadedSink.open(lambda: ApiSink.open(s)) if s.central_thread
                else await ApiSink.open(s))
    url, upgrade = s.resolved_central_url, s.upgrade_schema

    async def opened() -> CentralStore:
        # the store starts during a central outage: it serves its cache and flushes later
        central = await CentralStore.open(url, upgrade_schema=upgrade, defer_if_unreachable=True,
                                          transaction_timeout=s.central_transaction_timeout)
        central.asset_mirror = None if s.asset_mirror == "off" else AssetMirror(s.asset_mirror)
        return central

    if s.central_thread:
        return await ThreadedSink.open(opened)
    return await opened()


async def _asset_state_reader(s: Settings, api_url: str) -> Sink:
    """Reads Airflow's asset_state_store through localstate's app in Airflow's API server
    (`localstate.sync.asset_states`), on a thread of its own when ``central_thread`` is on: a
    batch of misses then costs the trigger loop one turn, not each of the HTTP exchange's."""
    from localstate.protocol import ASSET_STATE_SOURCE
    from localstate.sync.api_sink import ApiSink

    async def reader() -> Sink:
        # a server that hangs delays a batch of misses by at most 10 s; then they are read
        # through the accessors
        return ApiSink(api_url, s.api_token, timeout=min(s.central_timeout, 10.0),
                       read_source=ASSET_STATE_SOURCE)

    return (await ThreadedSink.open(reader, name="localstate-asset-reads") if s.central_thread
            else await reader())


def require_open(part: _T | None) -> _T:
    """A part of the store that exists once it is open (and, for the cache, enabled)."""
    if part is None:
        raise LocalStateError(
            "the store is not open (use `await StateStore.open(...)`), or this call needs the "
            "local cache (enabled=True)"
        )
    return part
