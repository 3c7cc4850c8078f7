"""`QueueMessage`: one message read from a queue, as a route function and the event see it."""

from __future__ import annotations

import base64
import importlib
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from typing import Any

from localstate.errors import InvalidInput

__all__ = ["QueueMessage", "Route", "load_route", "route_targets", "text_or_base64"]


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


def text_or_base64(data: bytes | str | None) -> tuple[str | None, str]:
    """A message body for JSON: the text when it is UTF-8 (encoding ``utf-8``), else its
    base64 (encoding ``base64``)."""
    if data is None or isinstance(data, str):
        return data, "utf-8"
    try:
        return data.decode(), "utf-8"
    except UnicodeDecodeError:
        return base64.b64encode(data).decode("ascii"), "base64"
