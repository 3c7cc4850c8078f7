"""Metrics: real StatsD packets on a loopback UDP socket, and OpenTelemetry instruments read
back through the SDK's in-memory reader."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import StoreFactory

from localstate._metrics import MetricsReporter, Sample, StatsdClient


class StatsdServer:
    """A UDP socket on 127.0.0.1 that collects StatsD lines."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.setblocking(False)
        self.port: int = self.sock.getsockname()[1]
        self.packets: list[bytes] = []

    def drain(self) -> None:
        while True:
            try:
                self.packets.append(self.sock.recv(65536))
            except BlockingIOError:
                return

    async def wait_for(self, predicate: Any, timeout: float = 20.0) -> None:
        """Receive until `predicate(self)` holds (bounded: fails after `timeout` s)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            self.drain()
            if predicate(self):
                return
            assert loop.time() < deadline, f"no such StatsD packets; got {self.lines()}"
            await asyncio.sleep(0.02)

    def lines(self) -> list[str]:
        return [line for p in self.packets for line in p.decode().split("\n") if line]

    def parsed(self) -> list[tuple[str, float, str]]:
        out = []
        for line in self.lines():
            name, _, rest = line.partition(":")
            value, _, kind = rest.partition("|")
            out.append((name, float(value), kind))
        return out

    def total(self, name: str) -> float:
        return sum(v for n, v, k in self.parsed() if n == name and k == "c")

    def last(self, name: str) -> tuple[float, str] | None:
        found = [(v, k) for n, v, k in self.parsed() if n == name]
        return found[-1] if found else None


@pytest.fixture
def statsd() -> Iterator[StatsdServer]:
    server = StatsdServer()
    yield server
    server.sock.close()


async def test_close_reports_every_metric_under_the_prefix(open_store: StoreFactory,
                                                           statsd: StatsdServer) -> None:
    store = await open_store(statsd_host="127.0.0.1", statsd_port=statsd.port,
                             statsd_prefix="airflow.localstate", metrics_interval=3600)
    for n in range(5):
        await store.set("dag:m", f"k{n % 3}", n)  # 5 sets of 3 keys
    await store.flush()
    await store.set("dag:m", "late", 1)  # dirty when the store closes
    await store.close()
    await statsd.wait_for(lambda s: s.last("airflow.localstate.dirty_keys") is not None)
    p = "airflow.localstate"
    assert statsd.total(f"{p}.set") == 6
    assert statsd.total(f"{p}.flush.rows") == 4  # 3 keys, then the late one at close
    duration = statsd.last(f"{p}.flush.duration")
    assert duration is not None
    assert duration[1] == "ms"
    assert duration[0] >= 0
    assert statsd.last(f"{p}.dirty_keys") == (0.0, "g")
    assert statsd.last(f"{p}.flush_lag") == (0.0, "g")
    assert statsd.total(f"{p}.conflicts") == 0
    assert statsd.total(f"{p}.central_errors") == 0
    names = {n for n, _, _ in statsd.parsed()}
    assert all(n.startswith(p + ".") for n in names)


async def test_the_reporter_samples_every_interval_counters_as_deltas(
    open_store: StoreFactory, statsd: StatsdServer
) -> None:
    store = await open_store(statsd_host="127.0.0.1", statsd_port=statsd.port,
                             metrics_interval=0.05)
    for n in range(10):
        await store.set("dag:m", "k", n)
    await statsd.wait_for(lambda s: s.total("localstate.set") >= 10)
    gauge = statsd.last("localstate.dirty_keys")
    assert gauge is not None
    assert gauge == (1.0, "g")  # one key, written 10 times, not flushed yet
    lag = statsd.last("localstate.flush_lag")
    assert lag is not None
    assert lag[0] > 0
    for n in range(7):
        await store.set("dag:m", "k", n)
    await statsd.wait_for(lambda s: s.total("localstate.set") >= 17)
    await store.close()
    statsd.drain()
    assert statsd.total("localstate.set") == 17  # deltas: no set counted twice


async def test_conflicts_are_counted(open_store: StoreFactory, statsd: StatsdServer) -> None:
    store = await open_store(statsd_host="127.0.0.1", statsd_port=statsd.port,
                             metrics_interval=3600)
    other = await open_store()
    await store.set("dag:c", "k", 1, durability="central")
    assert await other.get("dag:c", "k") == 1
    await other.set("dag:c", "k", 2, durability="central")
    await store.set("dag:c", "k", 3)  # based on v1
    await store.flush()
    await store.close()
    await statsd.wait_for(lambda s: s.last("localstate.dirty_keys") is not None)
    assert statsd.total("localstate.conflicts") == 1


async def test_central_errors_are_counted(tmp_path: Path, statsd: StatsdServer) -> None:
    from localstate import CentralUnavailable, StateStore
    from localstate._sync.central_store import CentralStore
    from localstate._sync.engine import make_engine

    gone = CentralStore(make_engine("postgresql://nobody@127.0.0.1:1/none"))
    store = await StateStore.open(
        cache_path=tmp_path / "c.db", triggerer_id="t", sink=gone, flush_interval=3600,
        close_timeout=0.5, statsd_host="127.0.0.1", statsd_port=statsd.port,
        metrics_interval=3600)
    try:
        await store.set("dag:e", "k", 1)
        with pytest.raises(CentralUnavailable):
            await store.flush()
    finally:
        await store.close()
        await gone.close()
    await statsd.wait_for(lambda s: s.last("localstate.dirty_keys") is not None)
    assert statsd.total("localstate.central_errors") >= 1
    assert statsd.last("localstate.dirty_keys") == (1.0, "g")


async def test_many_lines_are_split_into_packets_under_the_mtu(statsd: StatsdServer) -> None:
    client = StatsdClient("127.0.0.1", statsd.port, "p")
    lines = [f"p.metric_{n:03d}:{n}|c" for n in range(200)]
    await client.send(lines)
    client.close()
    await statsd.wait_for(lambda s: len(s.lines()) == 200)
    assert len(statsd.packets) > 1
    assert all(len(p) <= 1400 for p in statsd.packets)
    assert statsd.lines() == lines


async def test_statsd_lines_skip_zero_counters_and_format_values() -> None:
    client = StatsdClient("127.0.0.1", 8125, "x")
    lines = client.lines(Sample(counters={"set": 3, "conflicts": 0}, gauges={
        "dirty_keys": 2.0, "flush_lag": 0.12345}, flush_duration_s=0.25))
    assert lines == ["x.set:3|c", "x.flush.duration:250.000|ms", "x.dirty_keys:2|g",
                     "x.flush_lag:0.123|g"]


async def test_nobody_listening_costs_the_store_nothing(open_store: StoreFactory) -> None:
    closed = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()  # nothing listens on `port` now
    store = await open_store(statsd_host="127.0.0.1", statsd_port=port, metrics_interval=0.02)
    for n in range(50):
        await store.set("dag:n", "k", n)
        await asyncio.sleep(0.005)
    await store.flush()
    assert await store.get("dag:n", "k") == 49
    await store.close()


async def test_metrics_are_off_by_default(open_store: StoreFactory) -> None:
    store = await open_store()
    assert store._metrics is None


@pytest.fixture(scope="session")
def otel_reader() -> Iterator[Any]:
    """The SDK as the process's one global meter provider (it can be set only once)."""
    from opentelemetry import metrics
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    metrics.set_meter_provider(provider)
    yield reader
    provider.shutdown()


async def test_opentelemetry_instruments(open_store: StoreFactory, otel_reader: Any,
                                         backend: str) -> None:
    tid = f"otel-store-{backend}"
    store = await open_store(triggerer_id=tid, otel=True, metrics_interval=3600,
                             statsd_prefix="otel_test")
    for n in range(4):
        await store.set("dag:o", f"k{n}", n)
    await store.set("dag:o", "pending", 1)
    reporter = store._metrics
    assert isinstance(reporter, MetricsReporter)
    assert reporter.statsd is None
    await store.flush()
    await store.set("dag:o", "pending", 2)
    await reporter.report_now()
    data = otel_reader.get_metrics_data()
    assert data is not None
    found: dict[str, list[Any]] = {}
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                found.setdefault(m.name, []).extend(m.data.data_points)

    def points(name: str) -> list[Any]:
        return [p for p in found.get(name, [])
                if dict(p.attributes or {}).get("triggerer_id") == tid]

    def value(name: str) -> float:
        (point,) = points(name)
        return float(point.value)

    assert value("otel_test.set") == 6
    assert value("otel_test.flush.rows") == 5
    assert value("otel_test.dirty_keys") == 1
    assert value("otel_test.flush_lag") > 0
    (duration,) = points("otel_test.flush.duration")
    assert duration.count == 1
    await store.close()
    # a closed store is no longer observed
    data = otel_reader.get_metrics_data()
    gauges = [p for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics
              if m.name == "otel_test.dirty_keys" for p in m.data.data_points
              if dict(p.attributes or {}).get("triggerer_id") == tid]
    assert gauges == []
