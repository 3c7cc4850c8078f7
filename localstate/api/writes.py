"""The REST API's writes: each one statement on the central DB, answered from its own result.

A PUT or DELETE is linearizable: it takes effect at the commit of one central statement (an
unconditional upsert, or a conditional write that checks the *committed* version), and its
answer is that statement's own row, never a read made after it (which could show another
request's write). The serving `StateStore` is not written through: its in-memory entries and
its flush play no part, so a pending write of its own is never what a compare-and-set is
compared with, and no entry of it is moved by these writes. The store is the API's owner of
settings and lifetime only; like any other writer (a triggerer, the CLI), a process that also
writes these keys through the store meets the API's writes at its flush's version fence.
"""

from __future__ import annotations

import time

from localstate.entry import StateKey
from localstate.errors import StoreClosed
from localstate.rows import CentralRow
from localstate.store import StateStore
from localstate.sync.central_store import CentralStore

__all__ = ["delete_current", "delete_if_version", "put", "require_open"]


def require_open(store: StateStore) -> None:
    """Writes answer 503 once the serving store is closed (the server is shutting down)."""
    if store.closed:
        raise StoreClosed("the serving store is closed: the API server is shutting down")


async def put(store: StateStore, central: CentralStore, k: StateKey, data: str,
              expected_version: int | None, *, by: str) -> CentralRow:
    """Write `data` (JSON text) to `k`: unconditionally, or only over `expected_version`.

    Returns the row this write committed. `VersionConflict` when the committed version is not
    `expected_version` (nothing written).
    """
    require_open(store)
    if expected_version is None:
        return await central.write_direct(k[0], k[1], data, updated_at=time.time(),
                                          updated_by=by)
    return await central.write_if_version(k[0], k[1], data, expected_version,
                                          updated_by=by)


async def delete_if_version(store: StateStore, central: CentralStore, k: StateKey,
                            expected_version: int, *, by: str) -> None:
    """Delete `k` only if its committed version is `expected_version`; else `VersionConflict`."""
    require_open(store)
    await central.write_if_version(k[0], k[1], None, expected_version,
                                   updated_by=by)


async def delete_current(store: StateStore, central: CentralStore, k: StateKey, *,
                         by: str) -> bool:
    """Delete whatever value `k` has; False when it has none (see
    `CentralStore.delete_current`: a compare-and-delete on the value it read)."""
    require_open(store)
    return await central.delete_current(k[0], k[1], updated_by=by)
