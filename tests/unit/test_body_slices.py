"""`decode_in_slices` gives what ``orjson.loads`` gives, whatever the body, in slices when it
can (rows whose strings hold the very bytes it cuts at, fake arrays in strings, duplicate keys,
nested arrays, spaces between rows), and hears the running count of the rows."""

from __future__ import annotations

import random

import orjson
import pytest

from localstate._core.body_slices import SLICE_BYTES, decode_in_slices

#: data strings that hold what the slicer looks for: a row's end, the array's end, escapes
TRICKY = ['"],[x"', "[[1],[2]]", '"]]"', '"\\\\"],["', "1", '{"a":[[]]}']


def flush_like(rows: int, tricky: bool, seed: int = 1) -> bytes:
    pick = random.Random(seed)
    return orjson.dumps({
        "fields": ["owner", "key", "data"], "writer": None, "policies": "reject",
        "rows": [[f"o{i % 7}", f"k{i}", pick.choice(TRICKY) if tricky else "1", 1, 0, 1.5,
                  "w", 0] for i in range(rows)],
        "fleet": [1, 2]})


@pytest.mark.parametrize("tricky", [False, True])
@pytest.mark.parametrize("rows", [0, 1, 10, 1000, 20_000])
@pytest.mark.parametrize("slice_bytes", [64, 1000, 4096])
def test_the_same_as_one_decoding(rows: int, tricky: bool, slice_bytes: int) -> None:
    body = flush_like(rows, tricky)
    counts: list[int] = []
    got = decode_in_slices(body, "rows", counts.append, slice_bytes=slice_bytes)
    assert got == orjson.loads(body)
    assert counts[-1] == rows
    if rows == 20_000 and not tricky:  # cut in slices, each heard
        assert len(counts) > len(body) // slice_bytes // 2
        assert counts == sorted(counts)


@pytest.mark.parametrize("body", [
    # a fake array in a string before the real one, and cut markers in a string after it
    b'{"x":"\\"rows\\":[[1],[2],[3]]","rows":[[4],[5]],"pad":"' + b"],[" * 3000 + b'"}',
    # the name twice: the last one counts, as in orjson
    b'{"rows":[' + b"[1]," * 5000 + b'[2]],"rows":[[9]]}',
    # items with arrays in them: "]]" ends an item, not the array
    b'{"rows":[' + b'["a",[1]],' * 5000 + b'["b",[2]]]}',
    # spaces between the items: no cut marker at all
    orjson.dumps({"rows": [[i] for i in range(5000)]}).replace(b"],[", b"], ["),
    # not an object, not arrays of arrays
    orjson.dumps([[i] for i in range(5000)]),
    orjson.dumps({"rows": list(range(20_000))}),
])
def test_bodies_of_other_shapes_decode_as_orjson_does(body: bytes) -> None:
    assert decode_in_slices(body, "rows", slice_bytes=64) == orjson.loads(body)


@pytest.mark.parametrize("body", [
    flush_like(20_000, False)[:-1],  # cut short
    flush_like(20_000, False).replace(b'"k19999"', b'"k19999'),  # an unclosed string
    flush_like(20_000, False).replace(b'"k100",', b'"k100",,'),  # a stray comma
    flush_like(20_000, False) + b"x",  # trailing bytes
])
def test_a_bad_body_raises_what_orjson_raises(body: bytes) -> None:
    with pytest.raises(orjson.JSONDecodeError) as expected:
        orjson.loads(body)
    with pytest.raises(orjson.JSONDecodeError) as got:
        decode_in_slices(body, "rows", slice_bytes=1000)
    assert str(got.value) == str(expected.value)


def test_the_count_may_stop_the_decoding() -> None:
    body = flush_like(20_000, False)
    heard: list[int] = []

    def refuse_past(n: int) -> None:
        heard.append(n)
        if n > 1000:
            raise OverflowError(n)

    with pytest.raises(OverflowError):
        decode_in_slices(body, "rows", refuse_past, slice_bytes=4096)
    assert heard[-1] < 2000  # stopped a slice past the bound, not at the end


def test_a_small_body_is_one_decoding() -> None:
    body = flush_like(10, False)
    assert len(body) < SLICE_BYTES
    counts: list[int] = []
    assert decode_in_slices(body, "rows", counts.append) == orjson.loads(body)
    assert counts == [10]
