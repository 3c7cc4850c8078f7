"""The orders the ``max`` conflict policy compares values by.

* ``auto`` (plain ``max``): guessed per value: numbers by value (booleans as 0 and 1), ISO-8601
  timestamps by time, any other string as text (the caller warns: "10" sorts before "9").
* ``int``: JSON integers, and strings holding a decimal integer (``"10"``, Kafka offsets kept as
  strings), compared as integers. Booleans and floats do not fit.
* ``timestamp``: ISO-8601 date-times as strings, ``YYYY-MM-DD`` first (``2024-05-01``,
  ``2024-05-01T12:00:00Z``, ``2024-05-01T14:00:00+02:00``), compared as instants; one without an
  offset is UTC. Numbers do not fit: an epoch has no unit to agree on (store epochs under
  ``max:int``, or plain ``max``).
* ``text``: strings, compared by code point.
* ``position``: a position in a log, or an object of positions compared field by field. A
  position is an integer (or a string of decimal digits) or a Redis stream id ``"<ms>-<seq>"``,
  compared as ``(ms, seq)``. An object (a Kafka watermark ``{"0": 120, "1": 97}``, a Redis one
  ``{"id": "1718-3", "read": 1042}``) is greater or equal when none of its fields is behind the
  other's and it has every field the other has: a partial order, so two objects each ahead on
  some field are not comparable, and the central value is kept.

With a field (``max:offset:int``) the value must be an object holding that field, and the field
must fit the order. A declared order's key function raises `Unfit` for a value that does not fit.
"""

from __future__ import annotations

import re
from datetime import datetime, timezone
from typing import Any, Final

__all__ = ["AUTO", "ORDERS", "Position", "Unfit", "auto_key", "declared_key", "position_of",
           "shown"]

AUTO: Final = "auto"
#: every order name a spec may end with
ORDERS: Final = (AUTO, "int", "timestamp", "text", "position")

_WHAT: Final = {
    "int": 'integers (a JSON integer or a string of decimal digits, like 42 or "42")',
    "timestamp": 'ISO-8601 timestamps (strings like "2024-05-01T12:00:00Z")',
    "text": "strings",
    "position": ('positions (an integer, a stream id like "1718-3", or an object of them '
                 'like {"0": 120, "1": 97})'),
}
_DECIMAL: Final = re.compile(r"-?[0-9]+")
_STREAM_ID: Final = re.compile(r"([0-9]+)-([0-9]+)")


class Unfit(Exception):
    """A value that does not fit a declared order."""

    def __init__(self, expected: str, value: Any) -> None:
        super().__init__(expected)
        #: what the order compares, for messages ("integers (...)")
        self.expected = expected
        self.value = value


def shown(value: Any, limit: int = 80) -> str:
    """`value` for a message: its repr, cut at `limit` characters."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def declared_key(order: str, field: str | None, value: Any) -> Any:
    """The comparison key of decoded `value` under declared `order` (of `field`), or `Unfit`."""
    if field is not None:
        if not isinstance(value, dict) or field not in value:
            raise Unfit(f"objects whose field {field!r} holds {_WHAT[order]}", value)
        key = _key(order, value[field])
        if key is None:
            raise Unfit(f"objects whose field {field!r} holds {_WHAT[order]}", value)
        return key
    key = _key(order, value)
    if key is None:
        raise Unfit(_WHAT[order], value)
    return key


class Position:
    """The ``position`` order's key: one position (a tuple of integers) or an object of them,
    ordered field by field (a field the other lacks is ahead of it)."""

    __slots__ = ("fields",)

    def __init__(self, fields: dict[str, tuple[int, ...]]) -> None:
        #: each field's position; a plain position is the one field ""
        self.fields = fields

    def covers(self, other: Position) -> bool:
        """Whether no field of `other` is ahead of this one's (nor missing here)."""
        mine = self.fields
        return all(name in mine and mine[name] >= at for name, at in other.fields.items())

    def __ge__(self, other: object) -> bool:
        return isinstance(other, Position) and self.covers(other)

    def __le__(self, other: object) -> bool:
        return isinstance(other, Position) and other.covers(self)

    def __gt__(self, other: object) -> bool:
        return isinstance(other, Position) and self.covers(other) and self.fields != other.fields

    def __lt__(self, other: object) -> bool:
        return isinstance(other, Position) and other.covers(self) and self.fields != other.fields

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Position) and self.fields == other.fields

    def __hash__(self) -> int:
        return hash(tuple(sorted(self.fields.items())))

    def __repr__(self) -> str:
        return f"Position({self.fields!r})"


def position_of(value: Any) -> tuple[int, ...] | None:
    """One position's key: ``(n,)`` for an integer, ``(ms, seq)`` for a stream id; None when
    `value` is neither."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return (int(value),)
    if isinstance(value, str):
        if _DECIMAL.fullmatch(value):
            try:
                return (int(value),)
            except ValueError:  # beyond the interpreter's limit of digits
                return None
        found = _STREAM_ID.fullmatch(value)
        if found:
            return (int(found[1]), int(found[2]))
    return None


def _position(value: Any) -> Position | None:
    if isinstance(value, dict):
        fields: dict[str, tuple[int, ...]] = {}
        for name, field_value in value.items():
            at = position_of(field_value)
            if at is None:
                return None
            fields[str(name)] = at
        return Position(fields)
    at = position_of(value)
    return None if at is None else Position({"": at})


def _key(order: str, value: Any) -> Any:
    """The key of one value under `order`; None when it does not fit."""
    if order == "position":
        return _position(value)
    if order == "int":
        if type(value) is int:
            return value
        if isinstance(value, int) and not isinstance(value, bool):
            return int(value)
        if isinstance(value, str) and _DECIMAL.fullmatch(value):
            try:
                return int(value)
            except ValueError:  # beyond the interpreter's limit of digits
                return None
        return None
    if not isinstance(value, str):
        return None
    if order == "text":
        return value
    return timestamp(value)


def auto_key(value: Any) -> tuple[Any, bool]:
    """Plain max's key of decoded `value`, and whether it is a string compared as text."""
    if isinstance(value, bool):
        return int(value), False
    if isinstance(value, str):
        parsed = timestamp(value)
        return (value, True) if parsed is None else (parsed, False)
    return value, False


def timestamp(text: str) -> datetime | None:
    """`text` as an aware datetime when it is an ISO-8601 date(-time), else None."""
    if len(text) < 10 or not text[:4].isdigit() or text[4] != "-":
        return None
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)
