"""The numbered-file source of the events chaos test's watchers (tests/e2e_events_trigger.py).

A watcher must never go past an item it has not emitted: the chaos run's one missing item
(`emit_1`'s 2663, no event row, its watermark one write short of its value) was a watcher that
saw item n + 1 in a listing of its folder that lacked item n. On ext4 a folder lists in hash
order, and a listing that runs while the feeder creates n and then n + 1 can hold n + 1
without n. The listing such a race returns is the folder below: n + 1 there, n not yet.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from e2e_events_trigger import _new_items, item_path


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("LOCALSTATE_E2E_SOURCE", str(tmp_path))
    source = tmp_path / "0"
    source.mkdir()
    return source


def test_a_watcher_stops_before_an_item_not_there_yet_and_takes_it_next(folder: Path) -> None:
    for n in (1, 2, 3, 5):  # 5 is there, 4 is being created
        item_path(folder, n).touch()
    assert _new_items(0, 0) == [1, 2, 3]  # not 5: past it, 4 would never be emitted
    assert _new_items(0, 3) == []
    item_path(folder, 4).touch()
    assert _new_items(0, 3) == [4, 5]
    assert _new_items(0, 5) == []


def test_items_are_read_from_the_watermark_on(folder: Path) -> None:
    for n in range(1, 2001):
        item_path(folder, n).touch()
    assert _new_items(0, 1990) == list(range(1991, 2001))
    assert _new_items(0, 2000) == []
    assert _new_items(1, 0) == []  # a source folder not made yet: nothing
