"""`decode_in_slices`: a large JSON body decoded one slice of its big array at a time.

orjson decodes a whole body in one C call that keeps Python's interpreter lock (GIL) until it
returns: in a worker thread too, the API server's event loop (every other request, the health
route's among them) waits for all of it, over a second for a 32 MiB flush on a loaded machine.
A flush body is nearly all one top-level array of rows (``"rows": [[...], [...], ...]``), so
that array is decoded in slices of about `SLICE_BYTES`, each its own short orjson call: between
two, the thread gives the lock back (every ``sys.getswitchinterval()``, 5 ms) and the loop runs.

The slices are cut where a row ends (``],[``), found by a byte search that knows nothing of
strings; a cut that falls inside a string leaves its slice with an unclosed string, which does
not decode, and the slice then runs on to the next ``],[``. What is left of the body around the
array (its other fields) is decoded with a random sentinel in the array's place, and must hold
exactly ``[sentinel]`` under the array's name: so the array decoded is the body's own top-level
one, whole, and no string or later duplicate of the name was taken for it. Anything else (no
such array, a body of some other shape, more than a few bad cuts) is decoded whole as before:
the result is always what ``orjson.loads`` of the body gives.

`on_items` hears the running count of the array's items after each slice: it may raise (a
flush of more rows than allowed is refused before the rest of it is decoded).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from typing import Any, Final

import orjson

__all__ = ["SLICE_BYTES", "decode_in_slices"]

#: the bytes of one slice of the array: one orjson call of a few milliseconds
SLICE_BYTES: Final = 512 * 1024
#: cuts that fell inside a string, after which the body is decoded whole
_MAX_BAD_CUTS: Final = 8
#: where one item of an array of arrays ends and the next begins (outside strings)
_BETWEEN: Final = b"],["
#: where the last item and the array end
_LAST: Final = b"]]"


def decode_in_slices(raw: bytes | bytearray, name: str,
                     on_items: Callable[[int], None] | None = None,
                     slice_bytes: int = SLICE_BYTES) -> Any:
    """``orjson.loads(raw)``, with the top-level array `name` (of arrays) decoded in slices
    (see the module). Raises ``orjson.JSONDecodeError`` as ``orjson.loads`` does."""
    marker = b'"' + name.encode() + b'":['
    start = raw.find(marker)
    if start < 0 or len(raw) < 2 * slice_bytes:
        return _whole(raw, on_items, name)
    first = start + len(marker)
    items: list[Any] = []
    at = first  # the next slice's first byte: an item's opening bracket
    search_from = at + slice_bytes  # where to look for the next cut
    end_from = at  # where to look for the array's end
    bad_cuts = 0
    while True:
        cut = raw.find(_BETWEEN, search_from)
        last = cut < 0
        if last:
            cut = raw.find(_LAST, end_from)
            if cut < 0:
                return _whole(raw, on_items, name)
        try:
            part = orjson.loads(b"[" + raw[at:cut + 1] + b"]")
        except orjson.JSONDecodeError:  # cut inside a string: run on to the next one
            bad_cuts += 1
            if bad_cuts > _MAX_BAD_CUTS:
                return _whole(raw, on_items, name)
            if last:
                end_from = cut + 1
            else:
                search_from = cut + 1
            continue
        items.extend(part)
        if on_items is not None:
            on_items(len(items))
        if last:
            end = cut + 1  # the array's closing bracket
            break
        at = end_from = cut + 2  # past "],"
        search_from = at + slice_bytes
    sentinel = "\x00" + secrets.token_hex(16)
    try:
        rest = orjson.loads(raw[:first] + orjson.dumps(sentinel) + raw[end:])
    except orjson.JSONDecodeError:  # the whole body's own error says where
        return _whole(raw, on_items, name)
    if not isinstance(rest, dict) or rest.get(name) != [sentinel]:
        return _whole(raw, on_items, name)
    rest[name] = items
    return rest


def _whole(raw: bytes | bytearray, on_items: Callable[[int], None] | None, name: str) -> Any:
    body = orjson.loads(raw)
    if on_items is not None and isinstance(body, dict) and isinstance(body.get(name), list):
        on_items(len(body[name]))
    return body
