"""The central DB: localstate's tables (schema, migrations' target), the engine and its
dialects, the fenced and compare-and-set writes, and `CentralStore`, which puts them together.

Built on the foundation and the local cache's types; it knows nothing of sinks or the flush.
This file imports nothing: import the modules themselves.
"""
