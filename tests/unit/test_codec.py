"""Values in and out of JSON: what round-trips, what is refused, and why."""

from __future__ import annotations

import enum
import uuid
from typing import Any

import pytest
from conftest import value_id

from localstate import ValueEncodingError, ValueTooLarge
from localstate._core.codec import decode, encode


class Color(enum.Enum):
    RED = "red"


@pytest.mark.parametrize(
    ("value", "decoded"),
    [
        (None, None), (True, True), (0, 0), (-(2**63), -(2**63)), (2**64 - 1, 2**64 - 1),
        (1.5, 1.5), ("null", "null"), ("ünï\u2028", "ünï\u2028"), ([], []),
        ({"a": [1, {"b": None}]}, {"a": [1, {"b": None}]}), ((1, 2), [1, 2]),
        (Color.RED, "red"),
        (uuid.UUID(int=1), "00000000-0000-0000-0000-000000000001"),
    ],
    ids=value_id,
)
def test_round_trips(value: Any, decoded: Any) -> None:
    assert decode(encode(value)) == decoded


@pytest.mark.parametrize(
    "value",
    [float("nan"), float("inf"), [float("-inf")], {"x": [{"y": float("nan")}]},
     (1, float("nan")), 2**64, -(2**63) - 1, object(), {1: 2}, b"raw", "\ud800"],
    ids=value_id,
)
def test_refused(value: Any) -> None:
    with pytest.raises(ValueEncodingError):
        encode(value)


def test_null_text_inside_containers_is_not_mistaken_for_nan() -> None:
    assert decode(encode({"note": "null", "v": None})) == {"note": "null", "v": None}


def test_numpy_scalars_and_arrays() -> None:
    import numpy as np
    assert decode(encode(np.int64(7))) == 7
    assert decode(encode(np.float32(1.5))) == 1.5
    assert decode(encode(np.array([1, 2]))) == [1, 2]
    with pytest.raises(ValueEncodingError):
        encode(np.float64("nan"))
    with pytest.raises(ValueEncodingError):
        encode(np.array([1.0, np.inf]))
    with pytest.raises(ValueEncodingError):
        encode({"a": np.float32("nan")})


def test_size_limit() -> None:
    encode("x" * 98, max_bytes=100)
    with pytest.raises(ValueTooLarge) as info:
        encode("x" * 99, max_bytes=100)
    assert (info.value.size, info.value.limit) == (101, 100)
    assert "max_value_bytes" in str(info.value)
