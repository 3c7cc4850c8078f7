"""Paging through ``GET /api/v1/state`` while writers change keys, on databases that order text
differently (issue #24).

The listing is keyset-paginated: a page continues after the last key of the one before. That is
right only if the database's order, the cursor's comparison and the API's own merge of pages
agree, whatever collation the database was created with. So each backend (SQLite, PostgreSQL
C and PostgreSQL en-US through ICU, as most installations order text) is paged through at 50
a page: 3,300 keys over 330 owners whose names mix case, ``:``, ``/``, ``-``, ``_``, ``.``,
``%`` and ``\\``, while four writers update, create and delete keys (one of them the API's
own store, whose unflushed writes the listing overlays). Every full pass must list each key
that existed throughout, nothing twice, in strictly increasing byte-wise order: the cursor only
moves forward.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest_asyncio
from conftest import StoreFactory, collations
from test_api import client_for

from localstate import StateStore
from localstate._cache.entry import StateKey
from localstate._core.conflicts import PolicyMap
from localstate._core.rows import DirtyRow
from localstate._sync.central.central_store import CentralStore
from localstate.api import create_app
from localstate.api._paths import decode_cursor

STEMS = ["asset", "Asset", "ASSET", "dag", "Dag", "trigger", "a%b", "a_b", "a\\b", "x.y", "Z",
         "é"]
SEPARATORS = [":", "/", "-", "_", "."]
OWNERS = [f"{STEMS[i % len(STEMS)]}{SEPARATORS[i // len(STEMS) % len(SEPARATORS)]}{i:03d}"
          for i in range(330)]
KEYS = ["k0", "K1", "k_2", "k-3", "k.4", "k:5", "k/6", "k%7", "Key8", "key9"]
STABLE = {(o, k) for o in OWNERS for k in KEYS}  # written before, never deleted
WRITERS = 4
PAGE = 50
MAX_ROUNDS = 2000  # a writer's bound, should the passes never stop it


def byte_order(name: StateKey) -> tuple[bytes, bytes]:
    return name[0].encode(), name[1].encode()


@dataclass
class Setting:
    client: httpx.AsyncClient
    writers: list[StateStore]  # writers[0] is the store the API serves


@pytest_asyncio.fixture
async def setting(open_store: StoreFactory, central_url: str) -> AsyncIterator[Setting]:
    central = await CentralStore.open(central_url)
    try:  # one batch: a store's first write to an owner reads it from the central DB first
        now = time.time()
        await central.write_batch([DirtyRow(o, k, "0", 1, 0, now, "seeder") for o, k in STABLE],
                                  PolicyMap())
    finally:
        await central.close()
    writers = [await open_store(triggerer_id=f"writer-{n}") for n in range(WRITERS)]
    async with client_for(create_app(writers[0].settings, local=writers[0])) as client:
        yield Setting(client, writers)


@dataclass
class Progress:
    """The writers' rounds, and an event set at the end of each."""

    rounds: list[int]
    event: asyncio.Event

    def done(self) -> int:
        return sum(self.rounds)

    async def next_round(self) -> None:
        """Return once some writer has finished a round after this call."""
        self.event.clear()
        await asyncio.wait_for(self.event.wait(), 60)


async def write(store: StateStore, n: int, stop: asyncio.Event, progress: Progress) -> None:
    """Update some of this writer's keys, create one and delete an older one, each round;
    flush (the API's own store: every third round, so it holds unflushed keys meanwhile)."""
    rng = random.Random(n)
    owners = OWNERS[n::WRITERS]  # each writer its own owners: no conflicts
    volatile: list[StateKey] = []
    for r in range(MAX_ROUNDS):
        if stop.is_set():
            return
        for _ in range(3):
            await store.set(rng.choice(owners), rng.choice(KEYS), r)
        name = (rng.choice(owners), f"v{n}-{r}")
        await store.set(*name, r)
        volatile.append(name)
        if len(volatile) > 5:
            await store.delete(*volatile.pop(rng.randrange(len(volatile))))
        if n != 0 or r % 3 == 2:
            await store.flush()
        progress.rounds[n] += 1
        progress.event.set()


async def one_pass(client: httpx.AsyncClient, progress: Progress, **params: Any
                   ) -> list[StateKey]:
    """Every page of one listing; between two pages at least one writer finishes a round (and
    they write during each page's request too)."""
    listed: list[StateKey] = []
    cursor: str | None = None
    for _ in range(len(STABLE) // PAGE + 50):
        query = {**params, "limit": PAGE, **({"cursor": cursor} if cursor else {})}
        r = await client.get("/api/v1/state", params=query)
        assert r.status_code == 200, r.text
        body = r.json()
        page = [(i["owner"], i["key"]) for i in body["items"]]
        listed += page
        cursor = body["next_cursor"]
        if cursor is None:
            return listed
        assert len(page) == PAGE
        assert decode_cursor(cursor) == page[-1]  # the cursor is the page's last key
        await progress.next_round()
    raise AssertionError(f"no end after {len(listed)} items, {len(listed) - len(set(listed))} "
                         f"of them repeated, {len(backward(listed))} steps not forward")


def backward(listed: list[StateKey]) -> list[tuple[StateKey, StateKey]]:
    """The steps from one listed key to the next that do not go forward byte-wise."""
    return [(a, b) for a, b in itertools.pairwise(listed)
            if byte_order(a) >= byte_order(b)]


def check_pass(listed: list[StateKey], expected: set[StateKey]) -> None:
    back = backward(listed)
    assert not back, f"{len(back)} steps not forward (byte-wise), the first {back[:3]}"
    missing = expected - set(listed)
    assert not missing, f"{len(missing)} keys that existed throughout were not listed, " \
                        f"e.g. {sorted(missing)[:5]}"


@collations
async def test_every_pass_lists_each_key_once_in_byte_order_while_writers_run(
    setting: Setting,
) -> None:
    assert len(OWNERS) >= 300
    assert len(STABLE) >= 3000
    stop = asyncio.Event()
    progress = Progress([0] * WRITERS, asyncio.Event())
    writers = [asyncio.create_task(write(store, n, stop, progress))
               for n, store in enumerate(setting.writers)]
    try:
        passes: list[tuple[dict[str, str], set[StateKey]]] = [
            ({}, STABLE), ({}, STABLE),
            # '_' is literal: a LIKE would also list "a%b..." and "a\\b..."
            ({"owner_prefix": "a_b"}, {k for k in STABLE if k[0].startswith("a_b")}),
        ]
        for params, expected in passes:
            before = progress.done()
            listed = await one_pass(setting.client, progress, **params)
            check_pass(listed, expected)
            prefix = params.get("owner_prefix", "")
            assert all(o.startswith(prefix) for o, _ in listed)
            assert progress.done() >= before + len(listed) // PAGE  # a round between pages
    finally:
        stop.set()
        await asyncio.gather(*writers)
