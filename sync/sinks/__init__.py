"""Sinks: where a flush goes and where read-through reads. The `Sink` protocol (`sink`),
`ApiSink` (the REST API, for processes without a database), `AirflowSink` (Airflow's own state
store), a sink on its own thread, and the read-through of keys not in memory.

Built on the central DB (`localstate._sync.central`) and below. This file imports nothing:
import the modules themselves.
"""
