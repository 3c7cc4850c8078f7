"""Watcher triggers over a numbered source, for tests/support/events_chaos.py in real triggerers.

The source of watcher `index` is the folder ``$LOCALSTATE_E2E_SOURCE/<index>``: the scenario
writes the empty files ``00000001``, ``00000002``, ... into it at a steady rate (`item_path`),
each after the one before. Each trigger polls its folder and produces one asset event per new
file, in number order, never past a number it has not seen (`_new_items`):

* `EmitSourceTrigger` (localstate): ``await self.emit({"n": n}, watermark=n)``; the event and
  the watermark commit together, exactly once;
* `PlainSourceTrigger` (Airflow's own API only): yields ``TriggerEvent({"n": n})``, then keeps
  the cursor with ``self.asset_state_store.aset``, as Airflow's documentation shows.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from airflow.triggers.base import BaseEventTrigger, TriggerEvent

from localstate.airflow.trigger import StateEnabledTrigger

POLL = 0.1


def item_path(folder: Path, n: int) -> Path:
    """The file of item `n` in a source folder."""
    return folder / f"{n:08d}"


def _new_items(index: int, after: int) -> list[int]:
    """The items of source `index` past `after`: ``after + 1``, ``after + 2``, ... up to the
    first one not there yet.

    Looked up by number, not by listing the folder: a listing is no snapshot. On a filesystem
    that lists a folder in hash order (ext4's hashed directories), a listing that runs while
    the feeder creates item n and then n + 1 can hold n + 1 without n (n landed before the
    listing's position, n + 1 after it); a watcher taking the listing's items would emit
    n + 1, move its watermark past n and never emit n. Item n + 1 exists only once n does, so
    going by number never skips one."""
    folder = Path(os.environ["LOCALSTATE_E2E_SOURCE"]) / str(index)
    items: list[int] = []
    n = after + 1
    while item_path(folder, n).exists():
        items.append(n)
        n += 1
    return items


class _SourceTrigger(BaseEventTrigger):
    """A watcher of source `index`: its one argument, serialized by its own class name."""

    def __init__(self, *, index: int) -> None:
        super().__init__()
        self.index = index

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (f"{type(self).__module__}.{type(self).__qualname__}", {"index": self.index})


class PlainSourceTrigger(_SourceTrigger):
    """Yield the event, then save the cursor in Airflow's ``asset_state_store``."""

    async def run(self) -> AsyncIterator[TriggerEvent]:
        store = self.asset_state_store
        assert store is not None, "run this trigger as an Asset Watcher"
        last = int(await store.aget("cursor", default=0))  # type: ignore[arg-type]
        while True:
            for n in _new_items(self.index, last):
                yield TriggerEvent({"n": n})
                await store.aset("cursor", n)
                last = n
            await asyncio.sleep(POLL)


class EmitSourceTrigger(StateEnabledTrigger, _SourceTrigger):
    """Emit each item with the watermark it advances to: one commit, exactly once."""

    async def run(self) -> AsyncIterator[TriggerEvent]:
        last = int(await self.get_watermark(default=0))
        while True:
            for n in _new_items(self.index, last):
                await self.emit({"n": n}, watermark=n)
                last = n
            await asyncio.sleep(POLL)
        yield TriggerEvent({})  # pragma: no cover - makes run() an async generator
