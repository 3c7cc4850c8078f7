"""Every message one asset event from localstate's queue watchers, with real brokers (Tansu for
Kafka on 3 partitions, ``redis-server``, ``moto_server`` for SQS) and real Airflow 3.3 processes
(``airflow api-server`` with the plugin, two ``airflow triggerer`` with ``sink = api``, the
scheduler, PostgreSQL) under SIGKILLs of a triggerer's process group, zombie takeovers, an API
server restart, a Redis restart, an SQS freeze, a Kafka broker freeze past librdkafka's
request timeout and the Kafka broker unreachable while the Kafka watcher's trigger starts again
(its triggerer SIGKILLed and restarted during a freeze), with non-UTF-8 Kafka keys, binary
Redis fields, Kafka messages and Redis entries over ``max_value_bytes`` mixed into the stream,
and Kafka messages and Redis entries the routes raise on (tests/support/queue_chaos.py over
the events chaos harness, tests/support/events_chaos.py). Airflow's own
``MessageQueueTrigger`` watches the same brokers under the same faults.

Asserted, for each of localstate's watched assets: every produced message has exactly one
``asset_event``, the one the documented policy gives it (an oversize message's event flagged
``"omitted": "too_large"``, where its route sends it; a message whose route raises, whole with
``route_error``, in the Kafka trigger's dead-letter asset or, with none named, the Redis
trigger's own asset), no duplicate, none missing, in order within a Kafka
partition and the Redis stream. Airflow's own triggers' duplicates and missing messages are
measured and printed (Airflow promises at least once there, and less for Redis pub/sub); they
only have to have run.
The long variant (100 kills) is benches/bench_queue_chaos.py.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from events_chaos import Schedule, run
from queue_chaos import malformed, oversize, queue_scenario

from localstate._testing.postgres_server import PostgresServer

pytestmark = pytest.mark.postgres

#: each SIGKILL hits every queue at once: all the watchers run in the two triggerers
KILLS, ZOMBIES, API_RESTARTS = 10, 2, 1


def test_each_message_is_one_asset_event_under_kills_zombies_and_broker_restarts(
        pg_server: PostgresServer, tmp_path: Path) -> None:
    s = Schedule(kills=KILLS, zombies=ZOMBIES, api_restarts=API_RESTARTS, gap=(1.0, 2.0),
                 health_threshold=6.0, rate=4.0, seed=46)
    with queue_scenario(tmp_path) as q:
        o = asyncio.run(run(pg_server, tmp_path, s, scenario=q.scenario))
    scenario, brokers = q.scenario, q.brokers
    report = o.table() + "\n" + "\n".join(o.log)
    print("\n" + o.table())
    print("\n".join(line for line in o.log if "started again" in line or "resumed" in line))
    assert (o.kills, o.zombies, o.api_restarts) == (KILLS, ZOMBIES, API_RESTARTS), report
    assert sorted(o.source_faults) == sorted(scenario.source_faults), report
    assert brokers["redis"].restarts == 1
    # each zombie's triggers were taken over by the other triggerer while it was stopped
    assert o.takeovers == ZOMBIES, report
    emit = {name: f for name, f in o.by_asset.items() if name.startswith("emit_")}
    assert sorted(emit) == ["emit_kafka_dead", "emit_kafka_even", "emit_kafka_odd", "emit_redis",
                            "emit_sqs"]
    # bad messages were in the stream: each one's event is checked against the policy (a
    # flag that does not match counts as a bad extra)
    fed = emit["emit_redis"].fed
    assert sum(map(oversize, range(1, fed + 1))) > 0
    assert sum(map(malformed, range(1, fed + 1))) == emit["emit_kafka_dead"].fed > 0
    # the Kafka watcher started while its broker did not answer, and said so
    [said] = q.down_at_start
    assert said > 0, report
    for name, f in emit.items():
        assert f.fed > 0, name
        assert (f.duplicates, f.missing, f.out_of_order, f.bad_extra) == (0, 0, 0, 0), (
            f"{name}\n{report}")
        assert f.events == f.fed, f"{name}\n{report}"
    # every message of the Kafka topic reached exactly one of the three assets
    assert sum(emit[f"emit_kafka_{a}"].fed for a in ("even", "odd", "dead")) == fed
    # the scheduler turned the events into runs of the DAG that consumes the assets
    assert o.consumer_runs > 0
    # Airflow's own trigger beside each ran under the same faults and was measured
    for name in ("plain_kafka", "plain_redis", "plain_sqs"):
        assert o.by_asset[name].fed == emit["emit_redis"].fed, report
        assert o.by_asset[name].events > 0, f"{name} has no event\n{report}"
