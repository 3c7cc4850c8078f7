"""Functions the queue chaos DAG names by dotted path (tests/support/queue_chaos.py): localstate's
routes (Kafka fan-out by parity, a check of each Redis entry) and the ``apply_function`` of
Airflow's own Kafka trigger."""

from __future__ import annotations

from typing import Any

from localstate.airflow.queues import QueueMessage


def by_parity(message: QueueMessage) -> str:
    """Message ``<n>`` or ``<n>:<padding>`` goes to ``emit_kafka_even`` or ``emit_kafka_odd``;
    anything else (``#<n>``, a malformed message) raises."""
    n = int(str(message.payload["value"]).split(":", 1)[0])
    return "emit_kafka_even" if n % 2 == 0 else "emit_kafka_odd"


def checked_entry(message: QueueMessage) -> str:
    """The Redis stream's entries go to ``emit_redis`` once their ``n`` is checked: a
    malformed one (``#<n>``) raises."""
    int(message.payload["fields"]["n"])
    return "emit_redis"


def kafka_item(message: Any) -> dict[str, int]:
    """Airflow's Kafka trigger: the event's payload is the message's number (of ``<n>``,
    ``<n>:<padding>`` or ``#<n>``)."""
    return {"n": int(message.value().lstrip(b"#").split(b":", 1)[0])}


def by_leading_number(message: QueueMessage) -> str:
    """``<n>`` or ``<n>:<padding>`` goes to ``even`` or ``odd`` by n; anything else raises
    (a malformed message)."""
    n = int(str(message.payload["value"]).split(":", 1)[0])
    return "even" if n % 2 == 0 else "odd"
