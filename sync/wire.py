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
from collections.abc import Callable, Mapping, Sequence
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


def encode_body(body: Mapping[str, Any]) -> bytes:
    try:
        return orjson.dumps(body)
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


def _check_for(annotation: Any, where: str) -> Callable[[Any], bool]:
    """A predicate: does a decoded JSON value fit `annotation`?"""
    origin = typing.get_origin(annotation)
    if origin is typing.Union or origin is types.UnionType:
        checks = [_check_for(a, where) for a in typing.get_args(annotation)]
        return lambda v: any(c(v) for c in checks)
    if origin is typing.Literal:
        allowed = frozenset(typing.get_args(annotation))
        return lambda v: isinstance(v, str) and v in allowed
    if annotation is type(None):
        return lambda v: v is None
    if annotation is str:
        return lambda v: isinstance(v, str)
    if annotation is bool:
        return lambda v: isinstance(v, bool)
    if annotation is int:
        return lambda v: isinstance(v, int) and not isinstance(v, bool)
    if annotation is float:
        return lambda v: (isinstance(v, float) and math.isfinite(v)) or (
            isinstance(v, int) and not isinstance(v, bool))
    if isinstance(annotation, type) and annotation.__name__ in ROW_TYPES:
        return lambda v: isinstance(v, list)  # decoded (and checked) by its own codec
    raise TypeError(f"{where}: no wire check for the annotation {annotation!r}")


def _nested(annotation: Any) -> type[Any] | None:
    """The row type an annotation holds (``CentralRow | None`` -> CentralRow), if any."""
    for a in (annotation, *typing.get_args(annotation)):
        if isinstance(a, type) and a.__name__ in ROW_TYPES:
            return a
    return None


class _Codec:
    """Decodes one row type from the sender's field order, checking every field."""

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
        #: per own field: (position in the sent array or None, default, check, nested type)
        self.plan = [
            (position.get(f), defaults.get(f), _check_for(hints[f], f"{kind.__name__}.{f}"),
             _nested(hints[f]), f)
            for f in fields
        ]
        self.same_order = tuple(sent) == fields

    def decode(self, value: Any, nested: Mapping[type[Any], _Codec],
               refs: Sequence[Any] | None = None) -> Any:
        if not isinstance(value, list) or len(value) != self.width:
            raise WireError(f"a {self.kind.__name__} must be an array of {self.width} fields")
        out: list[Any] = []
        for pos, default, check, inner, name in self.plan:
            v = default if pos is None else value[pos]
            if inner is not None and refs is not None and inner is DirtyRow:
                # an outcome's row: the index of the request row it answers
                if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < len(refs):
                    raise WireError(f"{self.kind.__name__}.{name} must index the request rows")
                out.append(refs[v])
                continue
            if not check(v):
                raise WireError(f"{self.kind.__name__}.{name} has a value of the wrong type: "
                                f"{_shown(v)}")
            if inner is not None and v is not None:
                v = nested[inner].decode(v, nested)
            out.append(v)
        return self.kind._make(out)


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


def _plain(value: Any) -> Any:
    """A NamedTuple as a list of its fields (nested ones too); anything else as it is."""
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return [_plain(v) for v in value]
    return value


def encode_rows(rows: Sequence[tuple[Any, ...]]) -> list[Any]:
    """Rows of one NamedTuple type as arrays (with nested rows as arrays)."""
    if rows and any(isinstance(v, tuple) for v in rows[0]):
        return [_plain(r) for r in rows]
    return [list(r) for r in rows]


def decode_rows(kind: type[_T], header: Any, values: Any) -> list[_T]:
    """The rows of type `kind` a body carries, checked field by field (`WireError`)."""
    if not isinstance(values, list):
        raise WireError(f"expected an array of {kind.__name__} rows")
    codecs = _codecs(header, kind)
    codec = codecs[kind]
    return [codec.decode(v, codecs) for v in values]


# -- outcomes (FlushOutcome): rows by index ------------------------------------------------


#: the position of FlushOutcome's field that holds the request row it answers
_ROW_FIELD: Final = next(
    i for i, f in enumerate(FlushOutcome._fields)
    if _nested(typing.get_type_hints(FlushOutcome)[f]) is DirtyRow)


def encode_outcomes(outcomes: Sequence[FlushOutcome], rows: Sequence[DirtyRow]) -> list[Any]:
    """`outcomes` as arrays, each one's row as its index in `rows` (the request's: one row
    per key, as a flush batch is)."""
    index = {(r.owner, r.key): i for i, r in enumerate(rows)}
    out: list[Any] = []
    for o in outcomes:
        fields = [_plain(v) for v in o]
        row: DirtyRow = o[_ROW_FIELD]  # type: ignore[assignment]  # the DirtyRow field
        fields[_ROW_FIELD] = index[(row.owner, row.key)]
        out.append(fields)
    return out


def decode_outcomes(header: Any, values: Any, rows: Sequence[DirtyRow]) -> list[FlushOutcome]:
    """The outcomes a flush answered, their rows taken from `rows` (the request's)."""
    if not isinstance(values, list):
        raise WireError("expected an array of FlushOutcome rows")
    codecs = _codecs(header, FlushOutcome, by_index=DirtyRow)
    codec = codecs[FlushOutcome]
    return [codec.decode(v, codecs, rows) for v in values]
