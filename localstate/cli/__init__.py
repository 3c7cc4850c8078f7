"""The `localstate` command.

    localstate get OWNER KEY [--json]
    localstate set OWNER KEY JSON [--expected-version N] [--json]
    localstate delete OWNER KEY [--expected-version N]
    localstate ls [--owner PREFIX] [--limit N] [--json]
    localstate status [--fleet] [--json]
    localstate history OWNER [--limit N] [--kind KIND ...] [--json]
    localstate flush [--cache PATH ...] [--json]
    localstate serve [--host HOST] [--port PORT]
    localstate bench [--quick] [--central-url URL] [--json PATH] [--plot PATH] ...
                     [--airflow-sink | --no-airflow-sink] [--airflow-keys N]
    localstate bench --fleet N --triggers K [--budget R] --central-url postgresql://...
    localstate db upgrade [--central-url URL]
    localstate db prune [--older-than 7d] [--owner-prefix PREFIX] [--dry-run] [--json] ...
    localstate config
    localstate --version

Exit codes: 0 success, 1 an error (the message says what to do), 2 bad usage (a bad name or
value included), 3 not found, 4 a version conflict.

The CLI is not a triggerer: their cache files are locked by the processes that own them. So
get, set, delete, ls and ``status --fleet`` work where every triggerer flushes: the central DB
(``sink = sql``), or the API at ``api_url`` with ``api_token`` (``sink = api``: no database is
opened, none created). ``config`` says which (`localstate.cli._state_backend`):

* ``set`` without ``--expected-version`` is an unconditional write, as Airflow's
  ``Variable.set``; with it, one conditional statement (`CentralStore.write_if_version`):
  written only if the central record is at that version, else exit 4 and nothing changes.
* A triggerer that still holds the old value learns of the new one at its next flush: its
  write is then based on a version the central DB no longer has, and its conflict policy
  settles it (``reject``, the default, keeps the CLI's value and the triggerer adopts it).
* ``flush`` flushes cache files no live process holds (a stopped triggerer's backlog); a
  cache in use is skipped, since its triggerer flushes it itself.
* ``status`` reports the central DB (rows, writers, last writes) and the cache files in
  ``cache_dir`` (rows not yet flushed, oldest unflushed write, who holds each); ``--fleet``
  every triggerer's lag and backlog from the fleet table, flagging stalled ones.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from localstate._core.rows import HISTORY_KINDS
from localstate._core.version import __version__
from localstate.cli._arg_types import (
    bench_modes,
    count,
    non_negative,
    port_number,
    positive_count,
    positive_rate,
    trigger_counts,
    version_number,
)
from localstate.cli._bench import cmd_bench
from localstate.cli._credential import cmd_credential
from localstate.cli._db_upgrade import cmd_db_upgrade
from localstate.cli._exit_codes import (
    EXIT_CONFLICT,
    EXIT_ERROR,
    EXIT_NOT_FOUND,
    EXIT_USAGE,
    NotFound,
)
from localstate.cli._flush import cmd_flush
from localstate.cli._history import cmd_history
from localstate.cli._printing import schema_upgrades_shown
from localstate.cli._prune import cmd_db_prune
from localstate.cli._records import cmd_delete, cmd_get, cmd_ls, cmd_set
from localstate.cli._serve import cmd_serve, is_loopback
from localstate.cli._show_config import cmd_config
from localstate.cli._status import cmd_status
from localstate.errors import InvalidInput, LocalStateError, VersionConflict

__all__ = ["EXIT_CONFLICT", "EXIT_ERROR", "EXIT_NOT_FOUND", "EXIT_USAGE", "NotFound",
           "build_parser", "is_loopback", "main"]

Handler = Callable[[argparse.Namespace], int]

# The exit code each error ends in, and the word its message starts with. The first match
# wins, so a subclass stands before its base.
_ERROR_EXITS: tuple[tuple[type[LocalStateError], str, int], ...] = (
    (VersionConflict, "conflict", EXIT_CONFLICT),
    (NotFound, "not found", EXIT_NOT_FOUND),
    (InvalidInput, "error", EXIT_USAGE),
    (LocalStateError, "error", EXIT_ERROR),
)


@functools.cache  # 5 ms of argparse set-up; a caller running many commands in one process
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="localstate", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"localstate {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    bench = sub.add_parser("bench", help="write-throughput benchmark (local-first vs direct)")
    bench.add_argument("--central-url", help="central DB (default: SQLite in a temp folder)")
    bench.add_argument("--quick", action="store_true",
                       help="the short run: K=1,100,1000, 1 s per mode (under a minute)")
    bench.add_argument("--duration", type=non_negative, help="seconds per mode and K")
    bench.add_argument("--triggers", type=trigger_counts, help="trigger counts, e.g. 1,100,1000")
    bench.add_argument("--modes", type=bench_modes,
                       help="bare,direct,memory,local,central (and peers)")
    bench.add_argument("--poll-delay", type=non_negative, default=0.0,
                       help="seconds each trigger sleeps between sets (default 0: hot loop)")
    bench.add_argument("--shared-keys", type=int, default=8,
                       help="keys in the shared-key scenario")
    bench.add_argument("--flush-interval", type=non_negative, default=1.0)
    bench.add_argument("--folder", type=Path, help="where caches go (default: a temp folder)")
    bench.add_argument("--json", type=Path, help="write the results as JSON here")
    bench.add_argument("--plot", type=Path, help="draw a PNG chart here (needs matplotlib)")
    bench.add_argument("--no-progress", action="store_true", help="no progress bar")
    bench.add_argument("--churn-owners", type=count, metavar="N",
                       help="owners passing through 1,000 live triggers in the churn run, "
                            "which reports RSS and cache file size (default 20,000; --quick "
                            "5,000; 0: no churn run)")
    bench.add_argument("--airflow-sink", action=argparse.BooleanOptionalAction, default=None,
                       help="the flush_airflow row: a flush through sink = airflow in a real "
                            "airflow triggerer (minutes; needs localstate[airflow]). Default: "
                            "run it when the central DB is PostgreSQL; --airflow-sink also "
                            "runs it on a throwaway PostgreSQL")
    bench.add_argument("--airflow-keys", type=positive_count, default=1000, metavar="N",
                       help="dirty keys the flush_airflow row flushes (default 1,000)")
    bench.add_argument("--fleet", type=positive_count, metavar="N",
                       help="the fleet benchmark: N triggerer processes (PostgreSQL), "
                       "--triggers K each, with handovers and zombies")
    bench.add_argument("--budget", type=positive_rate, metavar="R",
                       help="with --fleet: central_budget_rows_per_s")
    bench.set_defaults(handler=cmd_bench)

    db = sub.add_parser("db", help="central schema")
    db_sub = db.add_subparsers(dest="db_command", required=True, metavar="ACTION")
    up = db_sub.add_parser("upgrade", help="create or upgrade the central tables")
    up.add_argument("--central-url", help="default: the configured central_url")
    up.set_defaults(handler=cmd_db_upgrade)
    pr = db_sub.add_parser("prune", help="delete rows not updated for a while, and tombstones "
                                         "older than the tombstone horizon (retention)")
    pr.add_argument("--older-than", metavar="AGE",
                    help="delete rows not updated for AGE (7d, 36h, 90m); owners the "
                         "retention setting names follow their rule instead")
    pr.add_argument("--owner-prefix", metavar="PREFIX", help="only owners starting with PREFIX")
    pr.add_argument("--tombstone-horizon", metavar="AGE", default="30d",
                    help="delete tombstones older than AGE (default 30d, at least 1d: far "
                         "longer than any flush or handover, so a late writer meets them)")
    pr.add_argument("--event-horizon", metavar="AGE", default="7d",
                    help="delete the de-duplication rows of emitted events older than AGE "
                         "once their owner's watermark moved past them (default 7d, at "
                         "least 1h)")
    pr.add_argument("--batch-size", type=positive_count, default=500, metavar="N",
                    help="rows per delete transaction (default 500: short locks)")
    pr.add_argument("--dry-run", action="store_true", help="count, delete nothing")
    pr.add_argument("--json", action="store_true")
    pr.add_argument("--central-url", help="default: the configured central_url")
    pr.set_defaults(handler=cmd_db_prune)

    cfg = sub.add_parser("config", help="print the resolved settings, their sources, "
                                                  "where state goes")
    cfg.set_defaults(handler=cmd_config)

    cred = sub.add_parser("credential", help="a triggerer's API credential, derived from a "
                                             "per_triggerer key of api_tokens")
    cred.add_argument("--key-file", type=Path, required=True, metavar="PATH",
                      help="the key (its first line): the per_triggerer entry's token")
    cred.add_argument("--triggerer-id", metavar="ID",
                      help="default: this process's triggerer_id (the host name)")
    cred.add_argument("--out", type=Path, metavar="PATH",
                      help="write it here, mode 0600 (default: print it)")
    cred.set_defaults(handler=cmd_credential)

    def central_url(p: argparse.ArgumentParser) -> None:
        p.add_argument("--central-url", help="default: the configured central_url")

    def name_args(p: argparse.ArgumentParser) -> None:
        p.add_argument("owner", metavar="OWNER", help="e.g. asset_watcher:orders")
        p.add_argument("key", metavar="KEY", help="e.g. watermark")

    get = sub.add_parser("get", help="print one state variable (central DB, or the API "
                                     "under sink = api)")
    name_args(get)
    get.add_argument("--json", action="store_true", help="as JSON, for scripts")
    central_url(get)
    get.set_defaults(handler=cmd_get)

    put = sub.add_parser("set", help="write one state variable (central DB, or the API)")
    name_args(put)
    put.add_argument("value", metavar="JSON", help="the value as JSON ('-': read stdin)")
    put.add_argument("--expected-version", type=version_number, metavar="N",
                     help="write only if the central record is at version N (0: absent); "
                          "else exit 4")
    put.add_argument("--json", action="store_true", help="print the record as JSON")
    central_url(put)
    put.set_defaults(handler=cmd_set)

    rm = sub.add_parser("delete", help="delete one state variable (central DB, or the API)")
    name_args(rm)
    rm.add_argument("--expected-version", type=version_number, metavar="N",
                    help="delete only if the central record is at version N; else exit 4")
    rm.add_argument("--json", action="store_true")
    central_url(rm)
    rm.set_defaults(handler=cmd_delete)

    ls = sub.add_parser("ls", help="list state variables (central DB, or the API)")
    ls.add_argument("--owner", metavar="PREFIX", help="only owners starting with PREFIX")
    ls.add_argument("--limit", type=positive_count, metavar="N", help="at most N rows")
    ls.add_argument("--json", action="store_true", help="a JSON list, for scripts")
    central_url(ls)
    ls.set_defaults(handler=cmd_ls)

    st = sub.add_parser("status", help="where state goes and this host's cache files")
    st.add_argument("--json", action="store_true")
    st.add_argument("--fleet", action="store_true",
                    help="every triggerer's lag and backlog (the fleet table)")
    central_url(st)
    st.set_defaults(handler=cmd_status)

    hist = sub.add_parser("history", help="an owner's history: the watermarks its flushes "
                                          "committed, its events with their outcome, its "
                                          "claims and releases (central DB, or the API)")
    hist.add_argument("owner", metavar="OWNER", help="e.g. asset_watcher:orders")
    hist.add_argument("--limit", type=positive_count, default=50, metavar="N",
                      help="the newest N rows, printed oldest first (default 50)")
    hist.add_argument("--kind", action="append", choices=HISTORY_KINDS,
                      help="only this kind (repeatable)")
    hist.add_argument("--json", action="store_true", help="as JSON, for scripts")
    central_url(hist)
    hist.set_defaults(handler=cmd_history)

    fl = sub.add_parser("flush", help="flush cache files no live process holds")
    fl.add_argument("--cache", action="append", metavar="PATH",
                    help="this cache file (repeatable); default: every one in cache_dir")
    fl.add_argument("--json", action="store_true")
    fl.add_argument("--no-progress", action="store_true", help="no progress bar")
    central_url(fl)
    fl.set_defaults(handler=cmd_flush)

    srv = sub.add_parser("serve", help="the REST API and web UI (needs the api extra)")
    srv.add_argument("--host", help="address to bind (default: api_host, 127.0.0.1)")
    srv.add_argument("--port", type=port_number, help="default: api_port, 8686")
    srv.add_argument("--store-id", help="id of the serving store (updated_by of its writes; "
                                        "default <triggerer_id>-api)")
    srv.add_argument("--cache-path", type=Path, help="its cache file (default "
                                                     "<cache_dir>/<store id>.db)")
    srv.add_argument("--log-level", default="info",
                     choices=["critical", "error", "warning", "info", "debug"])
    central_url(srv)
    srv.set_defaults(handler=cmd_serve)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    handler: Handler = args.handler
    # db upgrade prints what it applied itself, serve and bench log through logging's own setup
    shown = (contextlib.nullcontext() if handler in (cmd_db_upgrade, cmd_serve, cmd_bench)
             else schema_upgrades_shown())
    try:
        with shown:
            return handler(args)
    except LocalStateError as exc:
        prefix, code = next((prefix, code) for kind, prefix, code in _ERROR_EXITS
                            if isinstance(exc, kind))
        print(f"{prefix}: {exc}", file=sys.stderr)
        return code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130

