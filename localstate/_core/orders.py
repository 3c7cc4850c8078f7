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

With a field (``max:offset:int``) the value must be an object holding that field, and the field
must fit the order. A declared order's key function raises `Unfit` for a value that does not fit.
"""

from __future__ import annotations

import re
from datetime import datetime, timezone
from typing import Any, Final

__all__ = ["AUTO", "ORDERS", "Unfit", "auto_key", "declared_key", "shown"]

AUTO: Final = "auto"
#: every order name a spec may end with
ORDERS: Final = (AUTO, "int", "timestamp", "text")

_WHAT: Final = {
    "int": 'integers (a JSON integer or a string of decimal digits, like 42 or "42")',
    "timestamp": 'ISO-8601 timestamps (strings like "2024-05-01T12:00:00Z")',
    "text": "strings",
}
_DECIMAL: Final = re.compile(r"-?[0-9]+")


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


def _key(order: str, value: Any) -> Any:
    """The key of one value under `order`; None when it does not fit."""
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
