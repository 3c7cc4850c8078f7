"""sync: the central metadata DB (schema, sinks) and the worker that flushes to it."""

from sync.central_store import CentralStore
from sync.conflicts import ConflictPolicy, PolicyMap
from sync.rows import CentralRow, DirtyRow, FlushOutcome
from sync.schema import LATEST_VERSION, upgrade
from sync.sinks import Sink
from sync.worker import ConflictInfo, FlushReport, SyncWorker

__all__ = [
    "LATEST_VERSION",
    "CentralRow",
    "CentralStore",
    "ConflictInfo",
    "ConflictPolicy",
    "DirtyRow",
    "FlushOutcome",
    "FlushReport",
    "PolicyMap",
    "Sink",
    "SyncWorker",
    "upgrade",
]
