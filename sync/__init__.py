"""localstate._sync: the central metadata DB (schema, sinks) and the worker that flushes to it.

Installed as `localstate._sync` (the folder `sync/` at the top of the repository). Import the
modules themselves (`localstate._sync.central_store`, `localstate._sync.worker`, ...): this file
imports nothing, so that importing any one of them loads only what it needs.
"""
