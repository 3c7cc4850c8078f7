"""get, set, delete and ls: the state commands, which work where the configured sink puts the
state (`localstate.cli._state_backend`: the central DB, or the API under ``sink = api``; a
triggerer's cache file is locked by the process that owns it), and how they print a record."""

from __future__ import annotations

import argparse
import asyncio
import getpass
import json
import socket
import sys
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

import orjson

from localstate.cli._central import settings_for
from localstate.cli._exit_codes import NotFound
from localstate.cli._printing import human_time, json_text, print_json
from localstate.cli._state_backend import open_backend
from localstate.errors import InvalidInput

if TYPE_CHECKING:
    from localstate._core.rows import CentralRow

__all__ = ["cmd_delete", "cmd_get", "cmd_ls", "cmd_set"]


def _cli_id() -> str:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"cli:{user}@{socket.gethostname()}"[:250]


def _named(owner: str, key: str) -> str:
    return f"owner {owner!r} key {key!r}"


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=timezone.utc).isoformat()


def _row_dict(row: CentralRow) -> dict[str, Any]:
    return {"owner": row.owner, "key": row.key,
            "value": None if row.data is None else orjson.loads(row.data),
            "version": row.version, "updated_at": _iso(row.updated_at),
            "updated_by": row.updated_by}


def _print_record(row: CentralRow) -> None:
    value = orjson.loads(row.data) if row.data is not None else None
    pairs = [("owner", row.owner), ("key", row.key), ("version", str(row.version)),
             ("updated_at", human_time(row.updated_at)), ("updated_by", row.updated_by)]
    for name, text in pairs:
        print(f"{name:<11} {text}")
    if isinstance(value, dict | list) and value:
        print("value")
        print(orjson.dumps(value, option=orjson.OPT_INDENT_2).decode())
    else:
        print(f"{'value':<11} {orjson.dumps(value).decode()}")


def _checked_names(args: argparse.Namespace) -> tuple[str, str]:
    from localstate._core.model import check_name

    return check_name("owner", args.owner), check_name("key", args.key)


def cmd_get(args: argparse.Namespace) -> int:
    owner, key = _checked_names(args)
    settings = settings_for(args)

    async def go() -> CentralRow | None:
        async with open_backend(settings, read_only=True) as backend:
            return await backend.read(owner, key)

    row = asyncio.run(go())
    if row is None or row.data is None:
        raise NotFound(f"{_named(owner, key)} has no value")
    if args.json:
        print_json(_row_dict(row))
    else:
        _print_record(row)
    return 0


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _read_value(text: object) -> Any:
    if not isinstance(text, str):
        # argparse of Python 3.11 hands a positional given as a lone "--" (after the "--" that
        # ends the options) over as an empty list
        raise InvalidInput("the value is not valid JSON ('--' is not JSON); quote strings as "
                           "JSON does: '\"--\"'")
    if text == "-":
        text = sys.stdin.read()
    try:
        # The standard library's parser, not orjson's: orjson reads an integer beyond 64 bits
        # as a float, so `set o k 123456789012345678901234567890` stored 1.2345678901234568e+29
        # without a word. Read exactly, such an integer is refused by encode() as over 64 bits.
        return json.loads(text, parse_constant=_no_constant)
    except RecursionError:
        raise InvalidInput("the value is nested too deeply to be stored") from None
    except ValueError as exc:  # json.JSONDecodeError, NaN and Infinity, a 5,000-digit integer
        raise InvalidInput(
            f"the value is not valid JSON ({exc}); quote strings as JSON does: '\"text\"'"
        ) from None


def cmd_set(args: argparse.Namespace) -> int:
    from localstate._core.codec import encode

    owner, key = _checked_names(args)
    settings = settings_for(args)
    data = encode(_read_value(args.value), settings.max_value_bytes)

    async def go() -> CentralRow | None:
        async with open_backend(settings) as backend:
            return await backend.write(owner, key, data, expected_version=args.expected_version,
                                       updated_by=_cli_id())

    row = asyncio.run(go())
    assert row is not None  # a write (not a delete) always says what it wrote
    if args.json:
        print_json(_row_dict(row))
    else:
        print(f"set {_named(owner, key)}: version {row.version}")
    return 0


def cmd_delete(args: argparse.Namespace) -> int:
    owner, key = _checked_names(args)
    settings = settings_for(args)

    async def go() -> CentralRow | None:
        async with open_backend(settings) as backend:
            return await backend.write(owner, key, None, expected_version=args.expected_version,
                                       updated_by=_cli_id())

    row = asyncio.run(go())
    version = None if row is None else row.version  # the API does not say it
    if args.json:
        print_json({"owner": owner, "key": key, "deleted": True, "version": version})
    elif version is None:
        print(f"deleted {_named(owner, key)}")
    else:
        print(f"deleted {_named(owner, key)} (version {version} is its tombstone)")
    return 0


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[:width - 1] + "…"


_LS_COLUMNS = (("OWNER", 40), ("KEY", 30), ("VERSION", 8), ("UPDATED_AT", 23),
               ("UPDATED_BY", 24), ("VALUE", 60))


def _print_rows(rows: list[CentralRow], widths: list[int] | None) -> list[int]:
    """One page of the table; the column widths come from the first page, each within its
    cap (the header printed with it)."""
    cells = [[r.owner, r.key, str(r.version), human_time(r.updated_at), r.updated_by,
              r.data or "null"] for r in rows]
    if widths is None:
        widths = [min(cap, max(len(name), *(len(c[i]) for c in cells)))
                  for i, (name, cap) in enumerate(_LS_COLUMNS)]
        print("  ".join(f"{name:<{w}}" for (name, _), w in
                        zip(_LS_COLUMNS, widths, strict=True)).rstrip())
    for c in cells:
        print("  ".join(f"{_cut(text, w):<{w}}" for text, w in
                        zip(c, widths, strict=True)).rstrip())
    return widths


def cmd_ls(args: argparse.Namespace) -> int:
    from localstate._core.model import check_name

    # a prefix is matched literally ('%', '_' and '\\' are plain characters), in byte-wise
    # order on every backend (`CentralStore.list_rows`); one a name could not start with
    # (control characters, undecodable bytes) is refused, not sent to the database
    prefix = check_name("owner prefix", args.owner) if args.owner else ""
    settings = settings_for(args)
    page_size = 500

    async def go() -> int:
        shown = 0
        widths: list[int] | None = None
        if args.json:
            sys.stdout.write("[")
        async with open_backend(settings, read_only=True) as backend:
            page: list[CentralRow] = []
            async for row in backend.rows(prefix, args.limit):
                if args.json:
                    sys.stdout.write(("\n  " if not shown else ",\n  ")
                                     + json_text(_row_dict(row)))
                    shown += 1
                    continue
                page.append(row)
                if len(page) == page_size:
                    widths = _print_rows(page, widths)
                    shown += len(page)
                    page = []
            if page:
                _print_rows(page, widths)
                shown += len(page)
        if args.json:
            sys.stdout.write("\n]\n" if shown else "]\n")
        else:
            scope = f" with owners starting with {args.owner!r}" if args.owner else ""
            print(f"({shown} state variable{'s' if shown != 1 else ''}{scope})")
        return shown

    asyncio.run(go())
    return 0
