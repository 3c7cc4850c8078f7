"""`QueueTrigger`: what the queue watchers share: a batch of messages emitted as one commit,
routed to the watched assets by an optional function, and what becomes of a message that
cannot be delivered as it is.

No message stops a watcher (``on_bad_message="flag"``, the default):

* a message whose event would be larger than ``max_value_bytes`` gets an event all the same,
  to the assets its route gives, with the message's coordinates and ``"size"`` (the bytes its
  whole payload takes) and its content left out, flagged ``"omitted": "too_large"``;
* a message whose `route` raises gets its event, with the message as it is and
  ``"route_error"`` (the exception), to the `dead_letter` asset when one is named (it must be
  a watched asset), else to the trigger's own owner: with one watched asset that asset, with
  several no asset (the event is in the watcher's history, under ``trigger:...``).

Each is logged, counted (`StateStore.stats` ``queue_bad_messages``, the metric
``queue.bad_messages``) and, as an event, in the owner's history. ``on_bad_message="fail"``
raises instead (`ValueTooLarge`, or `InvalidInput` for the route), and the trigger restarts on
the same message until it is dealt with.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence
from typing import Any, Final

from airflow.triggers.base import BaseEventTrigger

from localstate._core.codec import encode
from localstate._core.model import Durability
from localstate.airflow.queues._message import QueueMessage, Route, load_route, route_targets
from localstate.airflow.trigger import StateEnabledTrigger
from localstate.errors import InvalidInput, ValueTooLarge

__all__ = ["BAD_MESSAGE_POLICIES", "QueueTrigger"]

log = logging.getLogger("localstate.airflow.queues")

#: what `on_bad_message` may say
BAD_MESSAGE_POLICIES: Final = ("flag", "fail")


class QueueTrigger(StateEnabledTrigger, BaseEventTrigger):
    """A watcher of one queue: subclasses read batches and call `emit_batch`."""

    def __init__(self, *, route: str | None = None, max_messages: int = 500,
                 on_bad_message: str = "flag", dead_letter: str | None = None) -> None:
        super().__init__()
        if isinstance(max_messages, bool) or not isinstance(max_messages, int) \
                or max_messages < 1:
            raise InvalidInput(f"max_messages must be a positive int, not {max_messages!r}")
        if on_bad_message not in BAD_MESSAGE_POLICIES:
            raise InvalidInput(f"on_bad_message must be one of {', '.join(BAD_MESSAGE_POLICIES)}"
                               f", not {on_bad_message!r}")
        if dead_letter is not None and route is None:
            raise InvalidInput("dead_letter takes the events of messages whose route raised: "
                               "it needs a route")
        #: ``flag`` (the default: no message stops the watcher) or ``fail``
        self.on_bad_message = on_bad_message
        #: the watched asset that gets the events of messages whose route raised
        self.dead_letter = dead_letter
        #: ``package.module.function``: the asset names each message goes to (None: all)
        self.route = route
        self.max_messages = max_messages
        self._route_fn: Route | None = None
        if route is not None:
            self._route_fn = load_route(route)  # refused at parse time, not in the triggerer

    def common_kwargs(self) -> dict[str, Any]:
        """The serialized arguments every queue trigger has (its subclass adds its own)."""
        out: dict[str, Any] = {"route": self.route, "max_messages": self.max_messages}
        # only when set: the serialized form (and so the owner) of a trigger is as it was
        if self.on_bad_message != "flag":
            out["on_bad_message"] = self.on_bad_message
        if self.dead_letter is not None:
            out["dead_letter"] = self.dead_letter
        return out

    def classpath(self) -> str:
        """The class's path in its serialized form."""
        # the public module, not the private file the class is written in
        return f"localstate.airflow.queues.{type(self).__qualname__}"

    async def emit_batch(self, messages: Sequence[QueueMessage], *, watermark: Any,
                         durability: Durability | None = None) -> int:
        """Emit one event per message and the watermark past them, as one commit (a message
        too large or whose route raises: see the module docstring)."""
        store = await self.open_state()
        limit = store.settings.max_value_bytes
        route = self._route_fn
        events: list[tuple[str, Any]] = []
        routes: list[Collection[str]] | None = None if route is None else []
        bad = 0
        for m in messages:
            payload = m.payload
            if route is not None and routes is not None:
                try:
                    targets = route_targets(route, m)
                except Exception as exc:  # the user's function: any error is the message's
                    targets = self._route_failed(m, exc)
                    payload = {**payload, "route_error": f"{type(exc).__name__}: {exc}"}
                    bad += 1
                routes.append(targets)
            try:
                if _may_exceed(payload, limit):  # most messages are far below: not encoded
                    encode(payload, limit)
            except ValueTooLarge as exc:
                if self.on_bad_message == "fail":
                    raise ValueTooLarge(
                        f"the event of {m.key} would be {exc.size} bytes, over max_value_bytes "
                        f"({limit}); on_bad_message='fail' stops the watcher here (the default "
                        "'flag' emits it without its content)", size=exc.size, limit=limit,
                    ) from None
                log.warning("%s: its event would be %d bytes, over max_value_bytes (%d): "
                            "emitted without its content (\"omitted\": \"too_large\")",
                            m.key, exc.size, limit)
                payload = {**{k: v for k, v in payload.items() if k not in m.content},
                           "size": exc.size, "omitted": "too_large"}
                bad += int("route_error" not in payload)
            events.append((m.key, payload))
        if bad:
            store.sources.count(self.state_owner, "bad_messages", bad)
        return await self.emit_many(events, watermark=watermark, routes=routes,
                                    durability=durability)

    def _route_failed(self, m: QueueMessage, exc: Exception) -> Collection[str]:
        """Where the event of `m`, whose route raised `exc`, goes (or raise, under ``fail``)."""
        if self.on_bad_message == "fail":
            raise InvalidInput(f"the route {self.route} raised on {m.key} ({exc!r}); "
                               "on_bad_message='fail' stops the watcher here") from exc
        target = self.dead_letter if self.dead_letter is not None else self.state_owner
        log.warning("the route %s raised on %s (%r): its event goes to %s, with route_error",
                    self.route, m.key, exc, target)
        return (target,)


def _may_exceed(payload: dict[str, Any], limit: int) -> bool:
    """Whether `payload`'s JSON may be over `limit` bytes: its text fields' lengths, each
    counted as JSON's worst escaping (6 bytes a character, ``\\u00XX``), and room for the
    rest, against the limit."""
    size = 1024
    for value in payload.values():
        if isinstance(value, str):
            size += 6 * len(value)
        elif value is None or isinstance(value, (int, float)):
            size += 64
        else:  # an object or a list: its repr is at least as long as its JSON, unescaped
            size += 6 * len(str(value))
        if size > limit:
            return True
    return False
