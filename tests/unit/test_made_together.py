"""`MadeTogether`: calls waiting for a slot are made together, each owner once per go."""

from __future__ import annotations

import asyncio

import pytest

from localstate._core.made_together import MadeTogether
from localstate.errors import CentralUnavailable


async def test_waiting_calls_are_made_in_few_goes_each_getting_its_own_result() -> None:
    goes: list[list[str]] = []

    async def make(items: list[str]) -> dict[str, str]:
        goes.append(items)
        await asyncio.sleep(0.01)  # a transaction: the others queue up meanwhile
        return {item: item.upper() for item in items}

    together = MadeTogether(asyncio.Semaphore(1), str, make, 500)
    owners = [f"o{i}" for i in range(100)]
    results = await asyncio.gather(*(together(o) for o in owners))
    assert results == [o.upper() for o in owners]
    assert sorted(i for go in goes for i in go) == sorted(owners)  # each made once
    assert len(goes) <= 3  # the first alone, then the rest together


async def test_a_go_takes_each_owner_once_and_at_most_group_items() -> None:
    goes: list[list[tuple[str, int]]] = []

    async def make(items: list[tuple[str, int]]) -> dict[str, int]:
        goes.append(items)
        await asyncio.sleep(0.01)
        return dict(items)

    together = MadeTogether(asyncio.Semaphore(1), lambda item: item[0], make, 4)
    calls = [("a", 1), ("a", 2), ("b", 3), ("c", 4), ("d", 5), ("e", 6), ("a", 7)]
    results = await asyncio.gather(*(together(c) for c in calls))
    assert results == [n for _owner, n in calls]
    for go in goes:
        assert len(go) <= 4
        assert len({owner for owner, _n in go}) == len(go)
    assert [n for go in goes for owner, n in go if owner == "a"] == [1, 2, 7]  # in order


async def test_the_error_of_a_go_reaches_every_call_in_it() -> None:
    async def make(items: list[str]) -> dict[str, str]:
        await asyncio.sleep(0.01)
        raise CentralUnavailable("the central DB is down")

    together = MadeTogether(asyncio.Semaphore(1), str, make, 500)
    results = await asyncio.gather(*(together(f"o{i}") for i in range(10)),
                                   return_exceptions=True)
    assert all(isinstance(r, CentralUnavailable) for r in results)


async def test_a_cancelled_call_is_not_made_and_the_others_are() -> None:
    release = asyncio.Event()
    made: list[str] = []

    async def make(items: list[str]) -> dict[str, str]:
        made.extend(items)
        await release.wait()
        return {item: item for item in items}

    together = MadeTogether(asyncio.Semaphore(1), str, make, 500)
    first = asyncio.create_task(together("first"))
    await asyncio.sleep(0)
    waiting = asyncio.create_task(together("cancelled"))
    other = asyncio.create_task(together("other"))
    await asyncio.sleep(0.01)
    waiting.cancel()
    release.set()
    assert await first == "first"
    assert await other == "other"
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert "cancelled" not in made
