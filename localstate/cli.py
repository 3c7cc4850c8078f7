"""The `localstate` command.

    localstate bench [--quick] [--central-url URL] [--json PATH] [--plot PATH] ...
    localstate db upgrade [--central-url URL]
    localstate config

Exit codes: 0 success, 1 an error (the message says what to do), 2 bad usage,
3 not found, 4 a version conflict.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from localstate.config import Settings
from localstate.errors import LocalStateError, VersionConflict

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
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    handler: Handler = args.handler
    try:
        return handler(args)
    except VersionConflict as exc:
        print(f"conflict: {exc}", file=sys.stderr)
        return EXIT_CONFLICT
    except LocalStateError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
