"""`BatchReads`: an `AirflowSink`'s reads of many keys in one request, and when it may use them.

The reader is localstate's app in Airflow's API server (`localstate._sync.sinks.api_sink.ApiSink`
reading ``ASSET_STATE_SOURCE``), which answers from Airflow's own ``asset_state_store`` what the
accessors' ``aget`` would, one key at a time (`localstate._sync.sinks.asset_states`). A read that
fails leaves the caller to read through the accessors, and is logged once: a refusal (401, 403, 404:
the token, the address, a server without that read) turns batch reads off for good, any other
failure for `BATCH_RETRY_AFTER` seconds before the next try.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Final, Protocol

from localstate._cache.entry import StateKey
from localstate._core.rows import CentralRow
from localstate.errors import AccessDenied, ConfigError, LocalStateError

__all__ = ["BATCH_RETRY_AFTER", "AssetBatchReader", "BatchReads"]

log = logging.getLogger("localstate.sync.asset_batch_reads")

#: seconds misses go through the accessors after a batch read failed, before the next try
BATCH_RETRY_AFTER: Final = 30.0


class AssetBatchReader(Protocol):
    """Reads many keys of Airflow's ``asset_state_store`` at once, as the accessors would
    answer them one by one (a `localstate._sync.sinks.api_sink.ApiSink` reading from
    ``ASSET_STATE_SOURCE``, on a thread of its own or not)."""

    url: str

    async def read_many(self, keys: Sequence[StateKey]) -> dict[StateKey, CentralRow]: ...

    async def close(self) -> None: ...


class BatchReads:
    """The one owner of a sink's batch reader and of whether it is on, off for good, or
    resting after a failure."""

    def __init__(self) -> None:
        self._reader: AssetBatchReader | None = None
        #: the reader refused for good (its token, its address): accessors only
        self._off = False
        #: the last read failed (what it logged is not logged again until one succeeds)
        self._failing = False
        #: after a failed read, the accessors are used until this time.monotonic()
        self._retry_at = 0.0
        #: batch reads made, and batches left to the accessors because one failed
        self.reads = 0
        self.fallbacks = 0

    def use(self, reader: AssetBatchReader | None) -> None:
        """Read through `reader` from now on (None: no batch reads)."""
        self._reader, self._off, self._failing = reader, False, False

    @property
    def ready(self) -> bool:
        """Whether a batch read would be tried now."""
        return (self._reader is not None and not self._off
                and time.monotonic() >= self._retry_at)

    async def read(self, keys: list[StateKey], found: dict[StateKey, CentralRow]) -> bool:
        """Read `keys` into `found` in one request; False when no read was made or it failed
        (the caller reads them through the accessors: the same records, one ``aget`` each)."""
        reader = self._reader
        if reader is None or not self.ready:
            return False
        try:
            got = await reader.read_many(keys)
        except LocalStateError as exc:
            self.fallbacks += 1
            # refused (the token, the address): for good; else tried again after a while
            permanent = isinstance(exc, AccessDenied | ConfigError)
            self._off = permanent
            self._retry_at = time.monotonic() + BATCH_RETRY_AFTER
            if permanent or not self._failing:
                log.warning(
                    "could not read %d keys of Airflow's asset_state_store in one request "
                    "through %s (%s); misses are read through the triggerer's supervisor, "
                    "one aget per key, %s", len(keys), reader.url, exc,
                    "from now on" if permanent else
                    f"for {BATCH_RETRY_AFTER:g} s at a time until a batch read succeeds")
            self._failing = True
            return False
        if self._failing:
            log.info("reading misses through %s again", reader.url)
            self._failing = False
        self.reads += 1
        found.update((k, got[k]) for k in keys if k in got)
        return True

    async def close(self) -> None:
        """Close the reader, if any; no batch reads after."""
        reader, self._reader = self._reader, None
        if reader is not None:
            await reader.close()
