"""`read_asset_states`: the records of asset owners as Airflow's own ``asset_state_store`` holds
them, many keys in one query.

What ``sink = airflow`` reads through its accessors one ``aget`` at a time (each a request over
the triggerer's supervisor socket, then an Execution API call), read here in one statement on
Airflow's metadata DB; the localstate API server's ``POST /api/v1/read`` serves it to that sink
(``source = asset_state_store``) when it runs inside Airflow's API server.

Invariant: for each key of an owner ``asset_watcher:<name>``, the answer holds the record the
sink's ``aget`` on the accessor of asset ``<name>`` returns, in the form the sink gives it
(`localstate._sync.sinks.airflow_sink.AirflowSink.read_many`): the value is the stored JSON decoded
as Airflow decodes it and encoded as localstate encodes it, the version `READ_VERSION` (Airflow's
table keeps none), the writer `AIRFLOW_WRITER`. Like the accessor, only an *active* asset
(`ACTIVE_ASSETS`) is read; a key of no active asset, or with no row, is left out. This holds
with Airflow's default state backend (``[state_store] backend``, the metadata DB), which is
where Airflow's accessors write; the server offers the read only then.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Final

from sqlalchemy import bindparam, text

from localstate._cache.entry import StateKey
from localstate._core.codec import encode
from localstate._core.model import asset_name
from localstate._core.rows import CentralRow, posix_time
from localstate._sync.central.asset_mirror import ACTIVE_ASSETS
from localstate._sync.central.central_store import CentralStore
from localstate._sync.sinks.airflow_sink import AIRFLOW_WRITER, READ_VERSION

__all__ = ["read_asset_states"]

#: asset names one statement names (the keys of a batch are few: a watermark, a cursor)
_NAMES_PER_QUERY: Final = 1000
_SELECT: Final = text(
    f"SELECT a.name, s.key, s.value, s.updated_at FROM {ACTIVE_ASSETS} "
    "JOIN asset_state_store s ON s.asset_id = a.id WHERE a.name IN :names AND s.key IN :keys"
).bindparams(bindparam("names", expanding=True), bindparam("keys", expanding=True))


async def read_asset_states(central: CentralStore, keys: Sequence[StateKey]
                            ) -> dict[StateKey, CentralRow]:
    """The records of `keys` (each of an ``asset_watcher:<name>`` owner) in Airflow's
    ``asset_state_store`` on `central`'s database; absent keys are left out."""
    wanted: dict[tuple[str, str], StateKey] = {}
    for owner, key in keys:
        name = asset_name(owner)
        if name is not None:
            wanted[(name, key)] = (owner, key)
    names = sorted({name for name, _ in wanted})
    found: dict[StateKey, CentralRow] = {}
    for start in range(0, len(names), _NAMES_PER_QUERY):
        chunk = set(names[start:start + _NAMES_PER_QUERY])
        query = _SELECT.bindparams(names=sorted(chunk),
                                   keys=sorted({k for n, k in wanted if n in chunk}))
        for name, key, value, updated_at in await central.run_read(
                query, "read Airflow's asset_state_store"):
            k = wanted.get((name, key))
            if k is None:  # the other pairs of the names and keys asked for
                continue
            # as Airflow's Execution API answers an aget (json.loads), then as the sink
            # encodes what the accessor returns
            found[k] = CentralRow(k[0], k[1], encode(json.loads(value)), READ_VERSION,
                                  posix_time(updated_at), AIRFLOW_WRITER)
    return found
