"""Metrics: real StatsD packets on a loopback UDP socket, and OpenTelemetry instruments read
back through the SDK's in-memory reader."""

from __future__ import annotations

import asyncio
import re
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import StoreFactory
from otel_prometheus_fleet import TRIGGERERS
from prometheus_server import PrometheusServer

from localstate._metrics import COUNTERS, GAUGES, MetricsReporter, Sample, StatsdClient

#: the triggerer_id of the first store `open_store` opens: the last segment of its StatsD names
T1 = "triggerer-1"


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
    await statsd.wait_for(lambda s: s.last(f"airflow.localstate.dirty_keys.{T1}") is not None)
    p = "airflow.localstate"
    assert statsd.total(f"{p}.set.{T1}") == 6
    assert statsd.total(f"{p}.flush.rows.{T1}") == 4  # 3 keys, then the late one at close
    duration = statsd.last(f"{p}.flush.duration.{T1}")
    assert duration is not None
    assert duration[1] == "ms"
    assert duration[0] >= 0
    assert statsd.last(f"{p}.dirty_keys.{T1}") == (0.0, "g")
    assert statsd.last(f"{p}.flush_lag.{T1}") == (0.0, "g")
    assert statsd.total(f"{p}.conflicts.{T1}") == 0
    assert statsd.total(f"{p}.central_errors.{T1}") == 0
    names = {n for n, _, _ in statsd.parsed()}
    assert all(n.startswith(p + ".") and n.endswith(f".{T1}") for n in names)


async def test_the_reporter_samples_every_interval_counters_as_deltas(
    open_store: StoreFactory, statsd: StatsdServer
) -> None:
    store = await open_store(statsd_host="127.0.0.1", statsd_port=statsd.port,
                             metrics_interval=0.05)
    for n in range(10):
        await store.set("dag:m", "k", n)
    await statsd.wait_for(lambda s: s.total(f"localstate.set.{T1}") >= 10)
    gauge = statsd.last(f"localstate.dirty_keys.{T1}")
    assert gauge is not None
    assert gauge == (1.0, "g")  # one key, written 10 times, not flushed yet
    lag = statsd.last(f"localstate.flush_lag.{T1}")
    assert lag is not None
    assert lag[0] > 0
    for n in range(7):
        await store.set("dag:m", "k", n)
    await statsd.wait_for(lambda s: s.total(f"localstate.set.{T1}") >= 17)
    await store.close()
    statsd.drain()
    assert statsd.total(f"localstate.set.{T1}") == 17  # deltas: no set counted twice


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
    await statsd.wait_for(lambda s: s.last(f"localstate.dirty_keys.{T1}") is not None)
    assert statsd.total(f"localstate.conflicts.{T1}") == 1


async def test_central_errors_are_counted(tmp_path: Path, statsd: StatsdServer) -> None:
    from localstate import CentralUnavailable, StateStore
    from localstate._sync.central.central_store import CentralStore
    from localstate._sync.central.engine import make_engine

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
    await statsd.wait_for(lambda s: s.last("localstate.dirty_keys.t") is not None)
    assert statsd.total("localstate.central_errors.t") >= 1
    assert statsd.last("localstate.dirty_keys.t") == (1.0, "g")


#: a fleet's triggerer ids -> the StatsD name segment each becomes
FLEET = {"tr-a": "tr-a", "host.example.com": "host_example_com", "tr:c@2": "tr_c_2"}


@pytest.mark.parametrize("tags", [False, True], ids=["in-the-name", "dogstatsd-tags"])
async def test_a_fleet_of_stores_reports_each_gauge_per_triggerer(
    open_store: StoreFactory, statsd: StatsdServer, tags: bool,
) -> None:
    """Three stores, three triggerers, one StatsD server: each triggerer's gauges arrive under
    names (or tags) of their own, so none hides another; the counters sum to the fleet's."""
    stores = [await open_store(triggerer_id=tid, statsd_host="127.0.0.1",
                               statsd_port=statsd.port, statsd_tags=tags,
                               metrics_interval=3600) for tid in FLEET]
    for n, store in enumerate(stores, start=1):
        for k in range(n):  # n dirty keys in the n-th store, none flushed
            await store.set("dag:fleet", f"k{k}", k)
    for store in stores:
        reporter = store._metrics
        assert isinstance(reporter, MetricsReporter)
        await reporter.report_now()
    await statsd.wait_for(lambda s: len([line for line in s.lines()
                                         if "dirty_keys" in line]) == len(FLEET))
    gauges: dict[str, float] = {}
    sets: dict[str, float] = {}
    for line in statsd.lines():
        metric, _, rest = line.partition(":")
        value, kind, *tag = rest.split("|")
        if tags:
            assert tag, line
            assert tag[0].startswith("#triggerer_id:"), line
            name, who = metric, tag[0].removeprefix("#triggerer_id:")
        else:
            assert not tag, line
            name, _, who = metric.rpartition(".")
        if name == "localstate.dirty_keys":
            assert kind == "g"
            gauges[who] = float(value)
        elif name == "localstate.set":
            assert kind == "c"
            sets[who] = sets.get(who, 0) + float(value)
    assert gauges == {segment: n for n, segment in enumerate(FLEET.values(), start=1)}
    assert sets == gauges  # one set per key
    assert sum(sets.values()) == 6  # the fleet's sets: the sum of its triggerers'


async def test_statsd_lines_name_their_triggerer() -> None:
    sample = Sample(counters={"set": 3}, gauges={"dirty_keys": 2.0}, flush_duration_s=0.25)
    named = StatsdClient("127.0.0.1", 8125, "x", triggerer_id="h.example:1")
    assert named.lines(sample) == ["x.set.h_example_1:3|c",
                                   "x.flush.duration.h_example_1:250.000|ms",
                                   "x.dirty_keys.h_example_1:2|g"]
    tagged = StatsdClient("127.0.0.1", 8125, "x", triggerer_id="h.example:1", tags=True)
    assert tagged.lines(sample) == ["x.set:3|c|#triggerer_id:h_example_1",
                                    "x.flush.duration:250.000|ms|#triggerer_id:h_example_1",
                                    "x.dirty_keys:2|g|#triggerer_id:h_example_1"]


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


async def test_prometheus_scraping_the_opentelemetry_exporter_has_one_series_per_triggerer(
    tmp_path: Path,
) -> None:
    """Three stores of three triggerers in a process whose meter provider exports through
    OpenTelemetry's Prometheus exporter (`otel_prometheus_fleet.py`); a real Prometheus
    scrapes it: each gauge is one series per triggerer, and the fleet's counters sum."""
    port = _free_port()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(Path(__file__).parents[1] / "support" / "otel_prometheus_fleet.py"),
        str(port), str(tmp_path), stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
    assert proc.stdout is not None
    assert proc.stdin is not None
    try:
        assert await asyncio.wait_for(proc.stdout.readline(), 120) == b"READY\n"
        with PrometheusServer([f"127.0.0.1:{port}"]) as prometheus:
            def scraped() -> list[dict[str, Any]]:
                return prometheus.query("localstate_dirty_keys")

            deadline = time.monotonic() + 60
            while len(series := await asyncio.to_thread(scraped)) < len(TRIGGERERS):
                assert time.monotonic() < deadline, (series, prometheus.log())
                await asyncio.sleep(0.5)
            dirty = {s["metric"]["triggerer_id"]: float(s["value"][1]) for s in series}
            lag = await asyncio.to_thread(prometheus.query, "localstate_flush_lag_seconds")
            total = await asyncio.to_thread(prometheus.query, "sum(localstate_set_total)")
        async with httpx.AsyncClient(timeout=30) as http:
            exposition = (await http.get(f"http://127.0.0.1:{port}/metrics")).text
    finally:
        proc.stdin.write(b"quit\n")
        await proc.stdin.drain()
        assert await asyncio.wait_for(proc.wait(), 60) == 0
    assert dirty == {tid: n for n, tid in enumerate(TRIGGERERS, start=1)}
    assert sorted(s["metric"]["triggerer_id"] for s in lag) == sorted(TRIGGERERS)
    assert [float(s["value"][1]) for s in total] == [6.0]  # 1 + 2 + 3 sets, summed
    # the docs' statsd_exporter mapping gives StatsD's lines the names and labels the
    # OpenTelemetry exporter gives, so one dashboard serves both
    exported = {line.split()[2] for line in exposition.splitlines()
                if line.startswith("# TYPE localstate_")}
    mapped = map_statsd_lines(StatsdClient("h", 1, "localstate", triggerer_id="t-1").lines(
        Sample(dict.fromkeys(COUNTERS.values(), 1), dict.fromkeys(GAUGES.values(), 1.0),
               0.5)))
    assert {labels["triggerer_id"] for _n, _t, labels in mapped} == {"t-1"}
    for name, kind, _labels in mapped:
        if kind == "g":
            assert name in exported, (name, sorted(exported))
        elif kind == "c":
            assert name.endswith("_total"), name
    assert ("localstate_flush_duration_seconds", "ms", {"triggerer_id": "t-1"}) in mapped
    assert "localstate_set_total" in exported
    assert {n for n, _k, _l in mapped if _k == "c"} == {
        f"localstate_{n.replace('.', '_')}_total" for n in COUNTERS.values()}


def map_statsd_lines(lines: list[str]) -> list[tuple[str, str, dict[str, str]]]:
    """(Prometheus name, StatsD type, labels) of each line under the statsd_exporter mapping of
    the metrics page (glob matches: ``*`` is one segment; the first match wins)."""
    import yaml

    page = (Path(__file__).parents[2] / "docs" / "operations" / "metrics.md").read_text()
    block = page.split("```yaml\n", 1)[1].split("```", 1)[0]
    rules = yaml.safe_load(block)["mappings"]
    kinds = {"c": "counter", "g": "gauge", "ms": "observer"}
    out = []
    for line in lines:
        metric, _, rest = line.partition(":")
        kind = rest.split("|")[1]
        for rule in rules:
            pattern = "^" + re.escape(rule["match"]).replace(r"\*", "([^.]+)") + "$"
            found = re.match(pattern, metric)
            if found is None or rule.get("match_metric_type", kinds[kind]) != kinds[kind]:
                continue
            groups = found.groups()

            def fill(text: str, groups: tuple[str, ...] = groups) -> str:
                return re.sub(r"\$\{?(\d)\}?", lambda m: groups[int(m[1]) - 1], text)

            out.append((fill(rule["name"]), kind,
                        {k: fill(v) for k, v in (rule.get("labels") or {}).items()}))
            break
        else:
            raise AssertionError(f"no mapping matches {line!r}")
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port
