"""Owner and key in a URL, and the list's opaque cursor.

Owners hold ':' and '/' (``dag:etl/load``), keys may too. In ``/api/v1/state/{owner}/{key}``
each name is one path segment, percent-encoded as JavaScript's ``encodeURIComponent`` (or
Python's ``urllib.parse.quote(name, safe="")``) does: a '/' inside a name travels as ``%2F``.
The server splits the *raw* path (ASGI ``raw_path``, before percent-decoding) on its literal
slashes, so ``dag:etl%2Fload/cursor`` is owner ``dag:etl/load``, key ``cursor``. A ':' may
travel as is or as ``%3A``. Names made only of dots (``.``, ``..``) must be encoded
(``%2E``), or clients and proxies resolve them as path steps before the server sees them.
"""

from __future__ import annotations

import base64
import binascii
from urllib.parse import unquote

import orjson
from fastapi import Request

from localstate._cache.entry import StateKey
from localstate._core.model import check_name
from localstate.api._errors import ApiError

__all__ = ["STATE_PATH", "decode_cursor", "encode_cursor", "state_name"]

#: the mount point of one state variable's routes, before the owner and key segments
STATE_PATH = "/api/v1/state/"


def _segments_after(raw: bytes, marker: bytes) -> list[bytes] | None:
    raw = raw.split(b"?", 1)[0]
    at = raw.find(marker)
    if at < 0:
        return None
    return raw[at + len(marker):].split(b"/")


def state_name(request: Request) -> StateKey:
    """(owner, key) of a ``/api/v1/state/{owner}/{key}`` request, from the raw path."""
    raw = request.scope.get("raw_path")
    if isinstance(raw, bytes | bytearray):
        segments = _segments_after(bytes(raw), STATE_PATH.encode())
    else:  # a server that gives no raw path: the decoded one (a '/' in a name is ambiguous)
        segments = _segments_after(request.url.path.encode(), STATE_PATH.encode())
    if segments is None or len(segments) != 2:
        raise ApiError(
            404, "not_found",
            "expected /api/v1/state/{owner}/{key} with owner and key each percent-encoded "
            "as one path segment (a '/' inside a name is %2F)",
        )
    names: list[str] = []
    for kind, segment in zip(("owner", "key"), segments, strict=True):
        try:
            text = segment.decode("ascii")
            name = unquote(text, encoding="utf-8", errors="strict")
        except UnicodeDecodeError:
            raise ApiError(400, "bad_request",
                           f"the {kind} in the path is not percent-encoded UTF-8") from None
        names.append(check_name(kind, name))
    return names[0], names[1]


def encode_cursor(key: StateKey) -> str:
    """An opaque cursor for the page after `key` (URL-safe base64 of a JSON pair)."""
    return base64.urlsafe_b64encode(orjson.dumps(list(key))).decode().rstrip("=")


def decode_cursor(cursor: str | None) -> StateKey | None:
    if cursor is None or cursor == "":
        return None
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        value = orjson.loads(raw)
    except (binascii.Error, ValueError):
        value = None
    if (not isinstance(value, list) or len(value) != 2
            or not all(isinstance(v, str) for v in value)):
        raise ApiError(400, "invalid_cursor",
                       "cursor is not one this API handed out: pass next_cursor as it came, "
                       "or leave it out for the first page")
    return value[0], value[1]
