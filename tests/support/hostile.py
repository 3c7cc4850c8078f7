"""Hostile owners, keys and values for the hostile-input faults, and the oracle that says what
each should give.

The oracle is written from the documented rules, not from the code under test: a name is a str
of 1 to 250 characters without C0/C1 control characters or lone surrogates; a value is JSON
(None, bool, str without lone surrogates, int within [-2**63, 2**64 - 1], finite float, lists,
tuples and dicts with str keys) nested at most 254 deep (orjson's limit), at most
`max_value_bytes` encoded. Anything else must be refused with a typed error, and everything
else must come back as JSON decodes it (`as_json`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import re
import sqlite3
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import orjson
from disks import integrity
from fault_tally import FaultTally
from hypothesis import HealthCheck
from hypothesis import strategies as st

from localstate._core.codec import DEFAULT_MAX_VALUE_BYTES
from localstate.errors import InvalidInput, ValueEncodingError, ValueTooLarge

__all__ = [
    "AWKWARD_NAMES",
    "FIXED",
    "NON_STR_NAMES",
    "RELAXED",
    "Row",
    "as_json",
    "central_row",
    "cli_value_texts",
    "event_loop",
    "integrity",
    "json_text",
    "name_ok",
    "names",
    "nested",
    "parse_json_text",
    "same_json",
    "settle",
    "valid_names",
    "valid_values",
    "value_problem",
    "values",
]

#: a name pair that always holds a value: a refused write must leave it untouched
FIXED: Final = ("dag:hostile/fixed", "watermark")

MAX_NAME: Final = 250
MAX_DEPTH: Final = 254  # containers nested deeper are refused ("Recursion limit reached")
INT_MIN: Final = -(2**63)
INT_MAX: Final = 2**64 - 1
_BAD_NAME: Final = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")
_SURROGATE: Final = re.compile("[\ud800-\udfff]")

#: what Hypothesis may not complain about: a store shared by the examples on purpose, and huge
#: and deeply nested values, which are the point
RELAXED: Final = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                  HealthCheck.data_too_large, HealthCheck.large_base_example]


Row = tuple[str | None, int]  # a central record: (value JSON text, None for a tombstone; version)


def central_row(db: Path, owner: str, key: str) -> Row | None:
    """One record of an embedded central DB, read apart from the code under test."""
    with contextlib.closing(sqlite3.connect(db)) as conn:
        found = conn.execute("SELECT value, version FROM localstate_state "
                             "WHERE owner = ? AND key = ?", (owner, key)).fetchone()
    return None if found is None else (found[0], int(found[1]))


@contextlib.contextmanager
def event_loop() -> Iterator[asyncio.AbstractEventLoop]:
    """A loop of the test's own: Hypothesis calls the example function synchronously."""
    loop = asyncio.new_event_loop()
    try:
        yield loop
    finally:
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


def settle(fault_tally: FaultTally, surface: str, outcomes: Counter[str], *, examples: int,
           write: str, others: tuple[str, ...], lost: int = 0) -> None:
    """Record a surface's run in the fault suite's closing summary (inputs tried, refusals
    checked to have written nothing, writes found lost or partial), and check that the run
    exercised both answers: refusals and `write` each at least a tenth of the examples, and
    each of `others` at least once."""
    tried = sum(outcomes.values())
    fault_tally.add("inputs tried", tried)
    fault_tally.add(f"inputs tried ({surface})", tried)
    fault_tally.add("refused inputs checked to change nothing", outcomes["refused"])
    fault_tally.lost(f"hostile input ({surface}): lost or partial writes", lost)
    assert tried >= examples, outcomes
    assert outcomes["refused"] >= tried // 10, outcomes
    assert outcomes[write] >= tried // 10, outcomes
    for op in others:
        assert outcomes[op] > 0, outcomes


# -- the oracle ------------------------------------------------------------------------------


def name_ok(name: object) -> bool:
    return bool(isinstance(name, str) and 0 < len(name) <= MAX_NAME
                and _BAD_NAME.search(name) is None)


def _encodable(value: Any, depth: int) -> bool:
    kind = type(value)
    if value is None or kind is bool:
        return True
    if kind is int:
        return bool(INT_MIN <= value <= INT_MAX)
    if kind is float:
        return math.isfinite(value)
    if kind is str:
        return _SURROGATE.search(value) is None
    if kind in (list, tuple, dict):
        if depth >= MAX_DEPTH:
            return False
        if kind is dict:
            return all(type(k) is str and _SURROGATE.search(k) is None
                       and _encodable(v, depth + 1) for k, v in value.items())
        return all(_encodable(v, depth + 1) for v in value)
    return False  # bytes, sets, objects...: not JSON


def value_problem(value: Any, limit: int = DEFAULT_MAX_VALUE_BYTES
                  ) -> type[InvalidInput] | None:
    """The error a write of `value` must raise, or None when it must be stored."""
    if not _encodable(value, 0):
        return ValueEncodingError
    if len(orjson.dumps(value)) > limit:  # the JSON text's size (orjson writes it compactly)
        return ValueTooLarge
    return None


def as_json(value: Any) -> Any:
    """`value` as JSON decodes it after a round trip: tuples become lists."""
    if isinstance(value, list | tuple):
        return [as_json(v) for v in value]
    if isinstance(value, dict):
        return {k: as_json(v) for k, v in value.items()}
    return value


def same_json(a: Any, b: Any) -> bool:
    """Equal and of the same JSON types all the way down (1, 1.0 and True are not the same)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, list):
        return len(a) == len(b) and all(same_json(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same_json(a[k], b[k]) for k in a)
    return bool(a == b)


def json_text(value: Any, *, ascii_only: bool) -> str | None:
    """`value` written by the standard library, NaN and infinity included (as JavaScript would
    send them); None when it has no JSON text at all (a set, bytes...)."""
    try:
        return json.dumps(value, ensure_ascii=ascii_only, allow_nan=True)
    except (TypeError, ValueError, RecursionError):
        return None


def parse_json_text(text: str | bytes) -> tuple[bool, Any]:
    """(parsed, value) for JSON text read as strictly as JSON says (no NaN or Infinity)."""

    def refuse(constant: str) -> Any:
        raise ValueError(f"{constant} is not JSON")

    try:
        return True, json.loads(text, parse_constant=refuse)
    except (ValueError, RecursionError):  # JSONDecodeError and UnicodeDecodeError included
        return False, None


# -- names -------------------------------------------------------------------------------------

ANY_CHAR: Final = st.characters(exclude_categories=())  # lone surrogates included
CONTROL: Final = st.one_of(st.characters(max_codepoint=0x1F),
                           st.characters(min_codepoint=0x7F, max_codepoint=0x9F))
_URLISH: Final = st.sampled_from(list(":/%.?#&=+ -_~@!$'()*,;[]\\\"<>{}|^`"))
_ODD_NAMES: Final = ["", " ", ".", "..", "%2F", "%", "-", "--help", "-x", "a/b", "a%2Fb",
                     "dag:etl/load", "\x00", "\ud800", "\udfff", "null", "\u202e", "\ufeff",
                     "é", "💥", "\u2028"]


READABLE: Final = st.one_of(st.characters(min_codepoint=0x20, max_codepoint=0x7E), _URLISH,
                           st.sampled_from(list("éü€💥\u2028\ufeff")))


#: valid names that are awkward in a URL, a shell or a terminal; drawn often, so that later
#: examples read, overwrite and delete what earlier ones wrote
AWKWARD_NAMES: Final = ["dag:etl/load", "a%2Fb", "..", ".", "-x", "--help", "💥", "\u2028",
                        " ", "n" * MAX_NAME, "?q=1#f", "\\", "'\"", "\ufeff"]


def valid_names() -> st.SearchStrategy[str]:
    """Names that must be taken, made of URL- and shell-hostile characters."""
    return st.one_of(st.sampled_from(AWKWARD_NAMES), st.text(READABLE, min_size=1, max_size=24))


def names() -> st.SearchStrategy[str]:
    return st.one_of(
        valid_names(),
        st.text(ANY_CHAR, max_size=12),  # anything at all
        st.sampled_from(_ODD_NAMES),
        st.integers(MAX_NAME - 3, MAX_NAME + 3).map(lambda n: "n" * n),  # around the limit
        st.integers(1_000, 100_000).map(lambda n: "L" * n),  # very long
        st.tuples(st.text(max_size=5), CONTROL, st.text(max_size=5)).map("".join),
    )


#: not strings at all (the Python API only: argv and URLs are always text)
NON_STR_NAMES: Final = st.one_of(
    st.none(), st.integers(), st.floats(), st.binary(max_size=4),
    st.lists(st.integers(), max_size=2), st.tuples(st.text(max_size=2)),
)

# -- values ------------------------------------------------------------------------------------

_EDGE_INTS: Final = [INT_MAX, INT_MAX + 1, INT_MIN, INT_MIN - 1, 2**63 - 1, 2**63, 10**30,
                     -(10**30), 2**200]
SCALARS: Final = st.one_of(
    st.none(), st.booleans(), st.integers(), st.sampled_from(_EDGE_INTS), st.floats(),
    st.text(ANY_CHAR, max_size=20),
)


def nested(depth: int) -> list[Any]:
    """An empty list inside lists: `depth` containers in all."""
    value: list[Any] = []
    for _ in range(depth - 1):
        value = [value]
    return value


def _nest(depth: int, shape: str, leaf: Any) -> Any:
    value = leaf
    for level in range(depth):
        as_list = shape == "list" or (shape == "mixed" and level % 2)
        value = [value] if as_list else {"d": value}
    return value


# characters whose JSON text is 1, 2 or 6 bytes, or 2 to 4 bytes of UTF-8
_FILL_CHARS: Final = ["x", "é", "€", "💥", "\x00", "\\", '"', "\u2028"]


def _huge(char: str, near_limit: bool, offset: int, length: int) -> str:
    if not near_limit:
        return char * length
    per_char = len(orjson.dumps(char)) - 2
    return char * ((DEFAULT_MAX_VALUE_BYTES - 2) // per_char + offset)


def valid_values() -> st.SearchStrategy[Any]:
    """Values that must round-trip, with awkward text and edge numbers."""
    return st.recursive(
        st.one_of(st.none(), st.booleans(), st.integers(INT_MIN, INT_MAX),
                  st.sampled_from([INT_MIN, INT_MAX, 0, -1]),
                  st.floats(allow_nan=False, allow_infinity=False), st.text(READABLE)),
        lambda inner: st.one_of(st.lists(inner, max_size=4), st.tuples(inner, inner),
                                st.dictionaries(st.text(READABLE, max_size=8), inner,
                                                max_size=4)),
        max_leaves=12,
    )


def values() -> st.SearchStrategy[Any]:
    """Anything at all, JSON's corner cases first."""
    keys = st.text(ANY_CHAR, max_size=8)
    jsonish = st.recursive(
        SCALARS,
        lambda inner: st.one_of(st.lists(inner, max_size=4), st.tuples(inner, inner),
                                st.dictionaries(keys, inner, max_size=4)),
        max_leaves=12,
    )
    non_str_keys = st.dictionaries(
        st.one_of(st.integers(), st.none(), st.booleans(), st.floats(allow_nan=False),
                  st.tuples(st.integers())),
        SCALARS, min_size=1, max_size=3,
    ).map(lambda d: {"fine": 1, **d})
    deep = st.builds(_nest, st.one_of(st.integers(MAX_DEPTH - 3, MAX_DEPTH + 3),
                                      st.integers(1, 2_000)),
                     st.sampled_from(["list", "dict", "mixed"]), SCALARS)
    huge = st.builds(_huge, st.sampled_from(_FILL_CHARS), st.booleans(), st.integers(-2, 2),
                     st.integers(0, 200_000))
    unsupported = st.one_of(st.binary(max_size=4), st.sets(st.integers(), max_size=2),
                            st.complex_numbers(), st.just(object()), st.frozensets(st.none()))
    return st.one_of(valid_values(), jsonish, non_str_keys, deep, huge,
                     st.lists(huge, min_size=2, max_size=3), unsupported)


_ODD_TEXTS: Final = [
    "NaN", "Infinity", "-Infinity", "1e400", "-1e400", "", " ", "{", "[1,]", '{"a":1,"a":2}',
    '"\\ud800"', '"\\udc00x"', '"\\u0000"', "0x10", "01", "1.", ".5", "+1", "true", "null",
    "-0", "-0.0", "1E2", "123456789012345678901234567890", "-9223372036854775809",
    "18446744073709551615", "18446744073709551616", "\ufeff1", "[" * 300 + "]" * 300,
]


def _written(value: Any, ascii_only: bool) -> str:
    text = json_text(value, ascii_only=ascii_only)
    if text is not None:
        return text
    try:
        return repr(value)  # what a careless script might pass
    except RecursionError:
        return "[" * 5_000


def cli_value_texts() -> st.SearchStrategy[str]:
    """What an operator (or a script) might pass as the JSON argument of ``localstate set``."""
    written = st.builds(_written, values(), st.booleans())
    return st.one_of(
        written, st.text(ANY_CHAR, max_size=30), st.sampled_from(_ODD_TEXTS),
        st.integers().map(str), st.integers(1, 3_000).map(lambda n: "[" * n + "]" * n),
    )
