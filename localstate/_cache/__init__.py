"""The local cache: a triggerer's own state, in memory and in its SQLite file (WAL).

`EntryTable` owns the entries in memory (dirty keys, absent keys, owners, eviction);
`LocalCache` owns the cache file, its connection and the group commit; the outbox holds the
events waiting for a flush. Built on the foundation (`localstate._core`) only: nothing here
knows the central DB. This file imports nothing: import the modules themselves.
"""
