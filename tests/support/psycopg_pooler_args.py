"""Airflow's ``[database] sql_alchemy_connect_args`` for psycopg 3 behind a transaction pooler
older than PgBouncer 1.21 (`test_pgbouncer`): psycopg 3 prepares a statement under a name
once it has run it ``prepare_threshold`` times (5), and such a pooler sends the next
transaction's use of that name to a server connection that never saw it. None: nothing is
prepared. (psycopg2, the driver of Airflow's own image, never prepares.)"""

from typing import Any

CONNECT_ARGS: dict[str, Any] = {"prepare_threshold": None}
