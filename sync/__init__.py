"""localstate._sync: the central metadata DB and the flush to it, in three layers.

Lowest first:

* `central/`: localstate's tables, the engine and dialects, fenced and compare-and-set writes,
  `CentralStore`;
* `sinks/`: where a flush goes (`Sink`, the central store, the REST API, Airflow's state store)
  and the read-through of keys not in memory;
* `flush/`: `SyncWorker`, the settling of its outcomes, waiters, claims and the write budget.

Installed as `localstate._sync` (the folder `sync/` at the top of the repository). Import the
modules themselves (`localstate._sync.central.central_store`, `localstate._sync.flush.worker`,
...): this file imports nothing, so that importing any one of them loads only what it needs.
"""
