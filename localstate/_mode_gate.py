"""`ModeGate`: lets a store switch between local-first and direct mode under running calls.

A store's calls are of two kinds. The hot path (a known key, in memory) never awaits before it
has made its write in memory, so it cannot be caught half way by a switch: whatever it wrote is
in the dirty map, which the switch flushes. Every other call (a read-through, a first write, a
direct write, a load) awaits the central DB in the middle of its work and must see one mode from
start to end, so it runs inside ``async with gate.call()``.

A switch (``async with gate.switch()``) closes the gate to new calls, waits until the calls in
progress have finished, runs, and opens the gate again; the calls that waited then look at the
mode afresh. One switch runs at a time.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

__all__ = ["ModeGate"]


class ModeGate:
    def __init__(self) -> None:
        self._open = asyncio.Event()
        self._open.set()
        self._idle = asyncio.Event()
        self._idle.set()
        self._busy = 0
        self._switch_lock = asyncio.Lock()

    @property
    def switching(self) -> bool:
        return not self._open.is_set()

    @asynccontextmanager
    async def call(self) -> AsyncIterator[None]:
        """Run a call that must see one mode throughout (not to be nested)."""
        while not self._open.is_set():
            await self._open.wait()
        self._busy += 1
        self._idle.clear()
        try:
            yield
        finally:
            self._busy -= 1
            if self._busy == 0:
                self._idle.set()

    @asynccontextmanager
    async def switch(self) -> AsyncIterator[None]:
        """Hold new calls back and wait for the ones in progress; then the body may switch."""
        async with self._switch_lock:
            self._open.clear()
            try:
                await self._idle.wait()
                yield
            finally:
                self._open.set()

    @asynccontextmanager
    async def exclusive(self) -> AsyncIterator[None]:
        """Wait for a switch in progress and keep others out, without holding calls back."""
        async with self._switch_lock:
            yield
