"""Three stores of three triggerers in one process, their metrics through OpenTelemetry's
Prometheus exporter: ``python otel_prometheus_fleet.py <port> <folder>``.

It sets the process's meter provider to the SDK with a `PrometheusMetricReader`, serves the
exposition on 127.0.0.1:<port> (prometheus_client's HTTP server, as an operator's triggerer
would), opens `TRIGGERERS` stores (``otel = true``, the central DB an SQLite file in
<folder>), gives the n-th store n dirty keys, prints ``READY`` and waits for a line on stdin
(or its end) to close them.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from opentelemetry import metrics
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import MeterProvider
from prometheus_client import start_http_server

from localstate import StateStore

TRIGGERERS = ("triggerer-a", "triggerer-b.example.com", "triggerer-c")


async def main(port: int, folder: Path) -> None:
    start_http_server(port, addr="127.0.0.1")
    metrics.set_meter_provider(MeterProvider(metric_readers=[PrometheusMetricReader()]))
    central = f"sqlite:///{folder / 'central.db'}"
    stores = [await StateStore.open(cache_path=folder / f"{tid}.db", central_url=central,
                                    triggerer_id=tid, otel=True, flush_interval=3600,
                                    metrics_interval=0.2)
              for tid in TRIGGERERS]
    for n, store in enumerate(stores, start=1):
        for k in range(n):
            await store.set(f"dag:{store.triggerer_id}", f"k{k}", k)
    print("READY", flush=True)
    await asyncio.to_thread(sys.stdin.readline)
    for store in stores:
        await store.close()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), Path(sys.argv[2])))
