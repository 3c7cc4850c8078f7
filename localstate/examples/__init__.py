"""Examples: a state-enabled Asset Watcher trigger over a SQL table, and its DAG file."""
