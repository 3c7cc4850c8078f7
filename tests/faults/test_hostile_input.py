"""Hostile input through the Python API (`StateStore`); the CLI and the REST API have their own
files (`test_hostile_cli.py`, `test_hostile_rest.py`) over the same strategies (`hostile.py`).

Hypothesis generates owners, keys and values: deep nesting, huge strings, lone surrogates, NaN
and infinities, integers beyond 64 bits, control characters, empty and very long names, names
that are not strings at all (unhashable ones included), dict keys that are not strings, types
JSON does not have, bad durabilities and expected versions. Each example must end in a typed
error (a `LocalStateError` naming one of the problems the example has) or a correct round trip
(what was set reads back as JSON decodes it, at the next version); never another exception, a
partial write (a refused write leaves the previous value and version as they were: a fixed key
that always holds a value is drawn often) or a damaged cache: after the run ``PRAGMA
integrity_check`` passes, and the reopened cache and the central DB hold exactly what the
examples acknowledged.

2,000 examples on an embedded SQLite central DB, 200 on PostgreSQL. The cache runs with
``local_sync=normal`` (no fsync per commit: power loss is not the subject here). Hypothesis keeps
no example database (``database=None``): every run draws afresh.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from fault_tally import FaultTally
from hostile import (
    FIXED,
    NON_STR_NAMES,
    RELAXED,
    as_json,
    event_loop,
    integrity,
    name_ok,
    names,
    nested,
    same_json,
    settle,
    valid_names,
    valid_values,
    value_problem,
    values,
)
from hypothesis import example, given, settings
from hypothesis import strategies as st

from localstate import (
    InvalidInput,
    InvalidName,
    LocalStateError,
    StateStore,
    VersionConflict,
)
from localstate._sync.central.central_store import CentralStore

EXAMPLES: Final = {"sqlite": 2_000, "postgresql": 200, "mysql": 200}
DELETED: Final = object()  # a model entry for a deleted key

StateKey = tuple[str, str]
Model = dict[StateKey, tuple[Any, int]]  # (value as JSON decodes it, or DELETED; version)


# -- the Python API ----------------------------------------------------------------------------


@dataclass
class PyCase:
    op: str  # set, get, delete, cas
    owner: Any
    key: Any
    value: Any
    durability: Any
    expected: Any  # cas: "current", "stale" or a hostile expected_version


#: which parts of a case are hostile; the rest is drawn valid, so that what is refused is
#: refused for that part (and valid writes are common enough to check round trips)
HOSTILE_PARTS: Final = ["nothing"] * 4 + ["names", "value", "durability", "expected",
                                          "everything"]


# built once: a strategy built inside each draw costs Hypothesis more than the example itself
_VALID_PAIRS: Final = st.one_of(st.just(FIXED), st.tuples(valid_names(), valid_names()))
_WILD_PAIRS: Final = st.one_of(st.tuples(names(), names()), st.tuples(NON_STR_NAMES, names()),
                               st.tuples(names(), NON_STR_NAMES))
_VALID_VALUES: Final = valid_values()
_WILD_VALUES: Final = values()
_VALID_DURABILITY: Final = st.sampled_from([None, "memory", "local", "central"])
_WILD_DURABILITY: Final[st.SearchStrategy[Any]] = st.sampled_from(
    ["", "LOCAL", "fast", 1, [], b"local", None, "memory"])
_VALID_EXPECTED: Final = st.sampled_from(["current", "current", "stale"])
_WILD_EXPECTED: Final = st.one_of(st.integers(), st.booleans(), st.floats(),
                                  st.text(max_size=3), st.none())
_OPS: Final = st.sampled_from(["set"] * 6 + ["get", "delete", "cas", "cas"])
_HOSTILE: Final = st.sampled_from(HOSTILE_PARTS)


@st.composite
def py_cases(draw: st.DrawFn) -> PyCase:
    op = draw(_OPS)
    hostile = draw(_HOSTILE)

    def part(name: str, valid: st.SearchStrategy[Any], wild: st.SearchStrategy[Any]) -> Any:
        return draw(wild if hostile in (name, "everything") else valid)

    owner, key = part("names", _VALID_PAIRS, _WILD_PAIRS)
    return PyCase(op, owner, key, part("value", _VALID_VALUES, _WILD_VALUES),
                  part("durability", _VALID_DURABILITY, _WILD_DURABILITY),
                  part("expected", _VALID_EXPECTED, _WILD_EXPECTED))


def expected_errors(case: PyCase, model: Model) -> list[type[LocalStateError]]:
    """The typed errors `case` may raise (any one of them: the store checks in its own order);
    empty when it must succeed."""
    errors: list[type[LocalStateError]] = []
    if case.op in ("set", "cas"):
        problem = value_problem(case.value)
        if problem is not None:
            errors.append(problem)
    if case.op != "get" and case.op != "delete" and not (
            case.durability is None or case.durability in ("memory", "local", "central")):
        errors.append(InvalidInput)
    if not (name_ok(case.owner) and name_ok(case.key)):
        errors.append(InvalidName)
    if case.op == "cas":
        expected = case.expected
        if isinstance(expected, bool) or not isinstance(expected, int):
            errors.append(InvalidInput)
        elif name_ok(case.owner) and name_ok(case.key):
            value, version = model.get((case.owner, case.key), (DELETED, 0))
            if expected != (0 if value is DELETED else version):
                errors.append(VersionConflict)
    return errors


async def run_python_case(store: StateStore, model: Model, case: PyCase) -> str:
    """Run `case`; return its outcome: "refused", or the op that succeeded."""
    k = (case.owner, case.key)
    valid_names = name_ok(case.owner) and name_ok(case.key)
    if case.op == "cas" and valid_names and case.expected in ("current", "stale"):
        value, version = model.get(k, (DELETED, 0))
        current = 0 if value is DELETED else version
        case.expected = current if case.expected == "current" else current + 1
    errors = expected_errors(case, model)
    before = model.get(k) if valid_names else None
    refused: LocalStateError | None = None
    try:
        if case.op == "set":
            result: Any = await store.set(case.owner, case.key, case.value,
                                          durability=case.durability)
        elif case.op == "cas":
            result = await store.compare_and_set(case.owner, case.key, case.value,
                                                 expected_version=case.expected,
                                                 durability=case.durability)
        elif case.op == "delete":
            result = await store.delete(case.owner, case.key)
        else:
            result = await store.get(case.owner, case.key, default=DELETED)
    except LocalStateError as exc:
        refused = exc
    if refused is not None:
        assert errors, f"{case.op} refused a valid input: {refused!r}"
        assert isinstance(refused, tuple(errors)), f"{refused!r}, expected one of {errors}"
        assert str(refused), "an error without a message"
        if valid_names:  # nothing written: the record is as it was
            await assert_holds(store, k, before)
        return "refused"
    assert not errors, f"{case.op} took what it must refuse ({errors}), returned {result!r}"
    if case.op == "get":
        want = DELETED if before is None else before[0]
        assert result is want if want is DELETED else same_json(result, want)
        return "get"
    version = 0 if before is None else before[1]
    if case.op == "delete":
        assert result is (before is not None and before[0] is not DELETED)
        if result:
            model[k] = (DELETED, version + 1)
    else:
        assert result == version + 1, f"version {result}, expected {version + 1}"
        model[k] = (as_json(case.value), result)
    await assert_holds(store, k, model.get(k))
    return case.op


async def assert_holds(store: StateStore, k: StateKey, entry: tuple[Any, int] | None) -> None:
    record = await store.record(*k)
    if entry is None or entry[0] is DELETED:
        assert record is None, record
        return
    assert record is not None
    assert record.version == entry[1]
    assert same_json(record.value, entry[0])
    assert same_json(await store.get(*k), entry[0])


async def mismatches(store: StateStore, model: Model) -> int:
    """How many keys of `model` the store does not hold as the model says."""
    wrong = 0
    for k, (value, version) in model.items():
        record = await store.record(*k)
        if value is DELETED:
            wrong += record is not None
        elif record is None or record.version != version or not same_json(record.value, value):
            wrong += 1
    return wrong


async def central_mismatches(url: str, model: Model) -> int:
    import orjson

    central = await CentralStore.open(url)
    try:
        rows = await central.read_many(list(model))
    finally:
        await central.close()
    wrong = 0
    for k, (value, version) in model.items():
        row = rows.get(k)
        if value is DELETED:
            wrong += row is not None and row.data is not None
        elif row is None or row.data is None or row.version != version or not same_json(
                orjson.loads(row.data), value):
            wrong += 1
    return wrong


def test_python_api_gives_typed_errors_or_round_trips(
    backend: str, central_url: str, tmp_path: Path, fault_tally: FaultTally
) -> None:
    cache = tmp_path / "hostile.db"
    model: Model = {}
    outcomes: Counter[str] = Counter()

    async def open_store() -> StateStore:
        # local_sync=normal: no fsync per commit; power loss is not what this test is about
        return await StateStore.open(cache_path=cache, central_url=central_url,
                                     triggerer_id="hostile", flush_interval=60,
                                     local_sync="normal")

    with event_loop() as loop:
        store = loop.run_until_complete(open_store())
        try:
            model[FIXED] = (0, loop.run_until_complete(store.set(*FIXED, 0)))

            @settings(max_examples=EXAMPLES[backend], deadline=None, database=None,
                      suppress_health_check=RELAXED)
            @given(case=py_cases())
            # found by this test: an unhashable name or durability raised a bare TypeError
            @example(case=PyCase("set", ["owner"], "key", 1, None, "current"))
            @example(case=PyCase("get", "owner", ["key"], None, None, "current"))
            @example(case=PyCase("delete", {}, "key", None, None, "current"))
            @example(case=PyCase("cas", ["owner"], "key", 1, None, 0))
            @example(case=PyCase("set", *FIXED, 1, [], "current"))
            # the deepest value that may be stored, and one level more
            @example(case=PyCase("set", *FIXED, nested(254), None, "current"))
            @example(case=PyCase("set", *FIXED, nested(255), None, "current"))
            def one(case: PyCase) -> None:
                outcomes[loop.run_until_complete(run_python_case(store, model, case))] += 1

            one()
            loop.run_until_complete(store.flush())
        finally:
            loop.run_until_complete(store.close())
        assert integrity(cache) == "ok"
        store = loop.run_until_complete(open_store())
        try:
            lost = loop.run_until_complete(mismatches(store, model))
        finally:
            loop.run_until_complete(store.close())
        lost += loop.run_until_complete(central_mismatches(central_url, model))
    settle(fault_tally, f"python api, {backend}", outcomes, examples=EXAMPLES[backend],
           write="set", others=("get", "delete", "cas"), lost=lost)
    assert lost == 0, f"{lost} of {len(model)} keys differ from what was acknowledged"
