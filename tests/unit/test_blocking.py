"""The synchronous API: a StateStore on a background thread, called from many threads."""

from __future__ import annotations

import asyncio
import math
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import orjson
import pytest

from localstate import (
    CacheCorrupt,
    InvalidName,
    LocalStateError,
    StoreClosed,
    ValueEncodingError,
    ValueTooLarge,
    VersionConflict,
)
from localstate._core.model import Durability
from localstate._sync.central.central_store import CentralStore
from localstate.blocking import BlockingStateStore, StateVariable

THREADS = 8
SETS = 150


def central_rows(url: str, keys: list[tuple[str, str]]) -> dict[tuple[str, str], tuple[Any, int]]:
    """(value, version) of `keys` as the central DB holds them, read apart from the store."""

    async def read() -> dict[tuple[str, str], tuple[Any, int]]:
        central = await CentralStore.open(url)
        try:
            rows = await central.read_many(keys)
        finally:
            await central.close()
        return {k: (orjson.loads(r.data), r.version) for k, r in rows.items()
                if r.data is not None}

    return asyncio.run(read())


@pytest.fixture
def store(central_url: str, tmp_path: Path) -> Iterator[BlockingStateStore]:
    s = BlockingStateStore(central_url=central_url, cache_path=tmp_path / "b.db",
                           triggerer_id="blocking", flush_interval=0.2, max_value_bytes=1024)
    yield s
    s.close()


def test_eight_threads_at_once_lose_nothing_and_versions_only_grow(
    store: BlockingStateStore, central_url: str
) -> None:
    shared: list[tuple[int, int]] = []  # (version, value) of every write of the shared key
    shared_lock = threading.Lock()
    start = threading.Barrier(THREADS)

    def writer(t: int) -> list[int]:
        durability: Durability = ("memory", "local", "central")[t % 3]
        own: list[int] = []
        start.wait()
        for i in range(SETS):
            own.append(store.set("dag:many", f"thread-{t}", i, durability=durability))
            version = store.set("dag:many", "shared", [t, i])
            with shared_lock:
                shared.append((version, t * SETS + i))
            assert store.get("dag:many", f"thread-{t}") == i  # reads its own write
        return own

    with ThreadPoolExecutor(THREADS) as pool:
        results = list(pool.map(writer, range(THREADS)))
    for own in results:  # each thread's key: versions strictly increasing, one per set
        assert own == list(range(1, SETS + 1))
    versions = sorted(v for v, _ in shared)
    assert versions == list(range(1, THREADS * SETS + 1))  # every shared write got its own
    last_t, last_i = divmod(max(shared)[1], SETS)
    store.close()  # flushes

    keys = [("dag:many", f"thread-{t}") for t in range(THREADS)] + [("dag:many", "shared")]
    held = central_rows(central_url, keys)
    for t in range(THREADS):
        assert held["dag:many", f"thread-{t}"][0] == SETS - 1
    assert held["dag:many", "shared"][0] == [last_t, last_i]


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda s: s.set("", "k", 1), InvalidName),
        (lambda s: s.get("dag:x", "bad\x00key"), InvalidName),
        (lambda s: s.set("dag:x", "k", math.nan), ValueEncodingError),
        (lambda s: s.set("dag:x", "k", "x" * 4096), ValueTooLarge),
        (lambda s: s.set("dag:x", "k", 1, durability="disk"), LocalStateError),
        (lambda s: s.compare_and_set("dag:x", "absent", 1, expected_version=3), VersionConflict),
    ],
    ids=["empty-owner", "control-char", "nan", "too-large", "bad-durability", "conflict"],
)
def test_errors_cross_the_thread_boundary_typed(store: BlockingStateStore, call: Any,
                                                error: type[Exception]) -> None:
    with ThreadPoolExecutor(1) as pool:  # from another thread than the test's too
        fut = pool.submit(call, store)
        with pytest.raises(error):
            fut.result()
    with pytest.raises(error):
        call(store)
    assert store.get("dag:x", "k") is None  # nothing was written


def test_version_conflict_carries_its_versions(store: BlockingStateStore) -> None:
    store.set("dag:x", "cas", "a")
    with pytest.raises(VersionConflict) as info:
        store.compare_and_set("dag:x", "cas", "b", expected_version=7)
    assert (info.value.expected, info.value.actual) == (7, 1)
    assert store.compare_and_set("dag:x", "cas", "b", expected_version=1) == 2


def test_central_durability_holds_on_return(store: BlockingStateStore, central_url: str
                                            ) -> None:
    assert store.set("dag:d", "wm", 5, durability="central") == 1
    assert central_rows(central_url, [("dag:d", "wm")]) == {("dag:d", "wm"): (5, 1)}
    assert store.delete("dag:d", "wm", durability="central") is True
    assert central_rows(central_url, [("dag:d", "wm")]) == {}


def test_the_rest_of_the_api(store: BlockingStateStore) -> None:
    store.set("dag:r", "a", {"x": 1})
    store.set("dag:r", "b", 2)
    assert store.get_many("dag:r", ["a", "b", "c"]) == {"a": {"x": 1}, "b": 2}
    assert [r.key for r in store.items("dag:r")] == ["a", "b"]
    record = store.record("dag:r", "a")
    assert record is not None
    assert record.version == 1
    report = store.flush()
    assert report.rows == 2
    assert store.stats().dirty_keys == 0
    assert store.load("dag:r") == 2
    committed = store.read_committed("dag:r", "b")
    assert committed is not None
    assert (committed.value, committed.version) == (2, 1)
    assert store.read_committed("dag:r", "nothing") is None
    sv = store.variable("b", owner="dag:r")
    assert sv.get() == 2
    assert sv.set(3) == 2
    assert sv.compare_and_set(4, expected_version=2) == 3
    assert sv.record() is not None
    assert sv.delete() is True
    assert sv.get(default="gone") == "gone"


def test_close_twice_then_calls_raise_store_closed(central_url: str, tmp_path: Path) -> None:
    with BlockingStateStore(central_url=central_url, cache_path=tmp_path / "c.db") as s:
        s.set("dag:c", "k", 1)
        thread = s._thread
    s.close()
    assert s.closed
    assert not thread.is_alive()
    with pytest.raises(StoreClosed):
        s.get("dag:c", "k")


def test_a_call_from_its_own_loop_thread_is_refused(store: BlockingStateStore) -> None:
    async def inside() -> None:
        store.get("dag:x", "k")

    with pytest.raises(LocalStateError, match="its own event loop thread"):
        asyncio.run_coroutine_threadsafe(inside(), store.loop).result()


def test_an_open_error_is_raised_and_the_thread_ends(tmp_path: Path) -> None:
    before = {t.name for t in threading.enumerate()}
    stranger = tmp_path / "not-a-cache.db"
    stranger.write_bytes(b"this is not a SQLite file" * 100)
    with pytest.raises(CacheCorrupt):
        BlockingStateStore(central_url=f"sqlite:///{tmp_path}/c.db", cache_path=stranger)
    assert sum(t.name == "localstate-blocking" for t in threading.enumerate()) == sum(
        n == "localstate-blocking" for n in before)


def test_left_open_warns_and_closes_itself(central_url: str, tmp_path: Path) -> None:
    def open_and_forget() -> threading.Thread:
        s = BlockingStateStore(central_url=central_url, cache_path=tmp_path / "w.db")
        s.set("dag:w", "k", 1)
        return s._thread  # `s` is dropped here, unclosed

    with pytest.warns(ResourceWarning, match="never closed"):
        thread = open_and_forget()
    thread.join(timeout=10)
    assert not thread.is_alive()
    assert central_rows(central_url, [("dag:w", "k")]) == {("dag:w", "k"): (1, 1)}


def test_class_level_calls_on_the_default_store_from_threads(
    central_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIRFLOW__LOCALSTATE__CENTRAL_URL", central_url)
    monkeypatch.setenv("AIRFLOW__LOCALSTATE__CACHE_PATH", str(tmp_path / "default.db"))
    StateVariable.configure(None)
    try:
        def task(t: int) -> int:
            return StateVariable.set(f"k{t}", t, owner="dag:default/task")

        with ThreadPoolExecutor(4) as pool:
            assert list(pool.map(task, range(4))) == [1, 1, 1, 1]
        default = StateVariable.default_store()
        assert default is not None  # opened once, from the environment, for all threads
        assert StateVariable.get("k3", owner="dag:default/task") == 3
        assert StateVariable.get("nope", owner="dag:default/task", default=-1) == -1
        assert StateVariable.set("k3", 30, owner="dag:default/task", durability="central") == 2
        assert central_rows(central_url, [("dag:default/task", "k3")]) == {
            ("dag:default/task", "k3"): (30, 2)}
        assert StateVariable.delete("k3", owner="dag:default/task") is True
    finally:
        StateVariable.configure(None)  # closes the default it opened
    assert default.closed


def test_configure_uses_the_given_store(store: BlockingStateStore) -> None:
    StateVariable.configure(store)
    try:
        StateVariable.set("wm", 9, owner="dag:given")
        assert store.get("dag:given", "wm") == 9
    finally:
        StateVariable.configure(None)
    assert not store.closed  # not ours to close
