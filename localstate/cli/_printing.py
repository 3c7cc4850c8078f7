"""How the command prints: JSON text, and times as people read them."""

from __future__ import annotations

import contextlib
import json
import logging
import sys
from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Any

import orjson

__all__ = ["human_time", "json_text", "print_json", "schema_upgrades_shown"]

#: the loggers of a schema upgrade: the central DB's and a cache file's
_UPGRADE_LOGGERS = ("localstate.sync.schema", "localstate.cache_file")  # logger names


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


@contextlib.contextmanager
def schema_upgrades_shown() -> Iterator[None]:
    """Print the log line of every schema upgrade a command makes (the central DB's, a cache
    file's) on stderr: a command never changes a schema unannounced on the terminal."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("note: %(message)s"))
    handler.setLevel(logging.INFO)
    saved = []
    for logger in map(logging.getLogger, _UPGRADE_LOGGERS):  # literal names, above
        saved.append((logger, logger.level))
        if logger.getEffectiveLevel() > logging.INFO:
            logger.setLevel(logging.INFO)
        logger.addHandler(handler)
    try:
        yield
    finally:
        for logger, level in saved:
            logger.removeHandler(handler)
            logger.setLevel(level)
