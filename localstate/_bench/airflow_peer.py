"""The Airflow peer of the benchmark: Airflow 3.3's ``MetastoreBackend.aset``, one call each.

What a state write costs in Airflow's own state store, measured in the same run as the store
and on the same database: each call a transaction of its own (a new session, the upsert, the
commit), as Airflow's Execution API route makes it for every ``asset_state_store.aset`` of a
watcher. Measured when Airflow is installed and the benchmark's central DB is an Airflow
metadata database (``airflow db migrate`` ran on it: localstate's table can live beside
Airflow's); otherwise the reason is reported instead.

Airflow is imported only here, and only when it is installed.
"""

from __future__ import annotations

import importlib.util
import time
import uuid
from typing import Any

from sqlalchemy import inspect
from sqlalchemy.ext.asyncio import AsyncSession

from localstate._sync.central.engine import make_engine

__all__ = ["measure_metastore_aset"]


async def measure_metastore_aset(url: str, calls: int = 500) -> tuple[float | None, str]:
    """(calls/s, note) of ``MetastoreBackend.aset`` on `url`; (None, why) when it cannot run."""
    if importlib.util.find_spec("airflow") is None:
        return None, "apache-airflow is not installed (pip install 'localstate[airflow]')"
    engine = make_engine(url)
    try:
        async with engine.connect() as conn:
            tables = set(await conn.run_sync(lambda c: inspect(c).get_table_names()))
        if not {"asset", "asset_state_store"} <= tables:
            return None, (
                "the central DB has no Airflow 3.3 metadata tables: run `airflow db migrate` "
                "on it (localstate's table can live in Airflow's metadata DB) to measure "
                "Airflow's MetastoreBackend.aset beside the store"
            )
        return await _measure(engine, calls)
    finally:
        await engine.dispose()


async def _measure(engine: Any, calls: int) -> tuple[float, str]:
    from airflow.models.asset import AssetModel
    from airflow.state import AssetScope
    from airflow.state.metastore import MetastoreBackend

    name = f"localstate-bench-{uuid.uuid4().hex[:12]}"
    async with AsyncSession(engine) as session:
        asset = AssetModel(name=name, uri=f"localstate-bench://{name}")
        session.add(asset)
        await session.flush()
        asset_id = asset.id  # read before the commit expires it (no lazy loads in async)
        await session.commit()
    backend = MetastoreBackend()
    scope = AssetScope(asset_id=asset_id)
    try:
        started = time.perf_counter()
        for i in range(calls):
            # one session and one commit per call: what each watcher aset costs Airflow
            async with AsyncSession(engine) as session:
                await backend.aset(scope, "watermark", str(i), session=session)
                await session.commit()
        elapsed = time.perf_counter() - started
    finally:
        async with AsyncSession(engine) as session:
            doomed = await session.get(AssetModel, asset_id)
            if doomed is not None:
                await session.delete(doomed)  # its state rows go with it (ON DELETE CASCADE)
            await session.commit()
    return calls / elapsed, f"MetastoreBackend.aset, {calls} calls, one transaction each"
