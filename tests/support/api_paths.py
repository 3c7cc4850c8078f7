"""The REST API's URL of one key: owner and key each one path segment, '/' included."""

from __future__ import annotations

from urllib.parse import quote


def path(owner: str, key: str) -> str:
    return f"/api/v1/state/{quote(owner, safe='')}/{quote(key, safe='')}"
