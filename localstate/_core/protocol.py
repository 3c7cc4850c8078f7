"""The HTTP protocol between localstate's API server and its clients, both ends in one module.

The server (`localstate.api`), the REST client (`localstate.client`) and the API sink
(`localstate._sync.sinks.api_sink`) all read it:

* the paths (`API_PREFIX`, `STATE_PATH`, `item_path`, the batched sink endpoints' paths);
* the error table, both directions: the answer (status, code, detail) the server gives for each
  typed error (`answer_for`), and the typed error a client raises for an error answer
  (`error_for`);
* the wire format of the batched sink endpoints (``/api/v1/`` ``flush``, ``read``, ``write``,
  ``claim``, ``release``): rows, records and outcomes as JSON.

No HTTP library is imported here: the server (FastAPI) and the clients (httpx) adapt these to
their own types, so each end reads the same table.

Invariant of the error table: a typed error the server answers with comes back as the same type
at the client (``error_for`` of ``answer_for(e)``'s answer is ``type(e)`` for every error a
caller can cause; the server's own failures come back as `CentralUnavailable` or
`CentralError`, their text kept out of the answer).

Every row type is a NamedTuple (`localstate._core.rows`) and travels as a JSON array of its
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

import functools
import itertools
import math
import operator
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol, TypeVar
from urllib.parse import quote

import orjson

from localstate._core.body_slices import decode_in_slices
from localstate._core.codec import decode
from localstate._core.model import check_name
from localstate._core.rows import CentralRow, DirtyRow, FlushOutcome
from localstate.errors import (
    AccessDenied,
    CacheError,
    CentralError,
    CentralUnavailable,
    InvalidInput,
    InvalidName,
    LocalStateError,
    StoreClosed,
    ValueEncodingError,
    ValueTooLarge,
    VersionConflict,
    VersionExhausted,
    WriteRejected,
)

__all__ = [
    "API_PREFIX",
    "ASSET_STATE_SOURCE",
    "CLAIM_PATH",
    "FLEET_PATH",
    "FLUSH_PATH",
    "HEALTH_PATH",
    "HISTORY_PATH",
    "LIST_PATH",
    "MAX_BATCH_BODY",
    "MAX_BATCH_ROWS",
    "READ_PATH",
    "RELEASE_PATH",
    "ROW_TYPES",
    "STATE_PATH",
    "STATUS_PATH",
    "WRITE_PATH",
    "ErrorAnswer",
    "HttpAnswer",
    "WireError",
    "answer_for",
    "body_of",
    "decode_body",
    "decode_outcomes",
    "decode_rows",
    "encode_body",
    "encode_outcomes",
    "encode_rows",
    "error_for",
    "field_header",
    "item_path",
]

_T = TypeVar("_T", bound=tuple[Any, ...])
#: ``"source"`` of a ``/api/v1/read`` of keys: Airflow's ``asset_state_store`` rows of asset
#: owners (`localstate._sync.sinks.asset_states`), not localstate's table (no source)
ASSET_STATE_SOURCE: Final = "asset_state_store"
#: a client splits a batch whose body would be larger into several requests (down to one row,
#: which may be up to 4x max_value_bytes); the server's limit is
#: `localstate._core.config.max_batch_body`
MAX_BATCH_BODY: Final = 32 * 1024 * 1024
#: most rows a client sends in one flush request (the server's api_max_batch_rows default)
MAX_BATCH_ROWS: Final = 100_000
#: the row types that travel, by the name the header gives them
ROW_TYPES: Final[dict[str, type[Any]]] = {
    t.__name__: t for t in (DirtyRow, CentralRow, FlushOutcome)}


class WireError(InvalidInput):
    """A body that does not follow the wire format (the API answers 422)."""


# -- the paths ------------------------------------------------------------------------------

#: where every route of the API is mounted, below the server's base URL
API_PREFIX: Final = "/api/v1"
#: the list of state variables (``GET``, with ``owner_prefix``, ``limit``, ``cursor``)
LIST_PATH: Final = f"{API_PREFIX}/state"
#: one state variable's routes, before the owner and key segments (`item_path`)
STATE_PATH: Final = f"{LIST_PATH}/"
HEALTH_PATH: Final = f"{API_PREFIX}/health"
STATUS_PATH: Final = f"{API_PREFIX}/status"
FLEET_PATH: Final = f"{API_PREFIX}/fleet"
#: an owner's history (``GET``, with ``owner``, ``before``, ``limit``, ``kind``)
HISTORY_PATH: Final = f"{API_PREFIX}/history"
#: the batched sink endpoints (`localstate._sync.sinks.api_sink` to `localstate.api._sink_routes`)
FLUSH_PATH: Final = f"{API_PREFIX}/flush"
READ_PATH: Final = f"{API_PREFIX}/read"
WRITE_PATH: Final = f"{API_PREFIX}/write"
CLAIM_PATH: Final = f"{API_PREFIX}/claim"
RELEASE_PATH: Final = f"{API_PREFIX}/release"


def item_path(owner: str, key: str) -> str:
    """The path of one state variable: owner and key one percent-encoded segment each (a '/'
    inside a name travels as ``%2F``, dots as ``%2E`` so that "." and ".." are never resolved
    away). Raises `InvalidName` for a name the store would refuse."""
    check_name("owner", owner)
    check_name("key", key)
    return f"{STATE_PATH}{_segment(owner)}/{_segment(key)}"


def _segment(name: str) -> str:
    return quote(name, safe="").replace(".", "%2E")


# -- the error table, both directions -------------------------------------------------------


@dataclass(frozen=True)
class ErrorAnswer:
    """What the API answers for one typed error."""

    status: int
    #: the body's ``error`` code
    code: str
    detail: dict[str, Any] | None = None
    #: a failure of the server, not of the request: its text goes to the server's log, and
    #: the body says this instead
    public: str | None = None
    #: the answer carries ``Retry-After``: the same request may succeed shortly
    retry_after: bool = False


def answer_for(exc: LocalStateError) -> ErrorAnswer:
    """The answer for one of localstate's typed errors (error -> status)."""
    if isinstance(exc, VersionConflict):
        return ErrorAnswer(409, "version_conflict", {"expected_version": exc.expected,
                                                     "actual_version": exc.actual})
    if isinstance(exc, VersionExhausted):
        return ErrorAnswer(409, "version_exhausted", {"owner": exc.owner, "key": exc.key})
    if isinstance(exc, WriteRejected):
        return ErrorAnswer(409, "write_rejected")
    if isinstance(exc, ValueTooLarge):
        return ErrorAnswer(413, "value_too_large", {"size": exc.size, "limit": exc.limit})
    if isinstance(exc, InvalidName):
        return ErrorAnswer(422, "invalid_name")
    if isinstance(exc, ValueEncodingError):
        return ErrorAnswer(422, "invalid_value")
    if isinstance(exc, InvalidInput):
        return ErrorAnswer(422, "invalid_input")
    if isinstance(exc, CentralUnavailable):
        return ErrorAnswer(503, "central_unavailable", public="the central DB cannot be "
                           "reached; try again shortly", retry_after=True)
    if isinstance(exc, CentralError):
        return ErrorAnswer(502, "central_error",
                           public="the central DB failed on this request")
    if isinstance(exc, StoreClosed | CacheError):
        return ErrorAnswer(503, "store_unavailable", public="the serving store is unavailable "
                           "(the server may be shutting down); try again shortly",
                           retry_after=True)
    return ErrorAnswer(500, "internal_error", public="the server failed on this request")


class _Url(Protocol):
    @property
    def path(self) -> str: ...


class _Request(Protocol):
    @property
    def method(self) -> str: ...
    @property
    def url(self) -> _Url: ...


class HttpAnswer(Protocol):
    """What `error_for` reads of an HTTP response (an ``httpx.Response`` is one)."""

    @property
    def status_code(self) -> int: ...
    @property
    def text(self) -> str: ...
    @property
    def reason_phrase(self) -> str: ...
    @property
    def request(self) -> _Request: ...


def body_of(response: HttpAnswer) -> dict[str, Any]:
    """The JSON object an answer carries ({} if it carries none)."""
    try:
        body = decode(response.text)
    except (ValueError, LocalStateError):
        body = None
    return body if isinstance(body, dict) else {}


def error_for(response: HttpAnswer) -> LocalStateError:
    """The typed error for a 4xx or 5xx answer of the API (status -> error)."""
    body = body_of(response)
    status = response.status_code
    code = str(body.get("error", ""))
    found = body.get("detail")
    detail: Mapping[str, Any] = found if isinstance(found, dict) else {}
    message = str(body.get("message") or response.reason_phrase or f"HTTP {status}")
    message = f"{message} ({response.request.method} {response.request.url.path}: {status})"
    if status in (401, 403):
        return AccessDenied(message, status=status)
    if status == 409 and code == "version_conflict":
        return VersionConflict(message, expected=int(detail.get("expected_version", -1)),
                               actual=int(detail.get("actual_version", -1)))
    if status == 409 and code == "version_exhausted":
        return VersionExhausted(message, owner=str(detail.get("owner", "")),
                                key=str(detail.get("key", "")))
    if status == 409:
        return WriteRejected(message)
    if status == 413:
        return ValueTooLarge(message, size=int(detail.get("size", -1)),
                             limit=int(detail.get("limit", -1)))
    if status == 422:
        if code == "invalid_name":
            return InvalidName(message)
        if code == "invalid_value":
            return ValueEncodingError(message)
        return InvalidInput(message)
    if status == 503:
        return CentralUnavailable(message)
    if status >= 500:
        return CentralError(message)
    return LocalStateError(message)


# -- the wire format of the batched sink endpoints ------------------------------------------


def field_header(*kinds: type[Any]) -> dict[str, list[str]]:
    """The ``fields`` header naming each row type's fields, in the order they travel."""
    return {k.__name__: list(k._fields) for k in kinds}


def encode_body(body: Mapping[str, Any]) -> bytes:
    """`body` as JSON; a row (a NamedTuple, which orjson does not write itself) as the array
    of its fields, through ``default=tuple`` (called from C, no Python frame per row)."""
    try:
        return orjson.dumps(body, default=tuple)
    except orjson.JSONEncodeError as exc:  # an integer beyond 64 bits, say
        raise WireError(f"cannot send this as JSON: {exc}") from None


def decode_body(raw: bytes | bytearray | str, *, sliced: str | None = None,
                on_items: Callable[[int], None] | None = None) -> dict[str, Any]:
    """The JSON object `raw` holds (`WireError` for anything else). `sliced`: the name of its
    big top-level array (a flush's ``rows``), decoded a slice at a time so that a thread
    decoding a large body gives other threads (the event loop's) their turns between slices;
    `on_items` hears that array's running length (`localstate._core.body_slices`)."""
    try:
        if sliced is not None and not isinstance(raw, str):
            body = decode_in_slices(raw, sliced, on_items)
        else:
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
        if float in seen and not (
                all(map(math.isfinite, column)) if type(None) not in seen
                else all(math.isfinite(v) for v in column if v is not None)):
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
        self.make = functools.partial(tuple.__new__, kind)
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
        # tuple.__new__ straight from C: each zipped row has exactly the type's fields
        return list(map(self.make, zip(*columns, strict=True)))


def _by_index(column: Sequence[Any], refs: Sequence[Any], where: str) -> list[Any]:
    if set(map(type, column)) != {int} or min(column) < 0 or max(column) >= len(refs):
        raise WireError(f"{where} must index the request's rows")
    return list(map(refs.__getitem__, column))


def _nested_column(column: Sequence[Any], codec: _Codec, nested: Mapping[type[Any], _Codec]
                   ) -> list[Any]:
    """A column of nested rows (None where the field is None) decoded by `codec`."""
    present = list(itertools.compress(column, map(operator.is_not, column,
                                                  itertools.repeat(None))))
    if not present:
        return list(column)
    decoded = codec.decode(present, nested)
    if len(present) == len(column):
        return decoded
    rest = iter(decoded)
    return [None if v is None else next(rest) for v in column]


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


# -- outcomes (FlushOutcome): rows by index, plain writes compact ----------------------------
#
# A flush's common answer is "written, no conflict, the central record is the row at version
# V". Such an outcome travels as ``[row index, V, policy]`` in the answer's ``written`` list:
# the client rebuilds the central record from its own row (every field the two row types
# share, by name; CentralRow's other fields at their defaults). Any other outcome travels in
# full in ``outcomes``. A field added to both row types is carried by the shared names; one
# added to CentralRow only must have a default, or the server sends every outcome in full.

#: the position of FlushOutcome's field that holds the request row it answers
_ROW_FIELD: Final = next(
    i for i, f in enumerate(FlushOutcome._fields)
    if _nested(typing.get_type_hints(FlushOutcome)[f]) is DirtyRow)
#: CentralRow's fields a plain write takes from its row (all the shared ones but version)
_SHARED: Final = tuple(f for f in CentralRow._fields if f in DirtyRow._fields and f != "version")
_CENTRAL_ONLY: Final = tuple(f for f in CentralRow._fields
                             if f not in DirtyRow._fields and f != "version")
#: FlushOutcome's fields a compact outcome leaves at their defaults
_PLAIN: Final = ("row", "resolution", "central", "conflict", "policy")
_OUTCOME_REST: Final = tuple(f for f in FlushOutcome._fields if f not in _PLAIN)


def _getter(names: Sequence[str]) -> Callable[[Any], Any]:
    """attrgetter of `names` (a scalar for one name, a tuple for several: compare its results
    only with its own); for none, a constant."""
    return operator.attrgetter(*names) if names else (lambda _obj: ())


def _defaults_as(kind: type[Any], names: Sequence[str]) -> Any:
    """`_getter(names)` applied to `kind`'s defaults; `_NO_DEFAULT` when one has none."""
    if not all(n in kind._field_defaults for n in names):
        return _NO_DEFAULT
    return _getter(names)(types.SimpleNamespace(**kind._field_defaults))


_NO_DEFAULT: Final = object()
_shared_of: Final = _getter(_SHARED)
_central_only_of: Final = _getter(_CENTRAL_ONLY)
_outcome_rest_of: Final = _getter(_OUTCOME_REST)
#: CentralRow's own fields and FlushOutcome's others at their defaults: a compact outcome
#: has them so (a field without a default never matches: every outcome then travels in full)
_CENTRAL_DEFAULTS: Final = _defaults_as(CentralRow, _CENTRAL_ONLY)
_OUTCOME_DEFAULTS: Final = _defaults_as(FlushOutcome, _OUTCOME_REST)


def _plain_write(o: FlushOutcome) -> bool:
    c = o.central
    return (o.resolution == "written" and not o.conflict and c is not None
            and _central_only_of(c) == _CENTRAL_DEFAULTS
            and _outcome_rest_of(o) == _OUTCOME_DEFAULTS and _shared_of(c) == _shared_of(o.row))


def encode_outcomes(outcomes: Sequence[FlushOutcome], rows: Sequence[DirtyRow]
                    ) -> tuple[list[Any], list[Any]]:
    """(written, outcomes): the plain writes compact and the rest in full, ready for
    `encode_body`, each one's row as its index in `rows` (the request's: one row per key)."""
    by_id = {id(r): i for i, r in enumerate(rows)}
    by_key: dict[tuple[str, str], int] | None = None

    def index(r: DirtyRow) -> int:
        nonlocal by_key
        i = by_id.get(id(r))
        if i is None:  # a sink that made new row objects: match them by key
            by_key = by_key or {(x.owner, x.key): n for n, x in enumerate(rows)}
            i = by_key[(r.owner, r.key)]
        return i

    written: list[Any] = []
    full: list[Any] = []
    for o in outcomes:
        if _plain_write(o):
            written.append((index(o.row), o.central.version, o.policy))  # type: ignore[union-attr]
        else:
            fields: list[Any] = list(o)
            fields[_ROW_FIELD] = index(o.row)
            full.append(fields)
    return written, full


def decode_outcomes(header: Any, written: Any, values: Any, rows: Sequence[DirtyRow]
                    ) -> list[FlushOutcome]:
    """The outcomes a flush answered, their rows taken from `rows` (the request's)."""
    codecs = _codecs(header, FlushOutcome, by_index=DirtyRow)
    out: list[FlushOutcome] = codecs[FlushOutcome].decode(values, codecs, rows)
    if not isinstance(written, list):
        raise WireError("expected an array of [row, version, policy] written rows")
    if not written:
        return out
    if set(map(type, written)) != {list} or set(map(len, written)) != {3}:
        raise WireError("each written row must be [row index, version, policy]")
    at, versions, policies = zip(*written, strict=True)
    mine = _by_index(at, rows, "written row")
    _Allowed(frozenset({int})).check(versions, "written version")
    _Allowed(frozenset({str})).check(policies, "written policy")
    n = len(mine)
    central_columns = [
        versions if f == "version" else list(map(operator.attrgetter(f), mine)) if f in _SHARED
        else [CentralRow._field_defaults[f]] * n
        for f in CentralRow._fields]
    centrals = list(map(functools.partial(tuple.__new__, CentralRow),
                        zip(*central_columns, strict=True)))
    given: dict[str, Sequence[Any]] = {"row": mine, "resolution": ["written"] * n,
                                       "central": centrals, "conflict": [False] * n,
                                       "policy": policies}
    outcome_columns = [given.get(f) or [FlushOutcome._field_defaults.get(f)] * n
                       for f in FlushOutcome._fields]
    out.extend(map(functools.partial(tuple.__new__, FlushOutcome),
                   zip(*outcome_columns, strict=True)))
    return out
