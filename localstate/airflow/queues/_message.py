"""`QueueMessage`: one message read from a queue, as a route function and the event see it."""

from __future__ import annotations

import base64
import importlib
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from typing import Any

from localstate.errors import InvalidInput

__all__ = ["QueueMessage", "Route", "field_name", "field_value", "load_route", "route_targets"]


@dataclass(frozen=True, slots=True)
class QueueMessage:
    """A message of a Kafka topic, a Redis stream or an SQS queue.

    `key` is the event's de-duplication key (``topic/partition/offset``, ``stream/id``,
    ``sqs/<MessageId>``); `payload` is what the asset event's ``extra["payload"]`` holds.
    """

    #: ``kafka``, ``redis`` or ``sqs``
    queue: str
    #: the topic, stream or queue URL
    source: str
    #: the de-duplication key of its event
    key: str
    #: the event's payload (JSON)
    payload: dict[str, Any] = field(default_factory=dict)
    #: the payload's fields that hold the message's content (left out of an event that would
    #: be too large; the others say where the message is)
    content: tuple[str, ...] = ()


#: a route: the names of the watched assets a message's event goes to
Route = Callable[[QueueMessage], Iterable[str] | str | None]


def load_route(path: str | None) -> Route | None:
    """The route function named by `path` (``package.module.function``), or None."""
    if path is None:
        return None
    module, _, name = path.rpartition(".")
    if not module:
        raise InvalidInput(f"route {path!r} is not a dotted path (package.module.function)")
    try:
        found = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise InvalidInput(f"route {path!r} cannot be imported here: {exc}") from exc
    if not callable(found):
        raise InvalidInput(f"route {path!r} is not callable")
    route: Route = found
    return route


def route_targets(route: Route, message: QueueMessage) -> Collection[str]:
    """The asset names `route` gives `message` (a name, names, or None for none)."""
    got = route(message)
    if got is None:
        return ()
    if isinstance(got, str):
        return (got,)
    return tuple(got)


def field_value(data: bytes | str | None) -> str | dict[str, str] | None:
    """One field of a message for JSON, by the rule every queue watcher's payload follows:
    the text when its bytes are UTF-8, else ``{"base64": "<its base64>"}`` (so each field
    says its own encoding)."""
    if data is None or isinstance(data, str):
        return data
    try:
        return data.decode()
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(data).decode("ascii")}


def field_name(data: bytes | str) -> str:
    """A field's name for a JSON object's key: the text when UTF-8, else ``base64:`` and its
    base64."""
    if isinstance(data, str):
        return data
    try:
        return data.decode()
    except UnicodeDecodeError:
        return "base64:" + base64.b64encode(data).decode("ascii")
