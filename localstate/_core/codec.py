"""Values in and out: JSON through orjson, with the checks orjson does not make.

What goes in is any value orjson encodes: ``None``, bool, int (up to 64 bits), finite float, str,
list, tuple, dict with str keys, and as orjson encodes them datetimes (RFC 3339 strings),
dataclasses (objects), UUIDs, enums and numpy scalars and arrays. What comes out is what the JSON
decodes to: a datetime comes back as its ISO string, a tuple as a list.

orjson writes NaN and infinity as ``null``, silently changing the value, so they are refused here:
the encoded text is searched for ``null`` (one fast byte search), and only when it is there is the
value walked to find out whether the ``null`` came from a float.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any, Final

import orjson

from localstate.errors import ValueEncodingError, ValueTooLarge

__all__ = ["DEFAULT_MAX_VALUE_BYTES", "IMMUTABLE_TYPES", "decode", "encode"]

DEFAULT_MAX_VALUE_BYTES: Final = 64 * 1024

#: Types whose decoded value can be handed out as is: the caller cannot mutate them.
IMMUTABLE_TYPES: Final = frozenset({str, int, float, bool, type(None)})

_OPTIONS: Final = orjson.OPT_SERIALIZE_NUMPY
_dumps: Final = orjson.dumps
_MAX_DEPTH: Final = 1000


def encode(value: Any, max_bytes: int = DEFAULT_MAX_VALUE_BYTES) -> str:
    """Encode `value` as JSON text, or raise a `ValueEncodingError` / `ValueTooLarge`.

    Text, not orjson's bytes: orjson hands back a bytes object inside a 4 KiB allocation
    whatever its length (measured: 4,098 bytes held per 100-byte value), which a store keeping
    100,000 values would pay in full; ``decode()`` makes an exact-size copy for ~50 ns, and the
    central DB wants text anyway. The limit is on the UTF-8 size.
    """
    try:
        raw = _dumps(value, option=_OPTIONS)
    except (TypeError, orjson.JSONEncodeError) as exc:
        raise ValueEncodingError(
            f"value of type {type(value).__name__} cannot be stored as JSON: {exc}"
        ) from None
    size = len(raw)
    data = raw.decode()
    kind = type(value)
    if kind is float:
        if value - value != 0.0:  # inf - inf and nan - nan are nan; finite floats give 0.0
            _refuse_non_finite(value, 0)
    elif (
        kind is not int and kind is not str and kind is not bool and value is not None
        # a container (or numpy value) may hold a NaN that orjson wrote as null: look only
        # when there is a null at all
        and data.find("null") >= 0
    ):
        _refuse_non_finite(value, 0)
    if size > max_bytes:
        raise ValueTooLarge(
            f"encoded value is {size} bytes; the limit is {max_bytes} "
            "(max_value_bytes): store a reference to large data instead of the data",
            size=size,
            limit=max_bytes,
        )
    return data


def decode(data: str | bytes) -> Any:
    """Decode JSON written by `encode`."""
    return orjson.loads(data)


def _refuse_non_finite(value: Any, depth: int) -> None:
    if depth > _MAX_DEPTH:  # orjson refuses deeper values itself; stay safe anyway
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueEncodingError(
                f"{value!r} is not a JSON number: NaN and infinity are refused "
                "(orjson would store them as null)"
            )
        return
    if isinstance(value, str | int | bool) or value is None:
        return
    if isinstance(value, Mapping):
        for item in value.values():
            _refuse_non_finite(item, depth + 1)
        return
    if isinstance(value, list | tuple):
        for item in value:
            _refuse_non_finite(item, depth + 1)
        return
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        for field in dataclasses.fields(value):
            _refuse_non_finite(getattr(value, field.name), depth + 1)
        return
    dtype = getattr(value, "dtype", None)
    if dtype is not None and getattr(dtype, "kind", "") in ("f", "c"):
        # a numpy floating scalar or array
        flat = getattr(value, "flat", None)
        items = flat if flat is not None else (value,)
        for item in items:
            if not math.isfinite(float(item)):
                raise ValueEncodingError(
                    f"numpy value holds {float(item)!r}: NaN and infinity are refused "
                    "(orjson would store them as null)"
                )
