"""Every message one asset event, with real Airflow 3.3 processes and real brokers, under
triggerer kills, zombies, an API server restart, a Redis restart and a frozen SQS endpoint
(tests/queue_chaos.py on the harness of tests/events_chaos.py), beside Airflow's own
``MessageQueueTrigger`` on the same brokers.

Asserted: every produced message has exactly one ``asset_event`` from localstate's watchers
(Kafka fanned out to two assets by parity, in order per partition; Redis Streams in order;
SQS, which promises no order, once each). Airflow's own triggers' duplicates and missing
messages are measured and printed."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from events_chaos import Schedule, run
from queue_chaos import queue_scenario

from localstate._testing.postgres_server import PostgresServer

pytestmark = pytest.mark.postgres


def test_each_message_is_one_asset_event_under_kills_zombies_and_broker_faults(
        pg_server: PostgresServer, tmp_path: Path) -> None:
    s = Schedule(kills=10, zombies=2, api_restarts=1, gap=(1.0, 3.0), health_threshold=6.0,
                 rate=2.0)  # below moto's ReceiveMessage rate here (~5-12 messages/s)
    with queue_scenario(tmp_path) as (scenario, _brokers):
        o = asyncio.run(run(pg_server, tmp_path, s, scenario=scenario))
    print("\n" + o.table())
    detail = o.table() + "\n" + "\n".join(o.log)
    assert (o.kills, o.zombies, o.api_restarts) == (10, 2, 1)
    assert sorted(o.source_faults) == ["Redis killed and restarted", "SQS endpoint frozen 5 s"]
    assert o.takeovers == 2, detail
    assert o.emit.fed > 0
    assert (o.emit.duplicates, o.emit.missing, o.emit.out_of_order, o.emit.bad_extra) == (
        0, 0, 0, 0), detail
    assert o.emit.events == o.emit.fed
    for name in ("emit_kafka_even", "emit_kafka_odd", "emit_redis", "emit_sqs"):
        assert o.by_asset[name].events == o.by_asset[name].fed > 0, detail
    assert o.consumer_runs > 0
    # Airflow's own triggers ran on the same brokers under the same faults, and were measured
    assert o.plain.fed == o.emit.fed
