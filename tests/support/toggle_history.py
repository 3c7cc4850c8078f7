"""A live toggle schedule under concurrent writers, and the history check of what they saw.

`ToggleWriters` runs writers on one store: each owns its keys (one writer per key, so every
conflict, `WriteRejected` or `VersionConflict` is the store disagreeing with itself) and makes
seeded random sets, compare-and-sets (on the version it last saw) and deletes, in every
durability. It records every version a call returned (and every one a `record` showed), and
the last acknowledged state of each key. `check_central` compares the central DB with it.

The promises checked (`ToggleHistory`):

* per key, the versions the store's callers see never go down, and each write's is above the
  last one seen;
* after every turn-off and at the end, the central DB holds the last acknowledged value of
  every key (a ``central`` write that timed out with `CentralUnavailable` is kept in the cache
  and flushed later: the writer reads its record to learn what it is);
* no conflict, `WriteRejected` or `VersionConflict` with this single writer;
* no error but `CentralUnavailable`, and that only while the central DB is down (`outage`).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import orjson

from localstate import CentralUnavailable, LocalStateError, StateStore
from localstate._cache.entry import StateKey
from localstate._core.model import Durability
from localstate._sync.central.central_store import CentralStore

__all__ = ["KeyState", "ToggleHistory", "ToggleWriters", "check_central"]

DURABILITIES: tuple[Durability, ...] = ("memory", "local", "central")


@dataclass
class KeyState:
    """What the writer of one key last had acknowledged."""

    value: int | None = None  # None: deleted, or never written
    version: int = 0  # the last version a call returned or a record showed
    seq: int = 0  # the values written: 1, 2, 3, ... (each value once)


@dataclass
class ToggleHistory:
    ops: int = 0
    sets: int = 0
    compare_and_sets: int = 0
    deletes: int = 0
    #: CentralUnavailable raised while the central DB was down (documented)
    unavailable: int = 0
    #: (key, seen before, seen now)
    regressions: list[tuple[StateKey, int, int]] = field(default_factory=list)
    #: errors that break a promise: (what, repr)
    errors: list[tuple[str, str]] = field(default_factory=list)
    #: keys whose central record was not the last acknowledged one at a check
    behind: list[tuple[str, StateKey, object, object]] = field(default_factory=list)
    conflicts: int = 0
    checks: int = 0


class ToggleWriters:
    """`writers` tasks over `keys_each` keys each, on the store in `store` (replaceable while
    paused: a restart)."""

    def __init__(self, store: StateStore, rng: random.Random, *, writers: int = 6,
                 keys_each: int = 6) -> None:
        self.store = store
        self.history = ToggleHistory()
        self.keys: dict[StateKey, KeyState] = {}
        self._outage = False
        self._running = asyncio.Event()
        self._running.set()
        self._idle = asyncio.Event()
        self._idle.set()
        self._busy = 0
        self._stop = asyncio.Event()
        owned = []
        for w in range(writers):
            mine = [(f"toggle:o{w % 3}", f"w{w}-k{j}") for j in range(keys_each)]
            self.keys.update({k: KeyState() for k in mine})
            owned.append(mine)
        self._tasks = [asyncio.create_task(self._write(mine, random.Random(rng.random())))
                       for mine in owned]

    @contextmanager
    def outage(self) -> Iterator[None]:
        """While the central DB is down (and until it answers again): `CentralUnavailable`
        is allowed."""
        self._outage = True
        try:
            yield
        finally:
            self._outage = False

    async def paused(self) -> None:
        """Hold the writers back and wait for the calls in progress."""
        self._running.clear()
        await self._idle.wait()

    def resume(self) -> None:
        self._running.set()

    async def stop(self) -> None:
        self._stop.set()
        self._running.set()
        await asyncio.gather(*self._tasks)

    async def more(self, n: int, timeout: float = 30.0) -> None:
        """Let `n` more operations finish."""
        target = self.history.ops + n
        deadline = time.monotonic() + timeout
        while self.history.ops < target:
            assert time.monotonic() < deadline, "the writers stalled"
            await asyncio.sleep(0.01)

    async def _write(self, mine: list[StateKey], rng: random.Random) -> None:
        while not self._stop.is_set():
            if not self._running.is_set():
                await self._running.wait()
                continue
            self._busy += 1
            self._idle.clear()
            try:
                await self._one(rng.choice(mine), rng)
            finally:
                self._busy -= 1
                if self._busy == 0:
                    self._idle.set()
            await asyncio.sleep(0)

    async def _one(self, k: StateKey, rng: random.Random) -> None:
        st = self.keys[k]
        h = self.history
        durability = rng.choice(DURABILITIES)
        r = rng.random()
        store = self.store
        try:
            if r < 0.6:
                st.seq += 1
                h.sets += 1
                version = await store.set(*k, st.seq, durability=durability)
                self._saw(k, version, write=True)
                st.value = st.seq
            elif r < 0.85:
                st.seq += 1
                h.compare_and_sets += 1
                expected = st.version if st.value is not None else 0
                version = await store.compare_and_set(*k, st.seq, expected_version=expected,
                                                      durability=durability)
                self._saw(k, version, write=True)
                st.value = st.seq
            else:
                h.deletes += 1
                deleted = await store.delete(*k, durability=durability)
                if st.value is not None and not deleted:
                    h.errors.append(("delete", f"{k} had {st.value} but delete said False"))
                st.value = None
        except CentralUnavailable as exc:
            if not self._outage:
                h.errors.append(("outside an outage", repr(exc)))
            h.unavailable += 1
            await self._resync(k)
        except LocalStateError as exc:  # WriteRejected, VersionConflict, anything else
            h.errors.append((type(exc).__name__, repr(exc)))
            await self._resync(k)
        h.ops += 1

    async def _resync(self, k: StateKey) -> None:
        """After a call failed: what the store holds for `k` now (a ``central`` write that
        timed out is kept and flushed later). A key it cannot read now was not written."""
        st = self.keys[k]
        try:
            record = await self.store.record(*k)
        except LocalStateError:
            return
        if record is None:
            st.value = None
            return
        st.value = record.value
        self._saw(k, record.version, write=False)

    def _saw(self, k: StateKey, version: int, *, write: bool) -> None:
        st = self.keys[k]
        if version < st.version or (write and version == st.version):
            self.history.regressions.append((k, st.version, version))
        st.version = max(st.version, version)


async def check_central(writers: ToggleWriters, central: CentralStore, when: str) -> int:
    """Compare the central DB with the last acknowledged state of every key (writers
    paused); record what is behind; return how many keys were checked."""
    rows = await central.read_many(list(writers.keys))
    h = writers.history
    h.checks += 1
    for k, st in writers.keys.items():
        row = rows.get(k)
        value = None if row is None or row.data is None else orjson.loads(row.data)
        if value != st.value:
            h.behind.append((when, k, st.value, value))
        elif st.value is not None and row is not None and row.version < st.version:
            h.regressions.append((k, st.version, row.version))
    return len(rows)
