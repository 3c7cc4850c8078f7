"""Metrics in the forms Airflow emits: StatsD over UDP and OpenTelemetry instruments.

Nothing runs on the hot path. A reporter task per store wakes every ``metrics_interval``
seconds, takes `StateStore.stats()` and reports counters as the change since its previous
report and gauges as they stand; `StateStore.close()` makes one last report. Off by default:
on when ``statsd_host`` is set (StatsD) or ``otel`` is true (OpenTelemetry, when
``opentelemetry-api`` is installed).

Names, under ``statsd_prefix`` (default ``localstate``)::

    <prefix>.set             counter  sets since the previous report
    <prefix>.flush.rows      counter  rows written to the central DB
    <prefix>.flush.duration  timer    ms: the latest flush of the interval (StatsD |ms;
                                      OTel: a histogram in seconds)
    <prefix>.dirty_keys      gauge    keys whose latest write the central DB lacks
    <prefix>.flush_lag       gauge    seconds: age of the oldest write the central DB lacks
    <prefix>.flush_interval  gauge    seconds between flushes now (stretched by the budget)
    <prefix>.conflicts       counter  conflicts settled by flushes
    <prefix>.central_errors  counter  flushes that failed on the central DB
    <prefix>.evictions       counter  entries evicted from memory (max_keys_in_memory)
    <prefix>.released_keys   counter  entries dropped by releases of owners that left
    <prefix>.keys_in_memory  gauge    entries held in memory
    <prefix>.cache_file_bytes gauge   bytes of the local cache file and its WAL
    <prefix>.cache_turning_off gauge  seconds a turn-off of the cache has waited for the
                                      central DB to take its backlog (0: none pending)
    <prefix>.events.emitted  counter  events emitted with watermarks (`StateStore.emit`)
    <prefix>.events.committed counter events the central DB committed (new keys)
    <prefix>.events.duplicate counter events whose key it held already (replays)
    <prefix>.events.refused  counter  events of owners this store lost (a zombie's)
    <prefix>.events.rejected counter  events the central side refused as malformed (dropped)
    <prefix>.events.pending  gauge    events in the outbox, not yet in the central DB
    <prefix>.events.oldest_pending gauge seconds: age of the oldest of those
    <prefix>.queue.bad_messages counter queue messages whose event went out flagged (too
                                      large for max_value_bytes, or their route raised)
    <prefix>.queue.lag       gauge    messages the store's queue watchers are behind their
                                      sources' ends (Kafka: the partitions' high watermarks)
    <prefix>.queue.owner_lag gauge    the same per watcher: StatsD ``.<owner>`` after the name
                                      (made one segment), OpenTelemetry an ``owner`` attribute
    <prefix>.prune.rows      counter  rows `localstate db prune` deleted (sent by the command)
    <prefix>.prune.tombstones counter tombstones it deleted

Every StatsD line of a store carries its triggerer, so that a fleet's gauges stay apart at the
StatsD server (one name per triggerer; under one name each gauge would be whichever triggerer
reported last). As Airflow names its per-host metrics (``triggers.running.<hostname>``), the
triggerer is the last segment of the name: ``<prefix>.flush_lag.<triggerer>``, its characters
other than ``A-Z a-z 0-9 _ -`` made ``_`` so that it is one segment (`statsd_segment`). With
``statsd_tags`` on, the name stays ``<prefix>.flush_lag`` and the triggerer goes in a
DogStatsD tag instead: ``<prefix>.flush_lag:3|g|#triggerer_id:<triggerer>``. Counters are
per triggerer too; a fleet's total is their sum (Graphite: ``sumSeries(<prefix>.set.*)``;
Prometheus: ``sum(rate(...))`` over the ``triggerer_id`` label a mapping gives). What
``localstate db prune`` sends belongs to no triggerer and keeps its plain name.
OpenTelemetry measurements carry the attribute ``triggerer_id``. A StatsD server that is
down costs nothing but a log line: UDP sends never wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Protocol

from localstate._stats import StoreStats

if TYPE_CHECKING:
    from localstate._core.config import Settings
    from localstate._sync.flush.worker import SyncWorker


class MeasuredStore(Protocol):
    """What a reporter reads of a store (`StateStore` is one)."""

    @property
    def triggerer_id(self) -> str: ...
    @property
    def settings(self) -> Settings: ...
    @property
    def sync_worker(self) -> SyncWorker | None: ...
    def stats(self) -> StoreStats: ...

__all__ = ["COUNTERS", "GAUGES", "OWNER_LAG", "PRUNE_COUNTERS", "MetricsReporter", "StatsdClient",
           "report_prune", "start_reporter", "statsd_segment"]

log = logging.getLogger("localstate.metrics")

#: StoreStats field -> counter name: reported as the change since the previous report
COUNTERS: Final[dict[str, str]] = {
    "sets": "set",
    "central_rows": "flush.rows",
    "conflicts": "conflicts",
    "central_errors": "central_errors",
    "evictions": "evictions",
    "released_keys": "released_keys",
    "events_emitted": "events.emitted",
    "events_committed": "events.committed",
    "events_duplicate": "events.duplicate",
    "events_refused": "events.refused",
    "events_rejected": "events.rejected",
    "queue_bad_messages": "queue.bad_messages",
}
#: StoreStats field -> gauge name: reported as it stands
GAUGES: Final[dict[str, str]] = {
    "dirty_keys": "dirty_keys",
    "oldest_unflushed_s": "flush_lag",
    "keys_in_memory": "keys_in_memory",
    "cache_file_bytes": "cache_file_bytes",
    "flush_interval_s": "flush_interval",
    "cache_turning_off_s": "cache_turning_off",
    "events_pending": "events.pending",
    "oldest_pending_event_s": "events.oldest_pending",
    "queue_lag": "queue.lag",
}
#: a queue watcher's own gauge, one per owner: ``<prefix>.queue.owner_lag.<owner>...``
OWNER_LAG: Final = "queue.owner_lag"
TIMER: Final = "flush.duration"
_GAUGE_UNITS: Final = {"events.oldest_pending": "s", "flush_lag": "s", "flush_interval": "s",
                       "cache_file_bytes": "By", "cache_turning_off": "s"}
#: what `localstate db prune` deleted: counters it sends once, after its run
PRUNE_COUNTERS: Final = ("prune.rows", "prune.tombstones")
#: StatsD packets stay under a common path MTU: several lines per packet, never fragmented
_MAX_PACKET: Final = 1400


@dataclass(frozen=True)
class Sample:
    """What one report says: counter deltas, gauge values, the latest flush's duration."""

    counters: dict[str, int]
    gauges: dict[str, float]
    flush_duration_s: float | None


# -- StatsD ------------------------------------------------------------------------------


class _StatsdProtocol(asyncio.DatagramProtocol):
    def __init__(self, on_error: Callable[[BaseException], None]) -> None:
        self._on_error = on_error

    def error_received(self, exc: Exception) -> None:
        # e.g. ECONNREFUSED from an earlier packet: nobody listens. Log once per outage.
        self._on_error(exc)


def statsd_segment(triggerer_id: str) -> str:
    """`triggerer_id` as one segment of a StatsD name or one DogStatsD tag value: every
    character but ``A-Z a-z 0-9 _ -`` becomes ``_`` (a ``.`` would split it across segments,
    ``:`` ``|`` ``#`` ``,`` break the line's syntax)."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", triggerer_id)


class StatsdClient:
    """Sends StatsD lines over UDP, many lines per packet.

    `triggerer_id`: the triggerer every line names (see the module's docstring), in the name
    or, with `tags`, in a DogStatsD tag; None: plain names (what belongs to no triggerer).
    """

    def __init__(self, host: str, port: int, prefix: str, *, triggerer_id: str | None = None,
                 tags: bool = False) -> None:
        self.host = host
        self.port = port
        self.prefix = prefix
        segment = None if triggerer_id is None else statsd_segment(triggerer_id)
        #: what follows each metric name, and what follows each line's type
        self._suffix = f".{segment}" if segment is not None and not tags else ""
        self._tags = f"|#triggerer_id:{segment}" if segment is not None and tags else ""
        self.packets_sent = 0
        self.errors = 0
        self._transport: asyncio.DatagramTransport | None = None
        self._warned = False

    def lines(self, sample: Sample) -> list[str]:
        p, end, tags = self.prefix, self._suffix, self._tags
        out = [f"{p}.{name}{end}:{value}|c{tags}"
               for name, value in sample.counters.items() if value]
        if sample.flush_duration_s is not None:
            out.append(f"{p}.{TIMER}{end}:{sample.flush_duration_s * 1000:.3f}|ms{tags}")
        out.extend(f"{p}.{name}{end}:{_number(value)}|g{tags}"
                   for name, value in sample.gauges.items())
        return out

    async def send(self, lines: Iterable[str]) -> None:
        packets = _packets(lines)
        if not packets:
            return
        try:
            if self._transport is None or self._transport.is_closing():
                loop = asyncio.get_running_loop()
                self._transport, _ = await loop.create_datagram_endpoint(
                    lambda: _StatsdProtocol(self._failed), remote_addr=(self.host, self.port)
                )
            for packet in packets:
                self._transport.sendto(packet)
                self.packets_sent += 1
        except OSError as exc:  # name resolution, no route: try again at the next report
            self._failed(exc)
            self._close_transport()
            return
        self._warned = False

    def _failed(self, exc: BaseException) -> None:
        self.errors += 1
        if not self._warned:
            self._warned = True
            log.warning("cannot send metrics to StatsD at %s:%d: %s", self.host, self.port, exc)

    def _close_transport(self) -> None:
        if self._transport is not None:
            self._transport.close()
            self._transport = None

    def close(self) -> None:
        self._close_transport()


def _number(value: float) -> str:
    if isinstance(value, int) or float(value).is_integer():
        return str(int(value))
    return f"{value:.3f}"


def _packets(lines: Iterable[str]) -> list[bytes]:
    packets: list[bytes] = []
    current = b""
    for line in lines:
        data = line.encode()
        if current and len(current) + 1 + len(data) > _MAX_PACKET:
            packets.append(current)
            current = b""
        current = data if not current else current + b"\n" + data
    if current:
        packets.append(current)
    return packets


# -- OpenTelemetry -----------------------------------------------------------------------


class _OtelInstruments:
    """One set of instruments per prefix for the process; gauges observe every live store."""

    def __init__(self, meter: Any, prefix: str) -> None:
        from opentelemetry.metrics import CallbackOptions, Observation

        self._observation = Observation
        self.live: dict[int, tuple[str, StoreStats]] = {}
        self.counters = {
            name: meter.create_counter(f"{prefix}.{name}", unit="1",
                                       description=f"localstate {name} (from stats())")
            for name in COUNTERS.values()
        }
        self.duration = meter.create_histogram(
            f"{prefix}.{TIMER}", unit="s", description="duration of a flush to the central DB"
        )

        def observer(field: str) -> Any:
            def observe(_options: CallbackOptions) -> Iterable[Observation]:
                return [
                    Observation(getattr(stats, field), {"triggerer_id": tid})
                    for tid, stats in list(self.live.values())
                ]

            return observe

        for field, name in GAUGES.items():
            meter.create_observable_gauge(
                f"{prefix}.{name}", callbacks=[observer(field)],
                unit=_GAUGE_UNITS.get(name, "1"),
            )

        def observe_owner_lag(_options: CallbackOptions) -> Iterable[Observation]:
            return [
                Observation(figures["lag"], {"triggerer_id": tid, "owner": owner})
                for tid, stats in list(self.live.values())
                for owner, figures in stats.sources_by_owner.items() if "lag" in figures
            ]

        meter.create_observable_gauge(f"{prefix}.{OWNER_LAG}", callbacks=[observe_owner_lag],
                                      unit="1")

    def record(self, triggerer_id: str, sample: Sample) -> None:
        attributes = {"triggerer_id": triggerer_id}
        for name, value in sample.counters.items():
            if value > 0:
                self.counters[name].add(value, attributes)
        if sample.flush_duration_s is not None:
            self.duration.record(sample.flush_duration_s, attributes)


_otel_by_prefix: dict[str, _OtelInstruments] = {}


def _otel_instruments(prefix: str) -> _OtelInstruments | None:
    try:
        from opentelemetry import metrics
    except ImportError:
        log.warning("otel is on but opentelemetry-api is not installed "
                    "(pip install opentelemetry-api); OpenTelemetry metrics are off")
        return None
    instruments = _otel_by_prefix.get(prefix)
    if instruments is None:
        from localstate._core.version import __version__

        meter = metrics.get_meter("localstate", __version__)
        instruments = _otel_by_prefix[prefix] = _OtelInstruments(meter, prefix)
    return instruments


# -- the reporter ------------------------------------------------------------------------


class MetricsReporter:
    """Samples one store's stats every `interval` seconds and reports them."""

    def __init__(
        self, store: MeasuredStore, *, interval: float, statsd: StatsdClient | None = None,
        otel: _OtelInstruments | None = None,
    ) -> None:
        self.store = store
        self.interval = interval
        self.statsd = statsd
        self.otel = otel
        self.reports = 0
        self._previous = dict.fromkeys((*COUNTERS, "flushes"), 0)
        self._task: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()

    def start(self) -> None:
        if self.otel is not None:
            self.otel.live[id(self)] = (self.store.triggerer_id, self.store.stats())
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name="localstate-metrics"
            )

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self.report_now()
            except Exception:  # metrics must never take the store down
                log.exception("metrics report failed")

    def sample(self) -> Sample:
        """Take the store's stats now: counter deltas since the previous sample, gauges."""
        stats = self.store.stats()
        counters: dict[str, int] = {}
        for field, name in COUNTERS.items():
            value = int(getattr(stats, field))
            counters[name] = max(0, value - self._previous[field])
            self._previous[field] = value
        duration = None
        if stats.flushes != self._previous["flushes"]:
            self._previous["flushes"] = stats.flushes
            duration = _last_flush_duration(self.store)
        gauges = {name: float(getattr(stats, field)) for field, name in GAUGES.items()}
        for owner, figures in stats.sources_by_owner.items():
            if "lag" in figures:
                gauges[f"{OWNER_LAG}.{statsd_segment(owner)}"] = float(figures["lag"])
        if self.otel is not None and id(self) in self.otel.live:
            self.otel.live[id(self)] = (self.store.triggerer_id, stats)
        return Sample(counters, gauges, duration)

    async def report_now(self) -> Sample:
        """Sample and send at once (the task does this every `interval`)."""
        async with self._lock:
            sample = self.sample()
            if self.statsd is not None:
                await self.statsd.send(self.statsd.lines(sample))
            if self.otel is not None:
                self.otel.record(self.store.triggerer_id, sample)
            self.reports += 1
            return sample

    async def stop(self) -> None:
        """Stop the task, report what happened since the previous report, close."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        try:
            await self.report_now()
        except Exception:
            log.exception("final metrics report failed")
        finally:
            if self.otel is not None:
                self.otel.live.pop(id(self), None)
            if self.statsd is not None:
                self.statsd.close()


def _last_flush_duration(store: MeasuredStore) -> float | None:
    # StoreStats has no flush duration; the worker's last report has it. (Reading the
    # worker here keeps the store's hot path free of any metrics call.)
    worker = store.sync_worker
    report = worker.last_flush if worker is not None else None
    return report.duration if report is not None else None


def start_reporter(store: MeasuredStore) -> MetricsReporter | None:
    """Start reporting `store`'s metrics as its settings say; None when metrics are off."""
    s = store.settings
    statsd = (StatsdClient(s.statsd_host, s.statsd_port, s.statsd_prefix,
                           triggerer_id=store.triggerer_id, tags=s.statsd_tags)
              if s.statsd_host is not None else None)
    otel = _otel_instruments(s.statsd_prefix) if s.otel else None
    if statsd is None and otel is None:
        return None
    reporter = MetricsReporter(store, interval=s.metrics_interval, statsd=statsd, otel=otel)
    reporter.start()
    return reporter


async def report_prune(settings: Settings, rows: int, tombstones: int) -> None:
    """Report what one prune deleted, as the settings say (StatsD, OpenTelemetry; off: no-op).
    """
    counts = dict(zip(PRUNE_COUNTERS, (rows, tombstones), strict=True))
    if settings.statsd_host is not None:
        client = StatsdClient(settings.statsd_host, settings.statsd_port,
                              settings.statsd_prefix)
        try:
            await client.send(client.lines(Sample(counts, {}, None)))
        finally:
            client.close()
    if settings.otel:
        try:
            from opentelemetry import metrics
        except ImportError:
            return
        meter = metrics.get_meter("localstate")
        for name, value in counts.items():
            if value:
                meter.create_counter(f"{settings.statsd_prefix}.{name}", unit="1").add(value)
