"""The orders of the ``max`` policy (issue #23), through real stores on both central backends.

* one writer's sequential writes always land, whatever the policy and whatever the values ("10"
  after "9" under plain max used to be refused, and the watermark stuck for good);
* between two writers the declared order decides, and a zombie never lowers the value;
* a value that does not fit a declared order is refused at `set` time, nothing written;
* plain max warns once per owner when it falls back to comparing strings as text.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import datetime, timezone
from typing import Any

import orjson
import pytest
from conftest import StoreFactory, value_id

from localstate import ConfigError, InvalidInput
from localstate._core.conflicts import ConflictPolicy, PolicyMap
from localstate._sync.central.central_store import CentralStore

OWNER = "asset_watcher:orders"

# Values whose text order is not their order as integers, or as instants.
STRINGS = ["8", "9", "10", "11", "2"]
NUMBERS = [8, 9, 10, 11, 2]
# as text each sorts after the one before; as instants the second is the earliest
TIMES = ["2024-01-01T23:00:00Z", "2024-01-02T00:30:00+02:00", "2024-01-02T01:00:00Z",
         "2023-06-01T00:00:00"]
FIELD_STRINGS = [{"offset": s, "file": f"f{s}"} for s in STRINGS]
FIELD_NUMBERS = [{"offset": n} for n in NUMBERS]
FIELD_TIMES = [{"at": t} for t in TIMES]
OBJECTS = [{"a": 1}, {"b": [2]}, {"a": 0}]  # no field in common: plain max cannot compare them
# the queue watchers' watermarks: Kafka's partitions (one added), Redis's id and count, SQS's
KAFKA_POSITIONS = [{"0": 9, "1": 3}, {"0": 10, "1": 3}, {"0": 10, "1": 4, "2": 0}, {"0": 2}]
REDIS_POSITIONS = [{"id": "1718-9", "read": 9}, {"id": "1718-10", "read": 10},
                   {"id": "1719-0", "read": 11}, {"id": "0-0", "read": 0}]

EVERY_POLICY = ("reject", "last_writer_wins", "max")
KINDS: dict[str, tuple[list[Any], tuple[str, ...]]] = {  # name: (values, policies)
    "strings": (STRINGS, (*EVERY_POLICY, "max:int", "max:text")),
    "numbers": (NUMBERS, (*EVERY_POLICY, "max:int")),
    "times": (TIMES, (*EVERY_POLICY, "max:timestamp", "max:text")),
    "field-strings": (FIELD_STRINGS, (*EVERY_POLICY, "max:offset", "max:offset:int",
                                      "max:offset:text")),
    "field-numbers": (FIELD_NUMBERS, ("max:offset", "max:offset:int")),
    "field-times": (FIELD_TIMES, ("max:at", "max:at:timestamp", "max:at:text")),
    "objects": (OBJECTS, (*EVERY_POLICY, "max:offset")),
    "kafka-positions": (KAFKA_POSITIONS, ("max:position",)),
    "redis-positions": (REDIS_POSITIONS, ("max:position",)),
    "positions": (STRINGS, ("max:position",)),
}
SEQUENCES = [pytest.param(p, values, id=f"{p}-{name}")
             for name, (values, policies) in KINDS.items() for p in policies]


@contextlib.asynccontextmanager
async def central_reader(url: str) -> AsyncIterator[CentralStore]:
    reader = await CentralStore.open(url)
    try:
        yield reader
    finally:
        await reader.close()


async def central_value(reader: CentralStore, key: str = "wm") -> Any:
    row = (await reader.read_many([(OWNER, key)])).get((OWNER, key))
    assert row is not None
    assert row.data is not None
    return orjson.loads(row.data)


# -- one writer --------------------------------------------------------------------------


@pytest.mark.parametrize(("policy", "values"), SEQUENCES)
async def test_every_sequential_write_of_one_writer_lands(
    open_store: StoreFactory, central_url: str, policy: str, values: list[Any],
) -> None:
    """The issue's sequence: each write, flushed, is what the writer and everyone else read."""
    a = await open_store(triggerer_id="a", conflict_policy=policy)
    b = await open_store(triggerer_id="b", conflict_policy=policy)
    async with central_reader(central_url) as reader:
        for n, value in enumerate(values, 1):
            # central durability: the set returns once the flush put it in the central DB, and
            # raises WriteRejected if the flush kept the central record instead
            assert await a.set(OWNER, "wm", value, durability="central") == n
            assert await a.get(OWNER, "wm") == value
            assert await central_value(reader) == value
            await b.load(OWNER)
            assert await b.get(OWNER, "wm") == value
    assert a.stats().conflicts == 0


@pytest.mark.parametrize("policy", ["max", "max:int", "max:text"])
async def test_ten_after_nine_moves_the_watermark_on(
    open_store: StoreFactory, central_url: str, policy: str,
) -> None:
    """The regression of issue #23: "10" after "9" by the same writer, flushed between, under
    plain max was refused ("10" < "9" as text) and the watermark stuck at "9"."""
    a = await open_store(triggerer_id="a", conflict_policy=f"asset_watcher:*={policy}")
    for value in ("8", "9", "10", "11"):
        await a.set(OWNER, "wm", value)
        report = await a.flush()
        assert (report.written, report.conflicts) == (1, 0)
        assert await a.get(OWNER, "wm") == value
    async with central_reader(central_url) as reader:
        assert await central_value(reader) == "11"


# -- two writers -------------------------------------------------------------------------

# (policy, low, high): low < high in the declared order, not always in another one
ORDERED: list[tuple[str, Any, Any]] = [
    ("max", 9, 10),
    ("max", "2024-01-02T00:30:00+02:00", "2024-01-01T23:00:00Z"),
    ("max:int", "9", "10"),
    ("max:int", 9, "10"),
    ("max:int", "-5", 3),
    ("max:text", "10", "9"),
    ("max:timestamp", "2024-01-02T00:30:00+02:00", "2024-01-01T23:00:00Z"),
    ("max:timestamp", "2024-01-01", "2024-01-01T00:00:01"),
    ("max:offset:int", {"offset": "9", "f": "z"}, {"offset": "10", "f": "a"}),
    ("max:offset:text", {"offset": "10"}, {"offset": "9"}),
    ("max:at:timestamp", {"at": "2024-01-02T00:30:00+02:00"}, {"at": "2024-01-01T23:00:00Z"}),
    ("max:position", "9", 10),
    ("max:position", "1718-9", "1718-10"),
    ("max:position", "1718-10", "1719-0"),
    ("max:position", {"0": 9, "1": 20}, {"0": 10, "1": 20}),
    ("max:position", {"0": 9, "1": 20}, {"0": 9, "1": 20, "2": 0}),  # a partition added
    ("max:position", {"id": "1718-9", "read": 9}, {"id": "1718-10", "read": 10}),
    ("max:position", {"received": 9}, {"received": 10}),
]
ORDERED_IDS = [f"{p}-{value_id(lo)}-{value_id(hi)}" for p, lo, hi in ORDERED]


@pytest.mark.parametrize("low_first", [True, False], ids=["low-first", "high-first"])
@pytest.mark.parametrize(("policy", "low", "high"), ORDERED, ids=ORDERED_IDS)
async def test_between_two_writers_the_greater_value_wins(
    open_store: StoreFactory, central_url: str, policy: str, low: Any, high: Any,
    low_first: bool,
) -> None:
    a = await open_store(triggerer_id="a", conflict_policy=policy)
    b = await open_store(triggerer_id="b", conflict_policy=policy)
    await a.set(OWNER, "wm", high)
    await b.set(OWNER, "wm", low)  # both based on "no record"
    first, second = (b, a) if low_first else (a, b)
    await first.flush()
    report = await second.flush()
    assert report.conflicts == 1
    async with central_reader(central_url) as reader:
        assert await central_value(reader) == high
    for store in (a, b):  # the loser adopted the greater value, or reads it now
        await store.load(OWNER)
        assert await store.get(OWNER, "wm") == high
    record = await a.record(OWNER, "wm")
    assert record is not None
    assert record.updated_by == "a"


@pytest.mark.parametrize(("policy", "low", "high"), ORDERED, ids=ORDERED_IDS)
async def test_a_zombie_never_lowers_another_writers_value(
    open_store: StoreFactory, central_url: str, policy: str, low: Any, high: Any,
) -> None:
    """The trigger moves from z to b; z, paused meanwhile, wakes and flushes its lower
    watermark late. Then, having adopted b's record, z writes the lower value again, based on
    b's current record: still refused (b is another writer)."""
    z = await open_store(triggerer_id="z", conflict_policy=policy)
    b = await open_store(triggerer_id="b", conflict_policy=policy)
    await z.set(OWNER, "wm", low, durability="central")
    await b.load(OWNER)  # the trigger moves to b, which continues from z's watermark
    assert await b.get(OWNER, "wm") == low
    await b.set(OWNER, "wm", high, durability="central")
    async with central_reader(central_url) as reader:
        before = (await reader.read_many([(OWNER, "wm")]))[(OWNER, "wm")]
        await z.set(OWNER, "wm", low)  # the zombie, based on its own (now stale) record
        report = await z.flush()
        assert (report.adopted, report.conflicts) == (1, 1)
        assert await z.get(OWNER, "wm") == high
        await z.set(OWNER, "wm", low)  # based on b's current record, and lower
        report = await z.flush()
        assert (report.adopted, report.conflicts) == (1, 1)
        assert await z.get(OWNER, "wm") == high
        after = (await reader.read_many([(OWNER, "wm")]))[(OWNER, "wm")]
        assert after == before  # b's record, untouched
    assert await b.get(OWNER, "wm") == high


async def test_positions_ahead_on_different_fields_keep_the_central_value(
    open_store: StoreFactory, central_url: str,
) -> None:
    """Under max:position two watermarks each ahead on some partition are not comparable:
    neither is greater, so the central value stays (as for any value max cannot order)."""
    a = await open_store(triggerer_id="a", conflict_policy="max:position")
    b = await open_store(triggerer_id="b", conflict_policy="max:position")
    await a.set(OWNER, "wm", {"0": 10, "1": 5})
    await b.set(OWNER, "wm", {"0": 5, "1": 10})
    await a.flush()
    report = await b.flush()
    assert report.conflicts == 1
    async with central_reader(central_url) as reader:
        assert await central_value(reader) == {"0": 10, "1": 5}


# -- values that do not fit the declared order -------------------------------------------

ILL_TYPED: list[tuple[str, Any, Any]] = [  # (policy, a good value, a value that does not fit)
    ("max:int", "10", "ten"),
    ("max:int", 10, 1.5),
    ("max:int", 10, True),
    ("max:int", 10, None),
    ("max:int", 10, "1e3"),
    ("max:int", 10, " 10"),
    ("max:int", 10, "0x10"),
    ("max:int", 10, "١٠"),  # Arabic-Indic digits: a str.isdigit() string, not a decimal one
    ("max:int", 10, {"offset": 10}),
    ("max:timestamp", "2024-01-01T00:00:00Z", 1_700_000_000),
    ("max:timestamp", "2024-01-01T00:00:00Z", "yesterday"),
    ("max:timestamp", "2024-01-01T00:00:00Z", "2024-13-01T00:00:00"),
    ("max:text", "a", 10),
    ("max:text", "a", ["a"]),
    ("max:offset:int", {"offset": 1}, {"offset": "x"}),
    ("max:offset:int", {"offset": 1}, {"other": 1}),
    ("max:offset:int", {"offset": 1}, "10"),
    ("max:at:timestamp", {"at": "2024-01-01"}, {"at": 5}),
    ("max:at:text", {"at": "x"}, {"at": None}),
    ("max:position", {"0": 1}, {"0": "x"}),
    ("max:position", {"0": 1}, {"0": 1.5}),
    ("max:position", {"0": 1}, {"0": [1]}),
    ("max:position", "1-0", "1-0-0"),
    ("max:position", 1, True),
    ("max:position", 1, None),
]


@pytest.mark.parametrize(("policy", "good", "bad"), ILL_TYPED,
                         ids=[f"{p}-{value_id(b)}" for p, _, b in ILL_TYPED])
async def test_a_value_that_does_not_fit_the_declared_order_is_refused_at_set_time(
    open_store: StoreFactory, central_url: str, policy: str, good: Any, bad: Any,
) -> None:
    store = await open_store(conflict_policy={"asset_watcher:*": policy, "*": "reject"})
    await store.set(OWNER, "wm", good, durability="central")
    writes: list[Callable[[], Awaitable[int]]] = [
        lambda: store.set(OWNER, "wm", bad),
        lambda: store.set(OWNER, "wm", bad, durability="memory"),
        lambda: store.compare_and_set(OWNER, "wm", bad, expected_version=1),
        lambda: store.set(OWNER, "new-key", bad),
    ]
    for write in writes:
        with pytest.raises(InvalidInput) as caught:
            await write()
        assert policy in str(caught.value)
        assert repr(bad) in str(caught.value)
        assert OWNER in str(caught.value)
    # nothing written: not in memory, not dirty, not in the central DB
    record = await store.record(OWNER, "wm")
    assert record is not None
    assert (record.value, record.version) == (good, 1)
    assert store.stats().dirty_keys == 0
    assert await store.get(OWNER, "new-key") is None
    await store.flush()
    async with central_reader(central_url) as reader:
        assert await central_value(reader) == good
        assert (await reader.read_many([(OWNER, "new-key")])) == {}
    # owners under another policy take the same value
    assert await store.set("dag:etl/load", "wm", bad) == 1


async def test_values_are_checked_as_they_encode(open_store: StoreFactory) -> None:
    """A datetime encodes as its ISO text: it fits max:timestamp (and max:text)."""
    store = await open_store(conflict_policy="max:timestamp")
    when = datetime(2024, 5, 1, 12, tzinfo=timezone.utc)
    await store.set(OWNER, "wm", when)
    assert await store.get(OWNER, "wm") == "2024-05-01T12:00:00+00:00"


async def test_direct_mode_checks_the_order_too(open_store: StoreFactory, central_url: str
                                                ) -> None:
    store = await open_store(conflict_policy="max:int", enabled=False)
    with pytest.raises(InvalidInput, match="max:int"):
        await store.set(OWNER, "wm", "ten")
    await store.set(OWNER, "wm", "10")
    async with central_reader(central_url) as reader:
        assert await central_value(reader) == "10"


# -- loud when the order is guessed ------------------------------------------------------


async def test_plain_max_warns_once_per_owner_when_it_compares_strings_as_text(
    open_store: StoreFactory, caplog: pytest.LogCaptureFixture,
) -> None:
    a = await open_store(triggerer_id="a", conflict_policy="max")
    b = await open_store(triggerer_id="b", conflict_policy="max")
    caplog.set_level(logging.WARNING, logger="localstate.conflicts")
    await a.set(OWNER, "wm", "9", durability="central")
    await a.set("asset_watcher:other", "wm", "9", durability="central")
    for value in ("10", "11", "12"):  # b writes on a's record: compared, each time
        await b.set(OWNER, "wm", value)
        await b.set("asset_watcher:other", "wm", value)
        report = await b.flush()
        assert report.conflicts == 2  # as text each is below "9": the central value stays
        assert await b.get(OWNER, "wm") == "9"
    warnings = [r.getMessage() for r in caplog.records if "as text" in r.getMessage()]
    assert len(warnings) == 2  # once per owner
    assert all("max:int" in w for w in warnings)
    assert any(repr(OWNER) in w for w in warnings)
    # numbers and timestamps are not text: no warning for them
    caplog.clear()
    await a.set(OWNER, "n", 1, durability="central")
    await b.set(OWNER, "n", 2)
    await b.flush()
    assert not [r for r in caplog.records if "as text" in r.getMessage()]


# -- the spec grammar --------------------------------------------------------------------


@pytest.mark.parametrize(("spec", "fld", "order", "canonical"), [
    ("max", None, "auto", "max"),
    ("max:auto", None, "auto", "max"),
    ("max:int", None, "int", "max:int"),
    ("max:timestamp", None, "timestamp", "max:timestamp"),
    ("max:text", None, "text", "max:text"),
    ("max:offset", "offset", "auto", "max:offset"),  # as before: a field, guessed order
    ("max:offset:int", "offset", "int", "max:offset:int"),
    ("max:a:b", "a:b", "auto", "max:a:b"),  # a field with a colon, as before
    ("max:a:b:text", "a:b", "text", "max:a:b:text"),
    ("max:int:auto", "int", "auto", "max:int:auto"),  # a field named like an order
    ("max:int:int", "int", "int", "max:int:int"),
])
def test_the_last_segment_is_the_order_when_it_names_one(
    spec: str, fld: str | None, order: str, canonical: str,
) -> None:
    policy = ConflictPolicy.parse(spec)
    assert (policy.name, policy.field, policy.order, policy.spec) == ("max", fld, order, canonical)
    assert ConflictPolicy.parse(policy.spec) == policy


@pytest.mark.parametrize("spec", ["max:", "max::int", "reject:int", "min", "last_writer_wins:x"])
def test_a_bad_spec_names_what_is_allowed(spec: str) -> None:
    with pytest.raises(ConfigError, match="max:<field>:<order>"):
        ConflictPolicy.parse(spec)


def test_only_declared_orders_ask_for_a_value_check() -> None:
    """The store checks values only when some owner's policy declares an order."""
    assert not PolicyMap("max").checks_values
    assert not PolicyMap({"asset_watcher:*": "max:offset", "*": "reject"}).checks_values
    policies = PolicyMap({"asset_watcher:*": "max:offset:int", "*": "reject"})
    assert policies.checks_values
    policies.check_value("dag:x", "anything", '"anything"')  # under reject: no check
    with pytest.raises(InvalidInput, match="max:offset:int"):
        policies.check_value(OWNER, {"offset": "x"}, '{"offset":"x"}')
