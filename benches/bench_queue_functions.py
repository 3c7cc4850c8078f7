"""The ``apply_function`` of Airflow's own Kafka trigger in `bench_queues.py`: the event's
payload is the message's JSON (its number and produce time)."""

from __future__ import annotations

import json
from typing import Any


def kafka_payload(message: Any) -> dict[str, Any]:
    payload: dict[str, Any] = json.loads(message.value())
    return payload
