"""Exactly-once watcher events with real Airflow 3.3 processes under kills, zombies and API
server restarts (tests/support/events_chaos.py), beside a plain Airflow watcher under the same
faults.

Asserted: every fed item has exactly one ``asset_event`` from localstate's emitting watcher, in
order, with ``from_trigger`` and the payload in ``extra``. The plain watcher's duplicates and
missing items are measured and printed (Airflow promises nothing there)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from events_chaos import Schedule, run

from localstate._testing.postgres_server import PostgresServer

pytestmark = pytest.mark.postgres


def test_emitted_events_are_exactly_once_under_kills_zombies_and_api_restarts(
        pg_server: PostgresServer, tmp_path: Path) -> None:
    s = Schedule(kills=20, zombies=5, api_restarts=3, gap=(1.0, 3.0), health_threshold=6.0,
                 watchers=2, rate=5.0)
    o = asyncio.run(run(pg_server, tmp_path, s))
    print("\n" + o.table())
    assert (o.kills, o.zombies, o.api_restarts) == (20, 5, 3)
    # each zombie's triggers were taken over by the other triggerer while it was stopped
    assert o.takeovers == 5, o.table() + "\n" + "\n".join(o.log)
    assert o.emit.fed > 0
    assert (o.emit.duplicates, o.emit.missing, o.emit.out_of_order, o.emit.bad_extra) == (
        0, 0, 0, 0), o.table() + "\n" + "\n".join(o.log)
    assert o.emit.events == o.emit.fed
    # the scheduler turned the events into runs of the DAG that consumes the assets
    assert o.consumer_runs > 0
    # the plain watcher ran under the same faults and was measured
    assert o.plain.fed == o.emit.fed
    assert o.plain.events > 0
