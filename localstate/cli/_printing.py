"""How the command prints: JSON text, and times as people read them."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

import orjson

__all__ = ["human_time", "json_text", "print_json"]


def json_text(obj: Any, *, indent: bool = False) -> str:
    """`obj` as JSON text. A stored value may be nested as deep as orjson allows (254); inside
    a record it is one level deeper, which orjson refuses, so the standard library writes it."""
    try:
        return orjson.dumps(obj, option=orjson.OPT_INDENT_2 if indent else None).decode()
    except TypeError:
        return json.dumps(obj, indent=2 if indent else None, ensure_ascii=False)


def print_json(obj: Any) -> None:
    print(json_text(obj, indent=True))


def human_time(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
