"""The wire format of the batched sink endpoints: rows, records and outcomes as JSON.

One module for both ends: `localstate.api.sink_routes` (the server's ``/api/v1/flush``,
``/api/v1/read`` and ``/api/v1/write``) decodes what `localstate.sync.api_sink.ApiSink`
encodes, and the other way round.

Every row type is a NamedTuple (`localstate.sync.rows`) and travels as a JSON array of its
fields, in the order a ``fields`` header names them (``{"DirtyRow": ["owner", ...], ...}``).
Both ends build their codecs from the NamedTuples' ``_fields`` and type hints, so a field
added to a row type later (a claim ``epoch``, say) travels without new code here. Invariants:

* A receiver maps the sender's field names onto its own: a field the sender lacks takes its
  default (an error when it has none); a field the receiver does not know is refused
  (`WireError`): dropping it could drop a fence the sender relies on.
* Every field is checked against its annotation (``str``, ``int``, ``float``, ``bool``, a
  ``Literal``, a row type, or ``... | None``) before anything is built: a hostile body gets a
  typed error, never a half-made row.
* In a flush's answer an outcome's ``row`` travels as the index of the request row it answers
  (the client holds the row; the server never sends it back).

Bodies are encoded and decoded with orjson (bytes in, bytes out): a 10,000-row flush is one
``orjson.dumps`` and one ``orjson.loads`` each way.
"""

from __future__ import annotations

import math
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, TypeVar

import orjson

from localstate.errors import InvalidInput
from localstate.sync.rows import CentralRow, DirtyRow, FlushOutcome

__all__ = [
    "MAX_BATCH_BODY",
    "ROW_TYPES",
    "WireError",
    "decode_body",
    "decode_outcomes",
    "decode_rows",
    "encode_body",
    "encode_outcomes",
    "encode_rows",
    "field_header",
]

_T = TypeVar("_T", bound=tuple[Any, ...])
#: a client splits a batch whose body would be larger into several requests; the server
#: accepts batch bodies up to twice this (one row alone may be up to 4x max_value_bytes)
MAX_BATCH_BODY: Final = 32 * 1024 * 1024
#: the row types that travel, by the name the header gives them
ROW_TYPES: Final[dict[str, type[Any]]] = {
    t.__name__: t for t in (DirtyRow, CentralRow, FlushOutcome)}


class WireError(InvalidInput):
    """A body that does not follow the wire format (the API answers 422)."""


def field_header(*kinds: type[Any]) -> dict[str, list[str]]:
    """The ``fields`` header naming each row type's fields, in the order they travel."""
    return {k.__name__: list(k._fields) for k in kinds}


def _as_array(value: Any) -> Any:
    """orjson's fallback: a row (a NamedTuple, which orjson does not write) as its fields."""
    if isinstance(value, tuple):
        return tuple(value)
    raise TypeError(f"{type(value).__name__} does not travel on the wire")


def encode_body(body: Mapping[str, Any]) -> bytes:
    try:
        return orjson.dumps(body, default=_as_array)
    except orjson.JSONEncodeError as exc:  # an integer beyond 64 bits, say
        raise WireError(f"cannot send this as JSON: {exc}") from None


def decode_body(raw: bytes | str) -> dict[str, Any]:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise WireError(f"the body is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise WireError("the body must be a JSON object")
    return body


# -- the checks each field gets, from its annotation ---------------------------------------


@dataclass(frozen=True)
class _Allowed:
    """What a field's annotation lets through, checked a whole column at a time (the types
    of a column are collected in C: ``set(map(type, column))``)."""

    types: frozenset[type[Any]]
    #: for a Literal: the values allowed (None: any value of `types`)
    values: frozenset[Any] | None = None

    def check(self, column: Sequence[Any], where: str) -> None:
        seen = set(map(type, column))
        if not seen <= self.types:
            bad = next(v for v in column if type(v) not in self.types)
            raise WireError(f"{where} has a value of the wrong type: {_shown(bad)}")
        if self.values is not None and not set(column) <= self.values:
            bad = next(v for v in column if v not in self.values)
            raise WireError(f"{where} has a value it may not have: {_shown(bad)}")
        if float in seen and not all(math.isfinite(v) for v in column if type(v) is float):
            raise WireError(f"{where} holds a number that is not finite")


def _allowed(annotation: Any, where: str) -> _Allowed:
    """The JSON types (and Literal values) an annotation admits. ``float`` admits ints (JSON
    has one number type), ``int`` never admits a bool."""
    origin = typing.get_origin(annotation)
    if origin is typing.Union or origin is types.UnionType:
        parts = [_allowed(a, where) for a in typing.get_args(annotation)]
        literal = [p.values for p in parts if p.values is not None]
        values = frozenset().union(*literal) | (
            {None} if any(p.types == {type(None)} for p in parts) else set()) if literal else None
        return _Allowed(frozenset().union(*(p.types for p in parts)), values)
    if origin is typing.Literal:
        allowed = frozenset(typing.get_args(annotation))
        return _Allowed(frozenset(map(type, allowed)), allowed)
    simple: dict[Any, frozenset[type[Any]]] = {
        type(None): frozenset({type(None)}), str: frozenset({str}), bool: frozenset({bool}),
        int: frozenset({int}), float: frozenset({float, int}),
    }
    if annotation in simple:
        return _Allowed(simple[annotation])
    if isinstance(annotation, type) and annotation.__name__ in ROW_TYPES:
        return _Allowed(frozenset({list}))  # decoded (and checked) by its own codec
    raise TypeError(f"{where}: no wire check for the annotation {annotation!r}")


def _nested(annotation: Any) -> type[Any] | None:
    """The row type an annotation holds (``CentralRow | None`` -> CentralRow), if any."""
    for a in (annotation, *typing.get_args(annotation)):
        if isinstance(a, type) and a.__name__ in ROW_TYPES:
            return a
    return None


class _Codec:
    """Decodes rows of one type from the sender's field order, checking every field.

    Column by column: the rows are transposed (``zip(*rows)``), each column's types checked
    at once, nested rows decoded as a column of their own, and the rows built with the
    NamedTuple's ``_make`` over the columns zipped back: no Python code runs per field.
    """

    def __init__(self, kind: type[Any], sent: Sequence[str]) -> None:
        hints = typing.get_type_hints(kind)
        fields: tuple[str, ...] = kind._fields
        unknown = [f for f in sent if f not in fields]
        if unknown:
            raise WireError(
                f"{kind.__name__} fields {unknown} are unknown to this side (localstate "
                "versions differ: upgrade the older of the API server and the client)")
        defaults: dict[str, Any] = kind._field_defaults
        missing = [f for f in fields if f not in sent and f not in defaults]
        if missing:
            raise WireError(f"{kind.__name__} fields {missing} are missing from the body")
        self.kind = kind
        self.width = len(sent)
        position = {f: i for i, f in enumerate(sent)}
        #: per own field: (position in the sent array or None, default, allowed, nested type,
        #: where: for messages)
        self.plan = [
            (position.get(f), defaults.get(f), _allowed(hints[f], f"{kind.__name__}.{f}"),
             _nested(hints[f]), f"{kind.__name__}.{f}")
            for f in fields
        ]

    def decode(self, values: Any, nested: Mapping[type[Any], _Codec],
               refs: Sequence[Any] | None = None) -> list[Any]:
        """`values` (a JSON array of rows) as rows of this type; with `refs`, a field of
        type DirtyRow is an index into `refs` (an outcome's row)."""
        if not isinstance(values, list):
            raise WireError(f"expected an array of {self.kind.__name__} rows")
        n = len(values)
        if n == 0:
            return []
        if set(map(type, values)) != {list} or set(map(len, values)) != {self.width}:
            raise WireError(f"a {self.kind.__name__} must be an array of {self.width} fields")
        sent_columns = list(zip(*values, strict=True))
        columns: list[Sequence[Any]] = []
        for pos, default, allowed, inner, where in self.plan:
            column: Sequence[Any] = [default] * n if pos is None else sent_columns[pos]
            if inner is DirtyRow and refs is not None:
                columns.append(_by_index(column, refs, where))
                continue
            allowed.check(column, where)
            if inner is not None:
                column = _nested_column(column, nested[inner], nested)
            columns.append(column)
        return list(map(self.kind._make, zip(*columns, strict=True)))


def _by_index(column: Sequence[Any], refs: Sequence[Any], where: str) -> list[Any]:
    if set(map(type, column)) != {int} or min(column) < 0 or max(column) >= len(refs):
        raise WireError(f"{where} must index the request's rows")
    return list(map(refs.__getitem__, column))


def _nested_column(column: Sequence[Any], codec: _Codec, nested: Mapping[type[Any], _Codec]
                   ) -> list[Any]:
    """A column of nested rows (None where the field is None) decoded by `codec`."""
    present = [v for v in column if v is not None]
    decoded = iter(codec.decode(present, nested))
    if len(present) == len(column):
        return list(decoded)
    return [None if v is None else next(decoded) for v in column]


def _shown(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def _codecs(header: Any, *kinds: type[Any], by_index: type[Any] | None = None
            ) -> dict[type[Any], _Codec]:
    """A codec for each of `kinds` (and the row types they nest, but `by_index`, which
    travels as an index into the request's rows) from the body's header."""
    if not isinstance(header, dict):
        raise WireError("the body has no 'fields' object naming each row type's fields")
    wanted: list[type[Any]] = list(kinds)
    out: dict[type[Any], _Codec] = {}
    while wanted:
        kind = wanted.pop()
        if kind in out:
            continue
        sent = header.get(kind.__name__)
        if not isinstance(sent, list) or not all(isinstance(f, str) for f in sent):
            raise WireError(f"'fields' must name the fields of {kind.__name__}")
        out[kind] = _Codec(kind, sent)
        hints = typing.get_type_hints(kind)
        wanted.extend(n for f in kind._fields
                      if (n := _nested(hints[f])) is not None and n is not by_index)
    return out


# -- rows (DirtyRow, CentralRow) -----------------------------------------------------------


def encode_rows(rows: Sequence[tuple[Any, ...]]) -> list[Any]:
    """Rows of one NamedTuple type, ready for `encode_body` (which writes each row, and each
    nested one, as the array of its fields)."""
    return list(rows)


def decode_rows(kind: type[_T], header: Any, values: Any) -> list[_T]:
    """The rows of type `kind` a body carries, checked field by field (`WireError`)."""
    if not isinstance(values, list):
        raise WireError(f"expected an array of {kind.__name__} rows")
    codecs = _codecs(header, kind)
    return codecs[kind].decode(values, codecs)


# -- outcomes (FlushOutcome): rows by index ------------------------------------------------


#: the position of FlushOutcome's field that holds the request row it answers
_ROW_FIELD: Final = next(
    i for i, f in enumerate(FlushOutcome._fields)
    if _nested(typing.get_type_hints(FlushOutcome)[f]) is DirtyRow)


def encode_outcomes(outcomes: Sequence[FlushOutcome], rows: Sequence[DirtyRow]) -> list[Any]:
    """`outcomes` ready for `encode_body`, each one's row as its index in `rows` (the
    request's: one row per key, as a flush batch is)."""
    if not outcomes:
        return []
    by_id = {id(r): i for i, r in enumerate(rows)}
    columns = list(zip(*outcomes, strict=True))
    answered = columns[_ROW_FIELD]
    try:
        columns[_ROW_FIELD] = tuple(map(by_id.__getitem__, map(id, answered)))
    except KeyError:  # a sink that made new row objects: match them by key
        by_key = {(r.owner, r.key): i for i, r in enumerate(rows)}
        columns[_ROW_FIELD] = tuple(by_key[(r.owner, r.key)] for r in answered)
    return list(zip(*columns, strict=True))


def decode_outcomes(header: Any, values: Any, rows: Sequence[DirtyRow]) -> list[FlushOutcome]:
    """The outcomes a flush answered, their rows taken from `rows` (the request's)."""
    if not isinstance(values, list):
        raise WireError("expected an array of FlushOutcome rows")
    codecs = _codecs(header, FlushOutcome, by_index=DirtyRow)
    return codecs[FlushOutcome].decode(values, codecs, rows)
