"""The flush: `SyncWorker` and its named steps (collect dirty, write batch, mark clean), the
settling of a flush's outcomes, the waiters of `central` durability, claim epochs and the write
budget.

The top of `sync/`: built on the sinks and below, used by the store. This file imports
nothing: import the modules themselves.
"""
