"""The `localstate` command.

    localstate get OWNER KEY [--json]
    localstate set OWNER KEY JSON [--expected-version N] [--json]
    localstate delete OWNER KEY [--expected-version N]
    localstate ls [--owner PREFIX] [--limit N] [--json]
    localstate status [--json]
    localstate flush [--cache PATH ...] [--json]
    localstate serve [--host HOST] [--port PORT]
    localstate bench [--quick] [--central-url URL] [--json PATH] [--plot PATH] ...
    localstate db upgrade [--central-url URL]
    localstate config

Exit codes: 0 success, 1 an error (the message says what to do), 2 bad usage (a bad name or
value included), 3 not found, 4 a version conflict.

The CLI is not a triggerer: their cache files are locked by the processes that own them. So
get, set, delete and ls work on the central DB directly (every triggerer flushes there):

* ``set`` without ``--expected-version`` is an unconditional write, as Airflow's
  ``Variable.set``; with it, one conditional statement (`CentralStore.write_if_version`):
  written only if the central record is at that version, else exit 4 and nothing changes.
* A triggerer that still holds the old value learns of the new one at its next flush: its
  write is then based on a version the central DB no longer has, and its conflict policy
  settles it (``reject``, the default, keeps the CLI's value and the triggerer adopts it).
* ``flush`` flushes cache files no live process holds (a stopped triggerer's backlog); a
  cache in use is skipped, since its triggerer flushes it itself.
* ``status`` reports the central DB (rows, writers, last writes) and the cache files in
  ``cache_dir`` (rows not yet flushed, oldest unflushed write, who holds each).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import getpass
import ipaddress
import json
import logging
import os
import signal
import socket
import sqlite3
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from localstate.config import Settings
from localstate.errors import (
    CacheLocked,
    CentralError,
    ConfigError,
    InvalidInput,
    LocalStateError,
    VersionConflict,
)

if TYPE_CHECKING:
    from sync.central_store import CentralStore
    from sync.rows import CentralRow

__all__ = ["EXIT_CONFLICT", "EXIT_ERROR", "EXIT_NOT_FOUND", "EXIT_USAGE", "main"]

EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_NOT_FOUND = 3
EXIT_CONFLICT = 4

Handler = Callable[[argparse.Namespace], int]


def _int_list(text: str) -> list[int]:
    try:
        values = [int(part.replace("_", "")) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers separated by commas, not {text!r}"
                                         ) from None
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError("trigger counts must be whole numbers above 0")
    return values


def _modes(text: str) -> list[str]:
    from localstate.bench.baselines import PEER_MODES
    from localstate.bench.runner import STORE_MODES

    allowed = ("bare", *STORE_MODES, *PEER_MODES)
    modes = [m.strip() for m in text.split(",") if m.strip()]
    bad = [m for m in modes if m not in allowed]
    if bad or not modes:
        raise argparse.ArgumentTypeError(
            f"unknown mode(s) {bad}; choose from {', '.join(allowed)}"
        )
    return modes


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, not {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError("expected a number >= 0")
    return value


def _version(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a version number, not {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError("a version is 0 or more")
    return value


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, not {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError("expected a number above 0")
    return value


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 0 < value < 65536:
        raise argparse.ArgumentTypeError(f"expected a port from 1 to 65535, not {text!r}")
    return value


def _cmd_bench(args: argparse.Namespace) -> int:
    from localstate.bench import BenchConfig, print_table, run_bench, summary
    from localstate.bench.report import write_json, write_plot

    cfg = BenchConfig(central_url=args.central_url, progress=not args.no_progress,
                      poll_delay=args.poll_delay, shared_keys=args.shared_keys,
                      flush_interval=args.flush_interval)
    if args.quick:
        cfg.duration = 1.0
        cfg.triggers = [1, 100, 1000]
    if args.duration is not None:
        cfg.duration = args.duration
    if args.triggers is not None:
        cfg.triggers = args.triggers
    if args.modes is not None:
        cfg.modes = args.modes
    if args.folder is not None:
        cfg.folder = args.folder
    result = asyncio.run(run_bench(cfg))
    print_table(result)
    print()
    print(summary(result))
    if args.json:
        write_json(result, args.json)
        print(f"\nwrote {args.json}")
    if args.plot:
        write_plot(result, args.plot)
        print(f"wrote {args.plot}")
    return 0


def _cmd_db_upgrade(args: argparse.Namespace) -> int:
    from sync.central_store import make_engine
    from sync.schema import LATEST_VERSION, upgrade

    url = args.central_url or Settings.resolve().resolved_central_url

    async def go() -> list[str]:
        engine = make_engine(url)
        try:
            return [f"{m.version}: {m.description}" for m in await upgrade(engine)]
        finally:
            await engine.dispose()

    try:
        applied = asyncio.run(go())
    except LocalStateError:
        raise
    except Exception as exc:  # a driver error before the store's own wrapping
        raise LocalStateError(f"cannot upgrade {url}: {exc}") from exc
    for line in applied:
        print(f"applied migration {line}")
    print(f"central schema is at version {LATEST_VERSION}"
          + (" (already up to date)" if not applied else ""))
    return 0


def _cmd_config(args: argparse.Namespace) -> int:
    settings = Settings.resolve()
    width = max(len(name) for name, _, _ in settings.describe())
    for name, value, source in settings.describe():
        print(f"{name:<{width}}  {value:<40}  {source}")
    print(f"{'(cache file)':<{width}}  {settings.resolved_cache_path!s:<40}")
    print(f"{'(central url)':<{width}}  {settings.resolved_central_url:<40}")
    return 0


# -- state commands: straight to the central DB ---------------------------------------


class NotFound(LocalStateError):
    """The state variable asked for has no value (exit 3)."""


def _settings(args: argparse.Namespace) -> Settings:
    url = getattr(args, "central_url", None)
    return Settings.resolve({"central_url": url} if url else None)


def _cli_id() -> str:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"cli:{user}@{socket.gethostname()}"[:250]


@contextlib.asynccontextmanager
async def _central(settings: Settings) -> AsyncIterator[CentralStore]:
    from sync.central_store import CentralStore

    central = await CentralStore.open(settings.resolved_central_url,
                                      upgrade_schema=settings.upgrade_schema)
    try:
        yield central
    finally:
        await central.close()


def _named(owner: str, key: str) -> str:
    return f"owner {owner!r} key {key!r}"


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=timezone.utc).isoformat()


def _human_time(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _ago(ts: float | None) -> str:
    if ts is None:
        return "-"
    s = max(0.0, time.time() - ts)
    if s < 120:
        return f"{s:.1f} s ago"
    if s < 7200:
        return f"{s / 60:.0f} min ago"
    return f"{s / 3600:.1f} h ago"


def _row_dict(row: CentralRow) -> dict[str, Any]:
    return {"owner": row.owner, "key": row.key,
            "value": None if row.data is None else orjson.loads(row.data),
            "version": row.version, "updated_at": _iso(row.updated_at),
            "updated_by": row.updated_by}


def _json(obj: Any, *, indent: bool = False) -> str:
    """`obj` as JSON text. A stored value may be nested as deep as orjson allows (254); inside
    a record it is one level deeper, which orjson refuses, so the standard library writes it."""
    try:
        return orjson.dumps(obj, option=orjson.OPT_INDENT_2 if indent else None).decode()
    except TypeError:
        return json.dumps(obj, indent=2 if indent else None, ensure_ascii=False)


def _print_json(obj: Any) -> None:
    print(_json(obj, indent=True))


def _print_record(row: CentralRow) -> None:
    value = orjson.loads(row.data) if row.data is not None else None
    pairs = [("owner", row.owner), ("key", row.key), ("version", str(row.version)),
             ("updated_at", _human_time(row.updated_at)), ("updated_by", row.updated_by)]
    for name, text in pairs:
        print(f"{name:<11} {text}")
    if isinstance(value, dict | list) and value:
        print("value")
        print(orjson.dumps(value, option=orjson.OPT_INDENT_2).decode())
    else:
        print(f"{'value':<11} {orjson.dumps(value).decode()}")


def _checked_names(args: argparse.Namespace) -> tuple[str, str]:
    from localstate.model import check_name

    return check_name("owner", args.owner), check_name("key", args.key)


def _cmd_get(args: argparse.Namespace) -> int:
    owner, key = _checked_names(args)
    settings = _settings(args)

    async def go() -> CentralRow | None:
        async with _central(settings) as central:
            return (await central.read_many([(owner, key)])).get((owner, key))

    row = asyncio.run(go())
    if row is None or row.data is None:
        raise NotFound(f"{_named(owner, key)} has no value")
    if args.json:
        _print_json(_row_dict(row))
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


def _cmd_set(args: argparse.Namespace) -> int:
    from localstate.codec import encode

    owner, key = _checked_names(args)
    settings = _settings(args)
    data = encode(_read_value(args.value), settings.max_value_bytes)

    async def go() -> CentralRow:
        async with _central(settings) as central:
            if args.expected_version is None:
                return await central.write_direct(owner, key, data, updated_at=time.time(),
                                                  updated_by=_cli_id())
            return await central.write_if_version(owner, key, data, args.expected_version,
                                                  updated_by=_cli_id())

    row = asyncio.run(go())
    if args.json:
        _print_json(_row_dict(row))
    else:
        print(f"set {_named(owner, key)}: version {row.version}")
    return 0


def _cmd_delete(args: argparse.Namespace) -> int:
    owner, key = _checked_names(args)
    settings = _settings(args)

    async def go() -> CentralRow:
        async with _central(settings) as central:
            if args.expected_version is not None:
                return await central.write_if_version(owner, key, None, args.expected_version,
                                                      updated_by=_cli_id())
            current = (await central.read_many([(owner, key)])).get((owner, key))
            if current is None or current.data is None:
                raise NotFound(f"{_named(owner, key)} has no value to delete")
            return await central.write_direct(owner, key, None, updated_at=time.time(),
                                              updated_by=_cli_id())

    row = asyncio.run(go())
    if args.json:
        _print_json({"owner": owner, "key": key, "deleted": True, "version": row.version})
    else:
        print(f"deleted {_named(owner, key)} (version {row.version} is its tombstone)")
    return 0


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[:width - 1] + "…"


_LS_COLUMNS = (("OWNER", 40), ("KEY", 30), ("VERSION", 8), ("UPDATED_AT", 23),
               ("UPDATED_BY", 24), ("VALUE", 60))


def _cmd_ls(args: argparse.Namespace) -> int:
    settings = _settings(args)
    page_size = 500

    async def go() -> int:
        shown = 0
        widths: list[int] | None = None
        if args.json:
            sys.stdout.write("[")
        async with _central(settings) as central:
            after: tuple[str, str] | None = None
            while args.limit is None or shown < args.limit:
                want = page_size if args.limit is None else min(page_size, args.limit - shown)
                rows = await central.list_rows(owner_prefix=args.owner or "", after=after,
                                               limit=want)
                if not rows:
                    break
                after = (rows[-1].owner, rows[-1].key)
                if args.json:
                    for row in rows:
                        sys.stdout.write(("\n  " if not shown else ",\n  ")
                                         + _json(_row_dict(row)))
                        shown += 1
                    continue
                cells = [[r.owner, r.key, str(r.version), _human_time(r.updated_at),
                          r.updated_by, r.data or "null"] for r in rows]
                if widths is None:  # from the first page, each within its cap
                    widths = [min(cap, max(len(name), *(len(c[i]) for c in cells)))
                              for i, (name, cap) in enumerate(_LS_COLUMNS)]
                    print("  ".join(f"{name:<{w}}" for (name, _), w in
                                    zip(_LS_COLUMNS, widths, strict=True)).rstrip())
                for c in cells:
                    print("  ".join(f"{_cut(text, w):<{w}}" for text, w in
                                    zip(c, widths, strict=True)).rstrip())
                shown += len(rows)
                if len(rows) < want:
                    break
        if args.json:
            sys.stdout.write("\n]\n" if shown else "]\n")
        else:
            scope = f" with owners starting with {args.owner!r}" if args.owner else ""
            print(f"({shown} state variable{'s' if shown != 1 else ''}{scope})")
        return shown

    asyncio.run(go())
    return 0


# -- status: the central DB and this host's cache files ---------------------------------


def _epoch(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    if value.tzinfo is None:
        value = value.replace(tzinfo=timezone.utc)
    return float(value.timestamp())


async def _central_summary(central: CentralStore) -> dict[str, Any]:
    from sqlalchemy import case, func, select
    from sqlalchemy.exc import SQLAlchemyError

    from sync.schema import current_version, state_variable

    t = state_variable.c
    totals = select(func.count(), func.count(func.distinct(t.owner)),
                    func.sum(case((t.value.is_(None), 1), else_=0)), func.max(t.updated_at))
    writers = (select(t.updated_by, func.count(), func.max(t.updated_at))
               .group_by(t.updated_by).order_by(func.max(t.updated_at).desc()).limit(50))
    try:
        async with central.engine.connect() as conn:
            schema = await current_version(conn)
            rows, owners, deleted, last = (await conn.execute(totals)).one()
            by_writer = (await conn.execute(writers)).all()
    except SQLAlchemyError as exc:
        raise CentralError(f"cannot read the central DB {central.url}: {exc}") from exc
    return {
        "url": central.url, "schema_version": schema, "rows": int(rows or 0),
        "owners": int(owners or 0), "deleted": int(deleted or 0),
        "last_write_at": _epoch(last),
        "writers": [{"updated_by": w, "rows": int(n), "last_write_at": _epoch(at)}
                    for w, n, at in by_writer],
    }


def _cache_folder(settings: Settings) -> Path:
    return settings.cache_dir or settings.home / "localstate"


def _cache_files(settings: Settings) -> list[Path]:
    found = set(_cache_folder(settings).glob("*.db"))
    if settings.resolved_cache_path.is_file():
        found.add(settings.resolved_cache_path)
    return sorted(found)


def _holder(path: Path) -> dict[str, Any]:
    lock = path.with_name(path.name + ".lock")
    try:
        info = orjson.loads(lock.read_bytes() or b"null")
    except (OSError, orjson.JSONDecodeError):
        info = None
    if not isinstance(info, dict) or not isinstance(info.get("pid"), int):
        return {"held_by": None, "running": False}
    pid, host = info["pid"], info.get("host")
    running: bool | None = None  # unknown: another host
    if host == socket.gethostname():
        try:
            os.kill(pid, 0)
            running = True
        except ProcessLookupError:
            running = False
        except PermissionError:
            running = True
    return {"held_by": f"pid {pid} on {host}", "running": running}


def _cache_summary(path: Path) -> dict[str, Any]:
    from localstate.local_cache import APPLICATION_ID

    out: dict[str, Any] = {"path": str(path), **_holder(path)}
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)
        try:
            if conn.execute("PRAGMA application_id").fetchone()[0] != APPLICATION_ID:
                return {**out, "error": "not a localstate cache file"}
            rows, dirty, oldest = conn.execute(
                "SELECT count(*), coalesce(sum(version != synced_version), 0), "
                "min(CASE WHEN version != synced_version THEN updated_at END) FROM state"
            ).fetchone()
        finally:
            conn.close()
    except sqlite3.Error as exc:
        return {**out, "error": f"cannot read it: {exc}"}
    return {**out, "rows": rows, "dirty": dirty, "oldest_unflushed_at": oldest}


def _cmd_status(args: argparse.Namespace) -> int:
    settings = _settings(args)

    async def go() -> dict[str, Any]:
        async with _central(settings) as central:
            return await _central_summary(central)

    central = asyncio.run(go())
    caches = [_cache_summary(p) for p in _cache_files(settings)]
    if args.json:
        _print_json({"central": central, "cache_folder": str(_cache_folder(settings)),
                     "caches": caches})
        return 0
    print(f"central DB    {central['url']} (schema version {central['schema_version']})")
    print(f"state rows    {central['rows']} in {central['owners']} owners "
          f"({central['deleted']} deleted)")
    last = central["last_write_at"]
    print(f"last write    {_human_time(last) + ' (' + _ago(last) + ')' if last else 'none'}")
    if central["writers"]:
        print()
        width = max(10, *(len(w["updated_by"]) for w in central["writers"]))
        print(f"{'WRITER':<{width}}  {'ROWS':>8}  LAST WRITE")
        for w in central["writers"]:
            at = w["last_write_at"]
            print(f"{w['updated_by']:<{width}}  {w['rows']:>8}  "
                  f"{_human_time(at) if at else '-'} ({_ago(at)})")
    print()
    print(f"cache files in {_cache_folder(settings)}")
    if not caches:
        print("  (none)")
        return 0
    width = max(10, *(len(Path(c["path"]).name) for c in caches))
    print(f"{'FILE':<{width}}  {'ROWS':>8}  {'UNFLUSHED':>9}  {'OLDEST UNFLUSHED':<18}  HELD BY")
    for c in caches:
        name = Path(c["path"]).name
        if "error" in c:
            print(f"{name:<{width}}  {c['error']}")
            continue
        held = c["held_by"] or "nobody"
        if c["held_by"] and c["running"] is False:
            held += " (not running: `localstate flush` flushes it)"
        elif c["running"]:
            held += " (running)"
        oldest = _ago(c["oldest_unflushed_at"]) if c["dirty"] else "-"
        print(f"{name:<{width}}  {c['rows']:>8}  {c['dirty']:>9}  {oldest:<18}  {held}")
    return 0


# -- flush: the backlog of caches nobody holds ------------------------------------------


async def _flush_one(path: Path, settings: Settings, dirty: int, progress: bool
                     ) -> dict[str, Any]:
    from localstate.bench.progress import Progress
    from localstate.store import StateStore

    batch = settings.max_batch
    total = max(1, -(-dirty // batch))
    bar = Progress(total, label=f"flush {path.name}", enabled=progress)
    try:
        store = await StateStore.open(settings=settings.replace(
            cache_path=str(path), triggerer_id=path.stem, flush_interval=3600.0))
    except CacheLocked:
        return {"path": str(path), "skipped": "in use by a live process, which flushes it"}
    try:
        start = store.stats().central_transactions

        async def watch() -> None:
            seen = 0
            while True:
                done = store.stats().central_transactions - start
                while seen < min(done, total):
                    seen += 1
                    bar.step(f"{store.stats().dirty_keys} rows left")
                await asyncio.sleep(0.1)

        watcher = asyncio.get_running_loop().create_task(watch())
        try:
            report = await store.flush()
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
        while bar.done < total:
            bar.step("done")
        stats = store.stats()
    finally:
        await store.close()
    return {"path": str(path), "flushed": stats.central_rows, "conflicts": report.conflicts,
            "still_dirty": stats.dirty_keys}


def _cmd_flush(args: argparse.Namespace) -> int:
    settings = _settings(args)
    paths = [Path(p) for p in args.cache] if args.cache else _cache_files(settings)
    results: list[dict[str, Any]] = []

    async def go() -> None:
        for path in paths:
            if not path.is_file():
                results.append({"path": str(path), "error": "no such file"})
                continue
            summary = _cache_summary(path)
            if "error" in summary:
                results.append({"path": str(path), "error": summary["error"]})
            elif not summary["dirty"]:
                results.append({"path": str(path), "flushed": 0, "conflicts": 0,
                                "still_dirty": 0})
            else:
                results.append(await _flush_one(path, settings, summary["dirty"],
                                                not args.no_progress and not args.json))

    asyncio.run(go())
    failed = [r for r in results if "error" in r]
    if args.json:
        _print_json(results)
    elif not results:
        print(f"no cache files in {_cache_folder(settings)}: nothing to flush")
    else:
        for r in results:
            name = Path(r["path"]).name
            if "error" in r:
                print(f"{name}: {r['error']}")
            elif "skipped" in r:
                print(f"{name}: skipped, {r['skipped']}")
            else:
                print(f"{name}: flushed {r['flushed']} rows, {r['conflicts']} conflicts, "
                      f"{r['still_dirty']} still unflushed")
    return EXIT_ERROR if failed else 0


# -- serve -------------------------------------------------------------------------------


def _hidden(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


def is_loopback(host: str) -> bool:
    """Whether `host` (a name or an address) only listens on this machine."""
    name = host.strip().strip("[]")
    if name.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def _cmd_serve(args: argparse.Namespace) -> int:
    settings = _settings(args)
    host = args.host or settings.api_host
    port = args.port or settings.api_port
    if not settings.api_tokens and not is_loopback(host):
        raise ConfigError(
            f"refusing to serve on {host}: no api_tokens are configured, and without tokens "
            "the API is open to anyone who reaches it. Set api_tokens "
            "(AIRFLOW__LOCALSTATE__API_TOKENS='TOKEN:read-write:*') or bind 127.0.0.1"
        )
    try:
        import uvicorn

        from localstate.api import create_app
    except ImportError as exc:
        raise LocalStateError(
            f"localstate serve needs the api extra ({exc.name} is missing): "
            "pip install 'localstate[api]'"
        ) from None
    from localstate.store import StateStore

    store_id = args.store_id or f"{settings.resolved_triggerer_id}-api"
    cache = args.cache_path or _cache_folder(settings) / f"{store_id}.db"
    store_settings = settings.replace(triggerer_id=store_id, cache_path=str(cache))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: "
                        "%(message)s")

    class Server(uvicorn.Server):
        # uvicorn re-raises SIGTERM/SIGINT once it has shut down, which would end the process
        # before the store below is closed (its last flush, its cache lock): take the signals
        # here instead, and let the store close after the server stops.
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield

    def stop(server: uvicorn.Server) -> None:
        if server.should_exit:
            server.force_exit = True  # a second Ctrl-C: stop waiting for open connections
        server.should_exit = True

    async def go() -> bool:
        async with StateStore(settings=store_settings) as store:
            app = create_app(store)
            config = uvicorn.Config(app, host=host, port=port, log_level=args.log_level,
                                    server_header=False, lifespan="on")
            server = Server(config)
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, stop, server)
            tokens = len(settings.api_tokens)
            auth = (f"{tokens} token{'s' if tokens != 1 else ''}" if tokens
                    else "no tokens: open to this machine only")
            print(f"localstate API and UI on http://{host}:{port}/ (store {store_id!r}, "
                  f"central DB {_hidden(settings.resolved_central_url)}, "
                  f"{auth})", file=sys.stderr, flush=True)
            await server.serve()
            return server.started

    return 0 if asyncio.run(go()) else EXIT_ERROR


@functools.cache  # 5 ms of argparse set-up; a caller running many commands in one process
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="localstate", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    bench = sub.add_parser("bench", help="write-throughput benchmark (local-first vs direct)")
    bench.add_argument("--central-url", help="central DB (default: SQLite in a temp folder)")
    bench.add_argument("--quick", action="store_true",
                       help="the short run: K=1,100,1000, 1 s per mode (under a minute)")
    bench.add_argument("--duration", type=_positive, help="seconds per mode and K")
    bench.add_argument("--triggers", type=_int_list, help="trigger counts, e.g. 1,100,1000")
    bench.add_argument("--modes", type=_modes,
                       help="bare,direct,memory,local,central (and peers)")
    bench.add_argument("--poll-delay", type=_positive, default=0.0,
                       help="seconds each trigger sleeps between sets (default 0: hot loop)")
    bench.add_argument("--shared-keys", type=int, default=8,
                       help="keys in the shared-key scenario")
    bench.add_argument("--flush-interval", type=_positive, default=1.0)
    bench.add_argument("--folder", type=Path, help="where caches go (default: a temp folder)")
    bench.add_argument("--json", type=Path, help="write the results as JSON here")
    bench.add_argument("--plot", type=Path, help="draw a PNG chart here (needs matplotlib)")
    bench.add_argument("--no-progress", action="store_true", help="no progress bar")
    bench.set_defaults(handler=_cmd_bench)

    db = sub.add_parser("db", help="central schema")
    db_sub = db.add_subparsers(dest="db_command", required=True, metavar="ACTION")
    up = db_sub.add_parser("upgrade", help="create or upgrade the central tables")
    up.add_argument("--central-url", help="default: the configured central_url")
    up.set_defaults(handler=_cmd_db_upgrade)

    cfg = sub.add_parser("config", help="print the resolved settings and where each came from")
    cfg.set_defaults(handler=_cmd_config)

    def central_url(p: argparse.ArgumentParser) -> None:
        p.add_argument("--central-url", help="default: the configured central_url")

    def name_args(p: argparse.ArgumentParser) -> None:
        p.add_argument("owner", metavar="OWNER", help="e.g. asset_watcher:orders")
        p.add_argument("key", metavar="KEY", help="e.g. watermark")

    get = sub.add_parser("get", help="print one state variable from the central DB")
    name_args(get)
    get.add_argument("--json", action="store_true", help="as JSON, for scripts")
    central_url(get)
    get.set_defaults(handler=_cmd_get)

    put = sub.add_parser("set", help="write one state variable to the central DB")
    name_args(put)
    put.add_argument("value", metavar="JSON", help="the value as JSON ('-': read stdin)")
    put.add_argument("--expected-version", type=_version, metavar="N",
                     help="write only if the central record is at version N (0: absent); "
                          "else exit 4")
    put.add_argument("--json", action="store_true", help="print the record as JSON")
    central_url(put)
    put.set_defaults(handler=_cmd_set)

    rm = sub.add_parser("delete", help="delete one state variable in the central DB")
    name_args(rm)
    rm.add_argument("--expected-version", type=_version, metavar="N",
                    help="delete only if the central record is at version N; else exit 4")
    rm.add_argument("--json", action="store_true")
    central_url(rm)
    rm.set_defaults(handler=_cmd_delete)

    ls = sub.add_parser("ls", help="list state variables in the central DB")
    ls.add_argument("--owner", metavar="PREFIX", help="only owners starting with PREFIX")
    ls.add_argument("--limit", type=_count, metavar="N", help="at most N rows")
    ls.add_argument("--json", action="store_true", help="a JSON list, for scripts")
    central_url(ls)
    ls.set_defaults(handler=_cmd_ls)

    st = sub.add_parser("status", help="the central DB and this host's cache files")
    st.add_argument("--json", action="store_true")
    central_url(st)
    st.set_defaults(handler=_cmd_status)

    fl = sub.add_parser("flush", help="flush cache files no live process holds")
    fl.add_argument("--cache", action="append", metavar="PATH",
                    help="this cache file (repeatable); default: every one in cache_dir")
    fl.add_argument("--json", action="store_true")
    fl.add_argument("--no-progress", action="store_true", help="no progress bar")
    central_url(fl)
    fl.set_defaults(handler=_cmd_flush)

    srv = sub.add_parser("serve", help="the REST API and web UI (needs the api extra)")
    srv.add_argument("--host", help="address to bind (default: api_host, 127.0.0.1)")
    srv.add_argument("--port", type=_port, help="default: api_port, 8686")
    srv.add_argument("--store-id", help="id of the serving store (updated_by of its writes; "
                                        "default <triggerer_id>-api)")
    srv.add_argument("--cache-path", type=Path, help="its cache file (default "
                                                     "<cache_dir>/<store id>.db)")
    srv.add_argument("--log-level", default="info",
                     choices=["critical", "error", "warning", "info", "debug"])
    central_url(srv)
    srv.set_defaults(handler=_cmd_serve)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    handler: Handler = args.handler
    try:
        return handler(args)
    except VersionConflict as exc:
        print(f"conflict: {exc}", file=sys.stderr)
        return EXIT_CONFLICT
    except NotFound as exc:
        print(f"not found: {exc}", file=sys.stderr)
        return EXIT_NOT_FOUND
    except InvalidInput as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except LocalStateError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
