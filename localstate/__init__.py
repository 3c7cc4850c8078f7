"""localstate: a fast, durable place for the watermarks and cursors of Airflow triggers.

    async with StateStore(central_url="postgresql://...") as store:
        await store.set("asset_watcher:orders", "watermark", 41)
        await store.get("asset_watcher:orders", "watermark")

Without an event loop: `BlockingStateStore` and `localstate.blocking.StateVariable`. Through
the REST API server: `localstate.client.StateClient` / `AsyncStateClient` (the ``client``
extra, httpx).
"""

from typing import TYPE_CHECKING, Any

from localstate._core.config import Settings
from localstate._core.model import UNSET, Durability, FlushState, Record, Unset
from localstate._core.setting_specs import LIVE_SETTINGS
from localstate._core.version import __version__
from localstate.errors import (
    AccessDenied,
    CacheCorrupt,
    CacheError,
    CacheFull,
    CacheLocked,
    CachePathNotWritable,
    CacheWriteFailed,
    CentralError,
    CentralUnavailable,
    ConfigError,
    EventsUnsupported,
    InvalidInput,
    InvalidName,
    LocalStateError,
    OwnerLost,
    SchemaError,
    SourcePositionLost,
    StoreClosed,
    ValueEncodingError,
    ValueTooLarge,
    VersionConflict,
    VersionExhausted,
    WriteRejected,
)

if TYPE_CHECKING:
    from localstate._core.reload import ConfigWatcher
    from localstate._stats import StoreStats
    from localstate._store import ReleaseReport, StateStore, StateVariable
    from localstate._sync.flush.settle import ConflictInfo, FlushReport
    from localstate.blocking import BlockingStateStore

# The store and what is built on it load on first use, not with the package: importing a lower
# layer (`localstate.errors`, `localstate._core.codec`, `localstate._core.conflicts`, ...) runs this
# file first, and it must not pull in the store, which imports `localstate._sync` back.
_LAZY = {
    "BlockingStateStore": "localstate.blocking",
    "ConfigWatcher": "localstate._core.reload",
    "ConflictInfo": "localstate._sync.flush.settle",
    "FlushReport": "localstate._sync.flush.settle",
    "ReleaseReport": "localstate._store",
    "StoreStats": "localstate._stats",
    "StateStore": "localstate._store",
    "StateVariable": "localstate._store",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'localstate' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "LIVE_SETTINGS",
    "UNSET",
    "AccessDenied",
    "BlockingStateStore",
    "CacheCorrupt",
    "CacheError",
    "CacheFull",
    "CacheLocked",
    "CachePathNotWritable",
    "CacheWriteFailed",
    "CentralError",
    "CentralUnavailable",
    "ConfigError",
    "ConfigWatcher",
    "ConflictInfo",
    "Durability",
    "EventsUnsupported",
    "FlushReport",
    "FlushState",
    "InvalidInput",
    "InvalidName",
    "LocalStateError",
    "OwnerLost",
    "Record",
    "ReleaseReport",
    "SchemaError",
    "Settings",
    "SourcePositionLost",
    "StateStore",
    "StateVariable",
    "StoreClosed",
    "StoreStats",
    "Unset",
    "ValueEncodingError",
    "ValueTooLarge",
    "VersionConflict",
    "VersionExhausted",
    "WriteRejected",
    "__version__",
]
