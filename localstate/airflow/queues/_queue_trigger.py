"""`QueueTrigger`: what the queue watchers share: a batch of messages emitted as one commit,
routed to the watched assets by an optional function."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow.triggers.base import BaseEventTrigger

from localstate._core.model import Durability
from localstate.airflow.queues._message import QueueMessage, Route, load_route, route_targets
from localstate.airflow.trigger import StateEnabledTrigger
from localstate.errors import InvalidInput

__all__ = ["QueueTrigger"]


class QueueTrigger(StateEnabledTrigger, BaseEventTrigger):
    """A watcher of one queue: subclasses read batches and call `emit_batch`."""

    def __init__(self, *, route: str | None = None, max_messages: int = 500) -> None:
        super().__init__()
        if isinstance(max_messages, bool) or not isinstance(max_messages, int) \
                or max_messages < 1:
            raise InvalidInput(f"max_messages must be a positive int, not {max_messages!r}")
        #: ``package.module.function``: the asset names each message goes to (None: all)
        self.route = route
        self.max_messages = max_messages
        self._route_fn: Route | None = None
        if route is not None:
            self._route_fn = load_route(route)  # refused at parse time, not in the triggerer

    def common_kwargs(self) -> dict[str, Any]:
        """The serialized arguments every queue trigger has (its subclass adds its own)."""
        return {"route": self.route, "max_messages": self.max_messages}

    def classpath(self) -> str:
        """The class's path in its serialized form."""
        # the public module, not the private file the class is written in
        return f"localstate.airflow.queues.{type(self).__qualname__}"

    async def emit_batch(self, messages: Sequence[QueueMessage], *, watermark: Any,
                         durability: Durability | None = None) -> int:
        """Emit one event per message and the watermark past them, as one commit."""
        events = [(m.key, m.payload) for m in messages]
        route = self._route_fn
        routes = None if route is None else [route_targets(route, m) for m in messages]
        return await self.emit_many(events, watermark=watermark, routes=routes,
                                    durability=durability)
