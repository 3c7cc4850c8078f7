"""`CentralStore.write_if_version`: the conditional central write the CLI's --expected-version
uses, on both backends."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from localstate import VersionConflict
from localstate._sync.central.central_store import CentralStore


@pytest_asyncio.fixture
async def central(central_url: str) -> AsyncIterator[CentralStore]:
    store = await CentralStore.open(central_url)
    yield store
    await store.close()


async def current(central: CentralStore, owner: str = "o", key: str = "k"
                  ) -> tuple[str | bytes | None, int] | None:
    row = (await central.read_many([(owner, key)])).get((owner, key))
    return None if row is None else (row.data, row.version)


async def test_zero_creates_a_key_that_has_no_value(central: CentralStore) -> None:
    row = await central.write_if_version("o", "k", "1", 0, updated_by="cli")
    assert (row.version, row.data, row.updated_by) == (1, "1", "cli")
    assert await current(central) == ("1", 1)
    with pytest.raises(VersionConflict) as info:
        await central.write_if_version("o", "k", "2", 0, updated_by="cli")
    assert (info.value.expected, info.value.actual) == (0, 1)
    assert await current(central) == ("1", 1)


async def test_a_matching_version_writes_and_a_stale_one_does_not(
    central: CentralStore
) -> None:
    await central.write_if_version("o", "k", '{"a":1}', 0, updated_by="cli")
    row = await central.write_if_version("o", "k", '{"a":2}', 1, updated_by="cli")
    assert row.version == 2
    with pytest.raises(VersionConflict) as info:
        await central.write_if_version("o", "k", '{"a":3}', 1, updated_by="cli")
    assert info.value.actual == 2
    assert await current(central) == ('{"a":2}', 2)
    with pytest.raises(VersionConflict):
        await central.write_if_version("o", "missing", "1", 3, updated_by="cli")
    assert await current(central, key="missing") is None


async def test_delete_leaves_a_tombstone_that_zero_writes_over(central: CentralStore) -> None:
    await central.write_if_version("o", "k", "1", 0, updated_by="cli")
    row = await central.write_if_version("o", "k", None, 1, updated_by="cli")
    assert row.data is None
    assert await current(central) == (None, 2)
    with pytest.raises(VersionConflict) as info:  # a tombstone has no value: version 0
        await central.write_if_version("o", "k", "x", 2, updated_by="cli")
    assert info.value.actual == 0
    row = await central.write_if_version("o", "k", "back", 0, updated_by="cli")
    assert row.version == 3
    assert await current(central) == ("back", 3)


async def test_two_writers_on_the_same_version_one_wins(central_url: str,
                                                        central: CentralStore) -> None:
    await central.write_if_version("o", "k", "0", 0, updated_by="a")
    other = await CentralStore.open(central_url)
    try:
        results = await asyncio.gather(
            central.write_if_version("o", "k", "a", 1, updated_by="a"),
            other.write_if_version("o", "k", "b", 1, updated_by="b"),
            return_exceptions=True,
        )
    finally:
        await other.close()
    conflicts = [r for r in results if isinstance(r, VersionConflict)]
    written = [r for r in results if not isinstance(r, BaseException)]
    assert len(conflicts) == 1
    assert len(written) == 1
    assert await current(central) == (written[0].data, 2)


@pytest.mark.parametrize("bad", [-1, True, 1.0])
async def test_bad_expected_versions_are_refused(central: CentralStore, bad: object) -> None:
    with pytest.raises(ValueError, match="expected_version"):
        await central.write_if_version("o", "k", "1", bad, updated_by="cli")  # type: ignore[arg-type]
