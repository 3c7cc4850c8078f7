"""The mkdocs hook that generates the reference pages from the code, so they cannot drift.

Each page is built at every ``mkdocs build`` from the source of truth:

* ``reference/configuration.md``: `localstate._core.setting_specs.SPECS` (names, defaults, help,
  environment variables, live settings);
* ``reference/cli.md``: the argparse parsers of `localstate.cli.build_parser`;
* ``reference/rest-api.md``: the OpenAPI document of `localstate.api.create_app`;
* ``reference/metrics.md``: `localstate._metrics` (counters, gauges, the timer, prune counters);
* ``operations/troubleshooting.md``: every exception class of `localstate.errors`, each with the
  advice below (a class without advice, or advice for no class, fails the build);
* ``benchmarks.md``: the JSON files in ``docs/`` (dated by their last commit).
"""

from __future__ import annotations

import argparse
import inspect
import json
import statistics
import subprocess
from pathlib import Path
from typing import Any

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files

# -- troubleshooting: what each typed error means and what to do ----------------------------

ADVICE: dict[str, str] = {
    "LocalStateError": "The root of every error localstate raises: catch it to handle them "
    "all. The subclasses below say what went wrong.",
    "InvalidInput": "An argument was refused before anything was written: the previous value "
    "and version are unchanged. The message names the argument; fix the call. Under a declared "
    "`max:int`, `max:timestamp` or `max:text` policy a value that does not fit the order is "
    "refused here too.",
    "InvalidName": "Owners and keys are 1 to 250 characters without control characters. "
    "Rename the owner or key.",
    "ValueEncodingError": "Values are JSON: NaN, infinity, integers beyond 64 bits and types "
    "orjson cannot encode are refused. Convert the value (a string, a list) before `set`.",
    "ValueTooLarge": "The encoded value is over `max_value_bytes` (64 KiB by default). Keep "
    "large data elsewhere and store a reference, or raise `max_value_bytes`.",
    "ConfigError": "A setting has a value that is not allowed, or a central URL that cannot "
    "work (unsupported dialect, driver not installed, folder missing). The message names the "
    "setting and where it came from (argument, `AIRFLOW__LOCALSTATE__*`, airflow.cfg); run "
    "`localstate config` to see every resolved value.",
    "StoreClosed": "A call on a store after `close()`. Open a new store; in a trigger, use the "
    "mixin's store rather than keeping one across runs.",
    "VersionConflict": "A compare-and-set expected one version and found another (CLI exit 4, "
    "REST 409). Read the key again and retry with the version you read.",
    "VersionExhausted": "The key's version reached 2^63 - 1, the largest a 64-bit version "
    "holds (REST 409 `version_exhausted`), so it can be neither written nor deleted; nothing "
    "was written. Keep the value under a new key; to reuse the key, stop the triggers that "
    "use it and delete its row from the central DB's `localstate_state` table by "
    "hand. Versions count writes from 1, so only a row written outside localstate gets there.",
    "WriteRejected": "A `central`-durability write lost to another writer's record under the "
    "owner's conflict policy. Read the key: it now holds the central record. See the "
    "conflicts guide.",
    "OwnerLost": "Another triggerer claimed this owner after this store did (the trigger moved). "
    "The store will not write the owner again; the trigger mixin ends `run()` quietly. Nothing "
    "to do unless it repeats: then two triggerers run the same trigger for long, so check the "
    "triggerers' heartbeats.",
    "CacheError": "A problem with the local cache file; the message names the file.",
    "CacheLocked": "Another live process holds the cache file (the message names it). Give "
    "each triggerer process its own `triggerer_id` (two processes on one host share the host "
    "name by default), or stop the other process.",
    "CacheCorrupt": "The file is not a SQLite database, not a localstate cache, or from a newer "
    "release. It is never modified or wiped: move it aside (after `localstate flush` if it "
    "is a readable cache with a backlog) and start again.",
    "CacheWriteFailed": "A local commit failed (an I/O error). The write is not acknowledged: "
    "it stays in memory and is retried. Check the disk holding `cache_dir`.",
    "CacheFull": "The filesystem holding the cache is full. Free space there or point "
    "`cache_dir` at another disk; writes are retried once space returns, and nothing "
    "acknowledged is lost.",
    "CachePathNotWritable": "The cache folder or file cannot be created or written. Make "
    "`cache_dir` writable by the triggerer's user (in a container: a writable volume).",
    "SchemaError": "A local cache or central DB whose schema is newer than this code: a newer "
    "release migrated it. Upgrade localstate on this host too (see the upgrade notes).",
    "AccessDenied": "The REST API refused the token: 401 (none, or not a token the server "
    "knows) or 403 (a `read` token writing, or an owner outside its prefixes). Nothing was read "
    "or written. Check `api_token` against the server's `api_tokens`.",
    "CentralError": "The central DB failed in a way that is not a passing outage (the driver's "
    "error is the `__cause__`). Check the database's logs.",
    "EventsUnsupported": "`emit` needs a sink that writes the event and its watermark in one "
    "transaction: `sink = api`, or `sink = sql` on Airflow's metadata DB, with the cache on. "
    "Change the sink, or yield the event and set the watermark after it (at least once).",
    "SourcePositionLost": "A queue watcher's watermark points at messages the queue no longer "
    "holds: the Kafka partition's retention deleted offsets it had not read (or the topic was "
    "recreated), or the Redis stream was trimmed (`XTRIM`, `MAXLEN`) past its last entry read. "
    "Those messages are gone and the watcher stopped rather than skip them. Find out why it "
    "fell behind (a long outage, a retention or `MAXLEN` shorter than the outage), then "
    "decide: to accept the loss, set the watcher's watermark to the position the message "
    "names as the earliest held (`localstate set <owner> watermark ...`, or delete it to "
    "start from the queue's beginning), and lengthen the retention.",
    "CentralUnavailable": "The central DB (or the API server, with `sink = api`) could not be "
    "reached in the time allowed. Local writes go on and the worker retries with backoff; a "
    "`central`-durability write raised this and stays in the local cache. It also means a row "
    "lock or a pooled connection was not had within `central_transaction_timeout` (another "
    "writer frozen mid-flush: the database ends its transaction within that bound), or that "
    "the database ended this process's own idle transaction. Bring the database or the server "
    "back; nothing else to do.",
}


def _exception_classes() -> list[type[BaseException]]:
    import localstate.errors as errors

    return [obj for name in errors.__all__
            if inspect.isclass(obj := getattr(errors, name)) and issubclass(obj, BaseException)]


def rest_statuses() -> dict[str, str]:
    """The REST status of each typed error the API answers with, from the API's own table
    (`localstate._core.protocol.answer_for`); `AccessDenied` is the client's name for 401 and
    403."""
    from localstate._core.protocol import answer_for

    out = {"AccessDenied": "401 / 403"}
    for cls in _exception_classes():
        # an instance without __init__: answer_for decides by the class, and reads only the
        # detail fields set here
        sample = cls.__new__(cls)
        for field in ("expected", "actual", "size", "limit", "owner", "key"):
            setattr(sample, field, 0)
        answer = answer_for(sample)  # type: ignore[arg-type]
        if answer.code != "internal_error":
            out[cls.__name__] = str(answer.status)
    return out


def troubleshooting_page() -> str:
    classes = _exception_classes()
    names = {c.__name__ for c in classes}
    missing = sorted(names - ADVICE.keys())
    extra = sorted(ADVICE.keys() - names)
    if missing or extra:
        raise PluginError(f"troubleshooting advice out of step with localstate.errors: "
                          f"missing {missing}, for no class {extra}")
    lines = [
        "# Troubleshooting",
        "",
        "Every error localstate raises is a `LocalStateError` (`localstate.errors`).",
        "Driver errors are wrapped, with the driver's exception as `__cause__`.",
        "This page lists each one, generated from the exception classes, with what it means "
        "and what to do.",
        "Looking for what you see rather than an exception's name? "
        "See [troubleshooting by symptom](symptoms.md).",
        "",
        "The CLI ends with exit code 2 for `InvalidInput`, 3 for a missing key, 4 for "
        "`VersionConflict`, and 1 for the others.",
        "The REST API answers each typed error with the status in the table below.",
        "It answers 500 `internal_error` for a failure it did not foresee; the body carries a "
        "request id that the server's log names.",
        "It answers 499 `client_closed_request` to a client that left before its request's "
        "body arrived; no one receives that answer.",
        "",
        "| error | is a | REST status |",
        "|---|---|---|",
    ]
    status = rest_statuses()
    for cls in classes:
        bases = ", ".join(f"`{b.__name__}`" for b in cls.__bases__ if b.__module__ ==
                          cls.__module__) or "`Exception`"
        lines.append(f"| [`{cls.__name__}`](#{cls.__name__.lower()}) | {bases} | "
                     f"{status.get(cls.__name__, '')} |")
    lines.append("")
    for cls in classes:
        doc = " ".join(inspect.getdoc(cls).split()) if cls.__doc__ else ""
        lines += [f"## {cls.__name__}", "", f"*{doc}*", "", ADVICE[cls.__name__], ""]
    lines += ["## Logs during an outage", "",
              "While the central DB or the API server is away, the triggerer keeps acknowledging "
              "writes from its local cache and retries flushes with a capped backoff. "
              "`localstate status --fleet` shows each triggerer's backlog and lag; see "
              "[Status and fleet](status.md).", ""]
    return "\n".join(lines)


# -- configuration --------------------------------------------------------------------------


def _shown_default(name: str, default: Any) -> str:
    if default is None or default == ():
        return "none"
    if isinstance(default, bool):
        return "true" if default else "false"
    return str(default)


def configuration_page() -> str:
    from localstate._core.setting_specs import LIVE_SETTINGS, SPECS

    lines = [
        "# Configuration reference",
        "",
        "Generated from `localstate/_core/setting_specs.py`. Every setting resolves from, in "
        "order: the argument given in code, the environment variable "
        "`AIRFLOW__LOCALSTATE__<NAME>`, "
        "the `[localstate]` section of `airflow.cfg` (`$AIRFLOW_CONFIG`, else "
        "`$AIRFLOW_HOME/airflow.cfg`; read through Airflow's `conf` when the process has loaded "
        "Airflow, so `_cmd` and `_secret` options apply), then the default. "
        "`localstate config` prints each resolved value and where it came from.",
        "",
        f"Live settings (applied without a restart when `watch_config` is on): "
        f"{', '.join(f'`{n}`' for n in LIVE_SETTINGS)}. Secret settings are never shown in "
        "logs, errors or `localstate config`.",
        "",
        "| setting | default | environment variable | description |",
        "|---|---|---|---|",
    ]
    for name, spec in SPECS.items():
        help_text = spec.help.replace("|", "\\|")
        flags = []
        if spec.secret:
            flags.append("secret")
        if name in LIVE_SETTINGS:
            flags.append("live")
        flag_text = f" *({', '.join(flags)})*" if flags else ""
        default = _shown_default(name, spec.default).replace("|", "\\|")
        lines.append(f"| `{name}`{flag_text} | `{default}` | "
                     f"`AIRFLOW__LOCALSTATE__{name.upper()}` | {help_text} |")
    lines.append("")
    return "\n".join(lines)


# -- CLI ------------------------------------------------------------------------------------


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:  # argparse offers no public reader of its subcommands
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def cli_page() -> str:
    from localstate.cli import build_parser

    root = build_parser()
    lines = ["# CLI reference", "",
             "Generated from the `localstate` command's own parsers (`localstate --help`, "
             "`localstate COMMAND --help`). Exit codes: 0 success, 1 an error (the message says "
             "what to do), 2 bad usage or a refused name or value, 3 not found, 4 a version "
             "conflict.", ""]

    def add(prefix: str, parser: argparse.ArgumentParser, depth: int) -> None:
        subs = _subparsers(parser)
        lines.extend([f"{'#' * depth} `{prefix}`", "", "```text",
                      parser.format_help().rstrip(), "```", ""])
        for name, sub in subs.items():
            add(f"{prefix} {name}", sub, min(depth + 1, 4))

    add("localstate", root, 2)
    return "\n".join(lines)


# -- REST API -------------------------------------------------------------------------------


def _openapi() -> dict[str, Any]:
    from localstate._core.config import Settings
    from localstate.api import create_app

    settings = Settings.resolve({"central_url": "sqlite:////nonexistent/never-opened.db"})
    document: dict[str, Any] = create_app(settings).openapi()
    return document


def rest_page() -> str:
    doc = _openapi()
    lines = ["# REST API reference", "",
             "Generated from the server's OpenAPI document, which a running server also serves "
             "at `/api/v1/openapi.json` (under the plugin: "
             "`<api-server>/localstate/api/v1/openapi.json`). Every call but `health` and the "
             "OpenAPI document needs a bearer token (`Authorization: Bearer <token>`) or, under "
             "the plugin, an Airflow login. Errors are JSON bodies; see "
             "[Troubleshooting](../operations/troubleshooting.md).", "",
             f"API version {doc['info']['version']}.", "",
             *(f"{part.strip()}\n" for part in doc["info"].get("description", "").split("\n\n")
               if part.strip())]
    for path, methods in doc["paths"].items():
        for method, op in methods.items():
            lines += [f"## `{method.upper()} {path}`", ""]
            summary = op.get("summary") or ""
            description = " ".join((op.get("description") or "").split())
            if summary:
                lines += [f"**{summary}.**" if not summary.endswith(".") else f"**{summary}**",
                          ""]
            if description:
                lines += [description, ""]
            params = op.get("parameters") or []
            if params:
                lines += ["| parameter | in | required | description |", "|---|---|---|---|"]
                for p in params:
                    desc = " ".join((p.get("description") or "").split()).replace("|", "\\|")
                    lines.append(f"| `{p['name']}` | {p['in']} | "
                                 f"{'yes' if p.get('required') else 'no'} | {desc} |")
                lines.append("")
            body = op.get("requestBody")
            if body:
                schemas = [c.get("schema", {}) for c in body.get("content", {}).values()]
                refs = [s.get("$ref", "").rsplit("/", 1)[-1] for s in schemas if "$ref" in s]
                if refs:
                    lines += [f"Request body: `{refs[0]}` (JSON).", ""]
                else:
                    lines += ["Request body: JSON.", ""]
            responses = op.get("responses") or {}
            if responses:  # as the route declares them
                lines += ["| status | meaning |", "|---|---|"]
                for code in sorted(responses, key=str):
                    text = " ".join((responses[code].get("description") or "").split())
                    lines.append(f"| {code} | {text.replace('|', '/')} |")
                lines.append("")
    schemas = doc.get("components", {}).get("schemas", {})
    if schemas:
        lines += ["## Schemas", ""]
        for name, schema in schemas.items():
            props = schema.get("properties") or {}
            required = set(schema.get("required") or [])
            lines += [f"### `{name}`", ""]
            description = " ".join((schema.get("description") or "").split())
            if description:
                lines += [description, ""]
            if props:
                lines += ["| field | type | required | description |", "|---|---|---|---|"]
                for field, p in props.items():
                    desc = " ".join((p.get("description") or "").split()).replace("|", "\\|")
                    lines.append(f"| `{field}` | {_schema_type(p)} | "
                                 f"{'yes' if field in required else 'no'} | {desc} |")
                lines.append("")
    return "\n".join(lines)


def _schema_type(p: dict[str, Any]) -> str:
    if "$ref" in p:
        return f"`{p['$ref'].rsplit('/', 1)[-1]}`"
    if "anyOf" in p:
        return " or ".join(_schema_type(x) for x in p["anyOf"])
    if p.get("type") == "array":
        return f"array of {_schema_type(p.get('items') or {})}"
    return str(p.get("type", "any"))


# -- metrics --------------------------------------------------------------------------------


def metrics_page() -> str:
    from localstate._metrics import COUNTERS, GAUGES, OWNER_LAG, PRUNE_COUNTERS, TIMER
    from localstate._stats import StoreStats

    fields = {f: _field_doc(StoreStats, f) for f in (*COUNTERS, *GAUGES)}
    lines = ["# Metrics reference", "",
             "Generated from `localstate/_metrics.py`. Each name is prefixed with "
             "`statsd_prefix` (default `localstate`). Off by default: set `statsd_host` for "
             "StatsD over UDP, or `otel = true` for OpenTelemetry instruments (the `otel` "
             "extra; each carries the attribute `triggerer_id`). Over StatsD, each metric of "
             "a store ends with its triggerer (`localstate.flush_lag.<triggerer_id>`, every "
             "character but `A-Z a-z 0-9 _ -` made `_`), or, with `statsd_tags = true`, "
             "carries the DogStatsD tag `triggerer_id:<triggerer_id>`; the prune counters "
             "name no triggerer. A report is sampled from "
             "`StateStore.stats()` every `metrics_interval` seconds: nothing is sent per "
             "`set`.", "",
             "| metric | kind | from `stats()` | meaning |", "|---|---|---|---|"]
    for field, name in COUNTERS.items():
        lines.append(f"| `localstate.{name}` | counter (change since the last report) | "
                     f"`{field}` | {fields[field]} |")
    for field, name in GAUGES.items():
        lines.append(f"| `localstate.{name}` | gauge | `{field}` | {fields[field]} |")
    lines.append(f"| `localstate.{OWNER_LAG}` | gauge, per queue watcher (StatsD: "
                 f"`localstate.{OWNER_LAG}.<owner>.<triggerer_id>`; OpenTelemetry: the "
                 "attribute `owner`) | `sources_by_owner[owner][\"lag\"]` | messages the "
                 "watcher is behind its source's end (Kafka: the partitions' high watermarks) |")
    lines.append(f"| `localstate.{TIMER}` | timer (the latest flush) | `last_flush_s` | "
                 "how long the latest flush took |")
    for name in PRUNE_COUNTERS:
        what = "rows" if name.endswith("rows") else "tombstones"
        lines.append(f"| `localstate.{name}` | counter, sent once per run | "
                     f"`localstate db prune` | {what} deleted by one prune |")
    lines.append("")
    return "\n".join(lines)


#: the StoreStats fields whose meaning no ``#:`` comment states
_FIELD_MEANINGS: dict[str, str] = {
    "central_rows": "rows written to the central DB by flushes",
    "conflicts": "flushed writes another writer's record won or settled (see the conflicts "
                 "guide)",
    "central_errors": "flushes or central calls that failed (retried with backoff)",
}


def _field_doc(cls: type, field: str) -> str:
    """The ``#:`` comment above a dataclass field, if any."""
    source = inspect.getsource(cls).splitlines()
    for i, line in enumerate(source):
        if line.strip().startswith(f"{field}:"):
            comments = []
            j = i - 1
            while j >= 0 and source[j].strip().startswith("#:"):
                comments.insert(0, source[j].strip()[2:].strip())
                j -= 1
            text = " ".join(comments) or _FIELD_MEANINGS.get(field, "")
            if not text:
                raise PluginError(f"StoreStats.{field} has no #: comment: add one")
            return text.replace("|", "\\|")
    raise PluginError(f"StoreStats has no field {field!r} (localstate/_metrics.py names it)")


# -- benchmarks -----------------------------------------------------------------------------


def _dated(path: Path) -> str:
    try:
        out = subprocess.run(["git", "log", "-1", "--format=%cs", "--", path.name],
                             cwd=path.parent, capture_output=True, text=True, timeout=30,
                             check=False).stdout.strip()
    except OSError:
        out = ""
    return out or "not dated (not in git history)"


def _machine(data: dict[str, Any]) -> str:
    m = data.get("machine")
    if not m:
        return "2 shared cores (the rest of the hardware is not recorded in this file)"
    built = m.get("localstate")
    if built == "0.1.0":  # every build before 0.2.0 called itself 0.1.0: not a release
        built = "a development build made before 0.2.0 (all of them called themselves 0.1.0)"
    memory = f", {m['memory_gb']:g} GB" if m.get("memory_gb") else ""
    load = ""
    if m.get("load_at_start") is not None:
        load = f", load {m['load_at_start']:g}"
        if data.get("load_at_end") is not None:
            load += f" to {data['load_at_end']:g}"
        load += " (1-minute average, at the start and the end of the run)"
    arch = " x86-64" if "x86_64" in str(m.get("platform", "")) else ""
    return (f"{m.get('cpus')} shared{arch} cores{memory}, Python {m.get('python')}, SQLite "
            f"{m.get('sqlite')}, SQLAlchemy {m.get('sqlalchemy')}, localstate {built}{load}")


def _f(x: Any, digits: int = 0) -> str:
    if x is None:
        return "–"
    if isinstance(x, float) and digits:
        return f"{x:,.{digits}f}"
    return f"{x:,.0f}" if isinstance(x, float | int) else str(x)


def benchmarks_page(docs_dir: Path) -> str:
    lines = [
        "# Benchmarks",
        "",
        "Every figure on this page is rendered from a JSON file in the repository's `docs/` "
        "folder, written by the command named with it; the date is that file's last commit. "
        "The machines are shared, so absolute rates move a lot between runs: compare the "
        "**ratios**, each against a baseline measured in the same run. This is the only page "
        "with measured figures; the other pages describe behaviour.",
        "",
        "The hardware: virtual machines with 2 shared cores and 24 GiB of memory, Python 3.11, "
        "PostgreSQL 15 on loopback started with `fsync = off` (which flatters `direct` writes, "
        "so the ratios against them are conservative). Reproduce any of them on your "
        "hardware: `localstate bench --quick` (embedded SQLite, "
        "under a minute), `localstate bench --central-url postgresql://...`, and the longer "
        "runs in `benches/`.",
        "",
    ]
    lite = json.loads((docs_dir / "bench-sqlite.json").read_text())
    lines += _bench_rows_section(
        "Write throughput on the embedded SQLite (the README's figures)",
        docs_dir / "bench-sqlite.json", lite,
        "localstate bench --quick --json docs/bench-sqlite.json --plot docs/bench-sqlite.png",
        "bench-sqlite.png")
    lines += ["The README quotes the 1,000-trigger rows of this file, the median of three runs "
              "made one after another (by `local`'s ratio). On a machine shared with other "
              "work the ratios move between runs: `local` ranged from 22× to 48× that day.", ""]
    pg = json.loads((docs_dir / "bench-postgres.json").read_text())
    lines += _bench_rows_section(
        "Write throughput against PostgreSQL", docs_dir / "bench-postgres.json", pg,
        "localstate bench --central-url postgresql://... --triggers 1,100,1000,10000 "
        "--duration 3 --json docs/bench-postgres.json --plot docs/bench-postgres.png",
        "bench-postgres.png")
    sinks = json.loads((docs_dir / "bench-sinks-postgres.json").read_text())
    lines += _bench_rows_section(
        "All three sinks against PostgreSQL", docs_dir / "bench-sinks-postgres.json", sinks,
        "localstate bench --quick --central-url postgresql://... --json "
        "docs/bench-sinks-postgres.json --plot docs/bench-sinks-postgres.png",
        "bench-sinks-postgres.png")
    a = sinks.get("airflow_sink")
    if a:
        lines += [
            "**`sink = airflow`** in a real `airflow triggerer`, same run: "
            f"{a['keys']:,} dirty keys flushed in {a['seconds']:.1f} s "
            f"({a['keys'] / a['seconds']:.1f} rows/s) with {a['commits']:,} central commits "
            f"({a['commits'] / a['keys']:.1f} per key; {a['asets']:,} `aset` and "
            f"{a['agets']:,} `aget` calls through Airflow's supervisor, whose deployment "
            f"commits {a['idle_commits_per_s']:.1f}/s at rest). Each call is one request to "
            "the triggerer's supervisor, so this sink suits modest write rates; `sql` and "
            "`api` flush a batch in one transaction.", ""]
    c = sinks.get("churn")
    if c and c.get("samples"):
        rss = [s["rss"] / 2**20 for s in c["samples"]]
        cache = [s["cache_bytes"] / 2**20 for s in c["samples"]]
        lines += [
            f"**Churn**, same run: {c['owners']:,} owners passing through {c['live']:,} live "
            f"triggers in one store capped at {c['max_keys']:,} keys in memory: RSS "
            f"{min(rss):.1f}–{max(rss):.1f} MiB, cache file {min(cache):.2f}–{max(cache):.2f} "
            "MiB: memory and disk follow the working set, not the history.", ""]
    flush = json.loads((docs_dir / "bench-flush.json").read_text())
    lines += ["## Flush against the raw batched upsert", "",
              f"*`docs/bench-flush.json`, {_dated(docs_dir / 'bench-flush.json')}; "
              f"{_machine(flush)}; PostgreSQL on "
              "loopback; `python benches/bench_flush.py --rounds 5`; each figure the median of "
              "5 steady-state flushes (rewrites of held rows) against raw upserts measured in "
              "the same run.*", "",
              "| dirty keys | flush | rows/s | × raw `unnest` upsert | × raw `executemany` |",
              "|---|---|---|---|---|"]
    for r in flush["flush"]:
        lines.append(f"| {r['keys']:,} | {r['flush_s'] * 1000:,.0f} ms | "
                     f"{r['flush_rows_per_s']:,.0f} | {r['x_unnest']:.2f}× | "
                     f"{r['x_executemany']:.2f}× |")
    lines += ["", "Central transactions per second as the set rate grows over 10,000 keys "
              "(`flush_interval` 1 s; the extra ones above 1/s are `max_batch` spills):", "",
              "| sets/s | central transactions/s | rows per transaction |", "|---|---|---|"]
    for r in flush["rates"]:
        lines.append(f"| {r['sets_per_s']:,.0f} | {r['central_txns_per_s']:.2f} | "
                     f"{r['rows_per_txn']:,.0f} |")
    lines.append("")
    pooler = json.loads((docs_dir / "bench-pooler.json").read_text())
    lines += ["## Behind a connection pooler", "",
              f"*`docs/bench-pooler.json`, {_dated(docs_dir / 'bench-pooler.json')}; "
              f"{_machine(pooler)}; PostgreSQL and {pooler.get('pgbouncer', 'PgBouncer')} "
              "(transaction mode, the official Airflow Helm chart's settings) on loopback; "
              f"`python benches/bench_pooler.py --rounds {pooler['rounds']}`. One store per "
              "row; each round flushes every store once, then claims through it (the rows in "
              "turn, a different one first each round); a ratio is the median over the rounds "
              "of a row's figure against the same round's first-row figure; the times are "
              "medians.*", "",
              "The central connection shares nothing a pooler in transaction mode could lose: "
              "the transaction bound is set by each transaction for itself, in the round trip "
              "of its BEGIN, and statements are prepared unnamed inside their transaction. The "
              "first row is the connection with the bound in the session and prepared "
              "statements cached by name, which PgBouncer before 1.21 cannot carry; the "
              "\"first pooler-safe\" rows sent the bound as a statement of its own and checked "
              "each pooled connection with a transaction of its own. Round trips are counted "
              "by a proxy in front of the server, sequentially: a claim is its transaction and "
              "the read of the owner's keys after it. The run shared its two cores with other "
              "work, so single runs vary by a factor of three: read the median ratios.", "",
              f"| connection | round trips per claim / read / 1-key flush | flush of "
              f"{pooler['keys']:,} dirty keys | × first row | {pooler['claims']} claims at "
              "once | × first row |",
              "|---|---|---|---|---|---|"]
    labels = {"session": "bound in the session, named statements cached",
              "now, statement caches on by URL":
                  "statement caches on by the URL (direct only)",
              "first pooler-safe direct": "first pooler-safe, straight to PostgreSQL",
              "first pooler-safe via PgBouncer": "first pooler-safe, through PgBouncer",
              "pooler-safe direct": "now, straight to PostgreSQL",
              "pooler-safe via PgBouncer": "now, through PgBouncer"}
    for key, label in labels.items():
        if key not in pooler:
            continue
        f, c = pooler[key]["flush"], pooler[key]["claims"]
        trips = pooler[key].get("round_trips")
        shown = (" / ".join(f"{trips[w]:.0f}" for w in ("claim", "read", "flush"))
                 if trips else "")
        lines.append(f"| {label} | {shown} | {f['median_s'] * 1000:,.0f} ms | "
                     f"{f['x_session']:.2f}× | {c['median_s'] * 1000:,.0f} ms | "
                     f"{c['x_session']:.2f}× |")
    lines.append("")
    if "first pooler-safe direct" in pooler:
        def against_first(via: str, what: str) -> float:
            now = pooler[f"pooler-safe {via}"][what]["all_s"]
            first = pooler[f"first pooler-safe {via}"][what]["all_s"]
            return float(statistics.median(n / f for n, f in zip(now, first, strict=True)))

        lines += [
            "Against the first pooler-safe connection, in the same rounds (the median of each "
            f"round's ratio): the {pooler['claims']} claims at once take "
            f"{against_first('via PgBouncer', 'claims'):.2f}× its time through PgBouncer and "
            f"{against_first('direct', 'claims'):.2f}× straight to PostgreSQL, the flush of "
            f"{pooler['keys']:,} keys {against_first('via PgBouncer', 'flush'):.2f}× and "
            f"{against_first('direct', 'flush'):.2f}×. What changed: the bound rides in the "
            "message of its transaction's BEGIN instead of a statement of its own (two round "
            "trips), a connection leaving the pool is checked with one round trip instead of "
            "four, a claim's history row is written by the claim's own statement, and the "
            "claims waiting for a claim slot, and the reads of the owners' keys after them, "
            "are made together, one statement for many.", ""]
    lines += ["A flush is one large transaction: a few round trips more or less are "
              "milliseconds against its hundreds, and its ratio moves with the machine's load "
              "from run to run. A direct connection gets the cached statements back with "
              "`?statement_cache_size=100&prepared_statement_cache_size=100` on its "
              "`central_url`.", ""]
    sizing = json.loads((docs_dir / "bench-sizing.json").read_text())
    lines += ["## What a triggerer's state costs", "",
              f"*`docs/bench-sizing.json`, {_dated(docs_dir / 'bench-sizing.json')}; "
              f"{_machine(sizing)}; `python benches/bench_sizing.py --sizes "
              f"{','.join(str(r['keys']) for r in sizing['rows'])}`. One store, one watermark "
              "(a small JSON object) per owner, flushed; resident memory above the same "
              "store holding one key, measured in the same run.*", "",
              "| keys | resident memory | per 1,000 keys | cache file and WAL |",
              "|---|---|---|---|"]
    for r in sizing["rows"]:
        lines.append(f"| {r['keys']:,} | {r['rss_bytes'] / 2**20:,.1f} MiB | "
                     f"{r['rss_bytes'] / r['keys'] * 1000 / 2**20:.2f} MiB | "
                     f"{r['cache_file_bytes'] / 2**20:,.1f} MiB |")
    lines.append("")
    fleet = json.loads((docs_dir / "bench-fleet.json").read_text())
    lines += ["## The fleet and the write budget", "",
              f"*`docs/bench-fleet.json`, {_dated(docs_dir / 'bench-fleet.json')}; "
              f"{_machine(fleet)}; PostgreSQL on "
              "loopback; `localstate bench --fleet 3 --triggers 300 [--budget 500] "
              "--central-url postgresql://... --json docs/bench-fleet.json`. Each run stops one "
              "triggerer (SIGSTOP) and wakes it as a zombie, and kills another (SIGKILL); the "
              "figures come from a history the database records itself.*", "",
              "| budget | rows/s (model) | transactions/s (model) | flush interval (model) | "
              "watermarks moved backwards | zombie writes accepted / refused | handovers |",
              "|---|---|---|---|---|---|---|"]
    for r in fleet["rows"]:
        budget = _f(r.get("budget_rows_per_s")) if r.get("budget_rows_per_s") else "none"
        model_interval = r.get("model_flush_interval_s") or r["flush_interval"]
        lines.append(
            f"| {budget} | {r['central_rows_per_s']:,.0f} ({r['model_rows_per_s']:,.0f}) | "
            f"{r['central_txns_per_s']:.2f} ({r['model_txns_per_s']:.2f}) | "
            f"{r['flush_interval_s']:.2f} s ({model_interval:.2f} s) | {r['regressions']} | "
            f"{r['zombie_writes_accepted']} / {r['zombie_writes_refused']} | "
            f"{r['handovers']:,} |")
    lines += ["", "The model is described in [The fleet and the write budget]"
              "(guides/fleet.md).", ""]
    lines += _events_section(docs_dir)
    lines += _api_body_section(docs_dir)
    lines += _exit_section(docs_dir)
    lines += _history_section(docs_dir)
    lines += _queues_section(docs_dir)
    return "\n".join(lines)


#: what each request of `benches/bench_api_body.py` is, by its name there
_BODY_SCENARIOS = {
    "declared-65MB": "a 65 MB flush (1,000,000 rows) with its `Content-Length`",
    "chunked-65MB": "the same body chunked, no length",
    "largest-within": "the largest flush a client sends: 100,000 rows, just under the limit",
    "baseline-old-limit-65MB": "baseline: the 65 MB flush under the former 64 MiB limit",
}


def _api_body_section(docs_dir: Path) -> list[str]:
    """An oversized flush body against the API server: its memory and its health route."""
    lines = ["## Oversized flush bodies against the API server", ""]
    for name in ("bench-api-body.json", "bench-api-body-postgres.json"):
        path = docs_dir / name
        data = json.loads(path.read_text())
        flag = " --postgres" if "postgres" in name else ""
        lines += [f"*`docs/{name}`, {_dated(path)}; {data['machine']}; central DB "
                  f"{data['central']}; `python benches/bench_api_body.py{flag} --json "
                  f"docs/{name}`. A real `localstate serve` with the default limits; its RSS "
                  "sampled every 20 ms and its health route asked every 50 ms from other "
                  "threads while each request runs.*", "",
                  "| request | answer | after | bytes sent by then | RSS growth | slowest "
                  "`/health` |", "|---|---|---|---|---|---|"]
        for r in data["results"]:
            answer = f"{r['status']} {r['error']}" if r["error"] else str(r["status"])
            lines.append(f"| {_BODY_SCENARIOS.get(r['name'], r['name'])} | {answer} | "
                         f"{r['answer_s']:.2f} s | {r['sent_bytes'] / 1e6:.1f} of "
                         f"{r['body_bytes'] / 1e6:.1f} MB | {r['rss_growth_mib']:.0f} MiB | "
                         f"{r['health_max_s']:.2f} s |")
        lines.append("")
    lines += ["A body over the limit is refused at its headers, or after the limit's worth of "
              "a chunked one, and costs the server no more than that. The largest batch "
              "within the limit is decoded in slices in a worker thread; the pauses left "
              "while it is written are the central write's own work on the event loop and "
              "the collector's full passes over the objects it makes.", ""]
    return lines


def _exit_section(docs_dir: Path) -> list[str]:
    """A program's exit with its store closed or left open."""
    path = docs_dir / "bench-exit.json"
    data = json.loads(path.read_text())
    labels = {"closed": "closed with `await store.close()` (baseline)",
              "raised": "raised before `close()` (`asyncio.run`)",
              "left open": "returned with the store open (`asyncio.run`)",
              "run_until_complete": "returned with the store open, loop only closed "
                                    "(`run_until_complete`)",
              "blocking": "a `BlockingStateStore` never closed"}
    lines = ["## A program's exit, with its store closed or left open", "",
             f"*`docs/{path.name}`, {_dated(path)}; {_machine(data)}; embedded SQLite; "
             f"`python benches/bench_exit.py --rounds {data['rounds']} --json "
             f"docs/bench-exit.json`. Each case is a fresh program that makes {data['writes']} "
             "writes (all but one in `memory` durability, their window still open) and ends; "
             "the figure is the time from its last statement to its exit, the median of "
             f"{data['rounds']} rounds. After every exit the cache file held all the writes.*",
             "", "| the program's store | exit after its last statement | × closed | "
             "programs that hung |", "|---|---|---|---|"]
    for r in data["results"]:
        lines.append(f"| {labels.get(r['case'], r['case'])} | {r['median_s']:.2f} s "
                     f"({r['min_s']:.2f}–{r['max_s']:.2f}) | {r['x_closed']:.2f}× | "
                     f"{r['hung']} of {data['rounds']} |")
    lines.append("")
    return lines


def _history_section(docs_dir: Path) -> list[str]:
    """A watcher's history: what it costs a flush, and its bounds over a churn run."""
    path = docs_dir / "bench-history.json"
    if not path.exists():
        return []
    data = json.loads(path.read_text())
    lines = ["## A watcher's history: its cost to a flush", "",
             f"*`docs/{path.name}`, {_dated(path)}; {_machine(data)}; PostgreSQL on loopback; "
             f"`{data.get('command', 'python benches/bench_history.py')} --json "
             "docs/bench-history.json`. Three stores "
             "in one run, taking turns each round: history off, on (the default "
             "`history_watermark_every`, its window counted in one-second flush intervals) and "
             "on for every flush (`history_watermark_every = 0`); throughput over every flush "
             "of the run.*", "",
             "| flush of | off rows/s | on rows/s | × off | every flush rows/s | × off |",
             "|---|---|---|---|---|---|"]
    for r in data["flush"]:
        what = f"{r['keys']:,} {'owners emitting' if r['kind'] == 'events' else 'watermarks'}"
        lines.append(f"| {what} | {r['off_rows_per_s']:,.0f} | {r['on_rows_per_s']:,.0f} | "
                     f"{r['on_vs_off']:.2f}× | {r['every_rows_per_s']:,.0f} | "
                     f"{r['every_vs_off']:.2f}× |")
    c = data.get("churn")
    if c:
        handed = (f", {c['handovers']:,} handovers: a claim and a release each"
                  if c.get("handovers") else "")
        lines += ["", f"**Churn**, same run: {c['owners']:,} owners flushed {c['flushes']:,} "
                  f"times (a third emitting{handed}) with `history_max_rows` {c['max_rows']}: "
                  "at most "
                  f"{c['most_rows_held']} rows held by any owner (bound with the trim's tenth: "
                  f"{c['bound_with_slack']}), {c['rows_at_end']:,} rows at the end."]
    lines.append("")
    return lines


def _events_section(docs_dir: Path) -> list[str]:
    """Asset events: `emit` against Airflow's own watcher path, and the chaos run."""
    path = docs_dir / "bench-events.json"
    data = json.loads(path.read_text())
    phases = data["phases"]
    lines = ["## Asset events: `emit` against Airflow's watcher path", "",
             f"*`docs/{path.name}`, {_dated(path)}; {data['hardware']}; Airflow "
             f"{data['airflow_version']} on {data['central_db']}; `python "
             "benches/bench_events.py --json docs/bench-events.json`. One `airflow triggerer` "
             "(`sink = api`, `flush_interval` "
             f"{data['flush_interval_s']:g} s) and `airflow api-server` with the plugin; every "
             "figure is read from Airflow's `asset_event` table. The baseline, measured in the "
             "same run, is a watcher yielding `TriggerEvent`s, which Airflow's supervisor "
             "commits one by one.*", "",
             "| path | events | events/s | × Airflow's path | latency p50 | latency p99 | "
             "database commits per event |", "|---|---|---|---|---|---|---|"]
    base = phases["yield"]["events_per_s"]
    names = {"yield": "Airflow: `yield TriggerEvent`", "emit": "localstate `emit`",
             "paced": f"localstate `emit`, offered {data['paced_rate_offered']:,}/s"}
    for key, label in names.items():
        r = phases[key]
        lines.append(f"| {label} | {r['events']:,} | {r['events_per_s']:,.0f} | "
                     f"{r['events_per_s'] / base:.1f}× | {r['latency_p50_s']:.2f} s | "
                     f"{r['latency_p99_s']:.2f} s | {r['db_commits_per_event']:.3f} |")
    lines.append("")
    chaos_path = docs_dir / "bench-events-chaos.json"
    if chaos_path.exists():
        chaos = json.loads(chaos_path.read_text())
        s = chaos["schedule"]
        lines += [f"**Under faults** (*`docs/{chaos_path.name}`, {_dated(chaos_path)}; "
                  "`python benches/bench_events_chaos.py --json docs/bench-events-chaos.json`*): "
                  "two triggerers, the scheduler and the API server with the plugin on "
                  f"PostgreSQL, {s['watchers']} watchers of each kind fed {s['rate']:g} items/s "
                  f"each, through {chaos['kills']} SIGKILLs of a triggerer, {chaos['zombies']} "
                  f"zombie stops (SIGSTOP, then SIGCONT; in {chaos['takeovers']} of them the "
                  "other triggerer had taken the triggers over before the zombie woke) and "
                  f"{chaos['api_restarts']} API-server restarts in "
                  f"{chaos['seconds'] / 60:.0f} minutes:", "",
                  "| watcher | items | asset events | duplicates | missing | out of order |",
                  "|---|---|---|---|---|---|"]
        for key, label in (("emit", "localstate `emit`"),
                           ("plain", "Airflow: `yield`, then `asset_state_store.aset`")):
            r = chaos[key]
            lines.append(f"| {label} | {r['fed']:,} | {r['events']:,} | {r['duplicates']:,} | "
                         f"{r['missing']:,} | {r['out_of_order']:,} |")
        lines.append("")
    return lines


def _queues_cpu(data: dict[str, Any]) -> list[str]:
    """What a message costs each process (CPU seconds per 1,000 messages, whatever the
    machine's load), and the load average each phase ran at."""
    phases = {k: r for k, r in data["phases"].items() if "cpu_s_per_1000_messages" in r}
    if not phases:
        return []
    columns = (("triggerer children", "trigger runner"), ("triggerer", "triggerer supervisor"),
               ("api server", "API server"), ("postgres children", "PostgreSQL"))
    lines = ["**CPU seconds per 1,000 messages** of each process over each phase (user + "
             "system time, which the machine's load does not change: a wall-clock figure "
             "here moves with the other jobs on the machine, this one does not), and the "
             "machine's load at the phase's end (runnable jobs on its cores, one-minute "
             "mean). Its last column is what one core could carry at that cost: 1,000 "
             "messages over the CPU seconds of all the processes together.", "",
             "| watcher | " + " | ".join(label for _k, label in columns)
             + " | all | load | messages/s on one core |",
             "|---|" + "---|" * (len(columns) + 3)]
    for key, r in phases.items():
        cpu = r["cpu_s_per_1000_messages"]
        values = [float(cpu.get(k, 0.0)) + (float(cpu.get("api server children", 0.0))
                                             if k == "api server" else 0.0)
                  for k, _label in columns]
        lines.append(f"| `{key}` | " + " | ".join(f"{v:.3f}" for v in values)
                     + f" | {sum(values):.3f} | {r['load_average'][0]:.1f} | "
                     f"{1000 / sum(values) if sum(values) else 0:,.0f} |")
    lines.append("")
    return lines


def _queues_section(docs_dir: Path) -> list[str]:
    """The message-queue watchers: throughput and latency, and the chaos runs."""
    lines: list[str] = []
    path = docs_dir / "bench-queues.json"
    if path.exists():
        data = json.loads(path.read_text())
        phases = data["phases"]
        base = phases["airflow_kafka"]["messages_per_s"]
        lines += ["## Message-queue watchers", "",
                  f"*`docs/{path.name}`, {_dated(path)}; {data['hardware']}; Airflow "
                  f"{data['airflow_version']} on {data['central_db']}; brokers: "
                  f"{data['brokers']}; `python benches/bench_queues.py --json "
                  "docs/bench-queues.json`. One `airflow triggerer` (`sink = api`, "
                  f"`flush_interval` {data['flush_interval_s']:g} s); every figure is read "
                  "from Airflow's `asset_event` table, latency from the message's produce "
                  "time. The baseline, same run and broker, is Airflow's own "
                  "`MessageQueueTrigger(scheme=\"kafka\")`. The rows without a rate offered "
                  "drain a backlog produced at once, so their latency is the backlog's wait; "
                  "the paced row is the latency under a steady load.*", "",
                  "| watcher | messages delivered | messages/s | × Airflow's Kafka trigger | "
                  "latency p50 "
                  "| latency p99 | database commits per message |",
                  "|---|---|---|---|---|---|---|"]
        names = {"airflow_kafka": "Airflow: `MessageQueueTrigger`, Kafka",
                 "kafka": "`KafkaTopicTrigger`",
                 "kafka_paced": f"`KafkaTopicTrigger`, offered {data['paced_rate_offered']:,}/s",
                 "redis": "`RedisStreamTrigger`", "sqs": "`SqsQueueTrigger`"}
        for key, label in names.items():
            r = phases[key]
            ratio = (f"{r['messages_per_s'] / base:,.0f}×" if base and key.startswith("kafka")
                     else "–")
            rate = r["messages_per_s"]
            lines.append(f"| {label} | {r['events']:,} of {r['messages']:,} | "
                         f"{rate:,.1f} | {ratio} "
                         f"| {r['latency_p50_s']:.2f} s | {r['latency_p99_s']:.2f} s | "
                         f"{r['db_commits_per_message']:.3f} |")
        lines.append("")
        lines += _queues_cpu(data)
    chaos_path = docs_dir / "bench-queue-chaos.json"
    if chaos_path.exists():
        chaos = json.loads(chaos_path.read_text())
        lines += [f"**Queue watchers under faults** (*`docs/{chaos_path.name}`, "
                  f"{_dated(chaos_path)}; `python benches/bench_queue_chaos.py --json "
                  "docs/bench-queue-chaos.json`*): Tansu, redis-server and moto's SQS server, "
                  "two triggerers, the scheduler and the API server with the plugin, through "
                  f"{chaos['kills']} SIGKILLs of a triggerer, {chaos['zombies']} zombie stops "
                  f"({chaos['takeovers']} taken over), {chaos['api_restarts']} API-server "
                  f"restarts and {', '.join(chaos['source_faults'])}:", "",
                  "| asset | messages | asset events | duplicates | missing | out of order |",
                  "|---|---|---|---|---|---|"]
        for name, r in sorted(chaos["by_asset"].items()):
            lines.append(f"| `{name}` | {r['fed']:,} | {r['events']:,} | {r['duplicates']:,} "
                         f"| {r['missing']:,} | {r['out_of_order']:,} |")
        lines.append("")
    return lines


def _bench_rows_section(title: str, path: Path, data: dict[str, Any], command: str,
                        chart: str) -> list[str]:
    rows = [r for r in data["rows"] if r.get("scenario") == "distinct"]
    lines = [f"## {title}", "",
             f"*`docs/{path.name}`, {_dated(path)}; {_machine(data)}; `{command}`. Each "
             "row's ratio is against "
             "`direct` (the cache off: one central transaction per `set`) in the same run.*",
             "",
             "| triggers | mode | sets/s | × direct | central transactions/s | flush lag p99 |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        lag = f"{r['lag_p99_ms'] / 1000:.2f} s" if r.get("lag_p99_ms") else "–"
        x = f"{r['x_direct']:,.1f}×" if r.get("x_direct") else "–"
        lines.append(f"| {r['triggers']:,} | `{r['mode']}` | {r['sets_per_s']:,.0f} | {x} | "
                     f"{r['central_txns_per_s']:.2f} | {lag} |")
    lines += ["", f"![{title}]({chart})", ""]
    return lines


# -- the hook -------------------------------------------------------------------------------

PAGES = {
    "reference/configuration.md": configuration_page,
    "reference/cli.md": cli_page,
    "reference/rest-api.md": rest_page,
    "reference/metrics.md": metrics_page,
    "operations/troubleshooting.md": troubleshooting_page,
}


#: the first line of the placeholder each generated page has in the repository, so that a link
#: to it resolves when the Markdown is read on GitHub; the build replaces it
PLACEHOLDER = "<!-- placeholder: the site's build replaces this file with the generated page -->"


def placeholder(uri: str, title: str) -> str:
    """The repository's placeholder of generated page `uri`."""
    return (f"{PLACEHOLDER}\n# {title}\n\nThis page is generated from the code when the "
            "documentation site is built.\nBuild the site and read it there:\n\n```sh\n"
            "pip install '.[docs,api]' && mkdocs serve\n```\n")


#: where the architecture page's module map goes, with a line for readers of the repository:
#: the build puts the map in their place
MODULE_MAP = ("<!-- module map: the site's build puts the table of every module here -->\n"
              "*The table of modules is generated from the code when the documentation site is "
              "built (read\nit there); in the repository, each module's docstring says what it "
              "is.*")


def module_map(root: Path) -> str:
    """Every module of localstate/ and sync/, by folder, the folders by layer (lowest first,
    as the import graph orders them), each with the first sentence of its docstring."""
    from localstate._testing.source_graph import folder_layers, folder_of, module_files, summary

    files = module_files()
    layers = folder_layers()
    lines: list[str] = []
    for folder in sorted(layers, key=lambda f: (layers[f], f)):
        modules = sorted((m for m in files if folder_of(m) == folder),
                         key=lambda m: (files[m].name != "__init__.py", m))
        where = files[modules[0]].parent.relative_to(root).as_posix()
        about = summary(folder) if folder in files else ""  # a folder with no __init__.py
        lines += [f"### `{where}/` (layer {layers[folder]})", "", about, "",
                  "| module | what it is |", "|---|---|"]
        for module in modules:
            text = summary(module).replace("|", "\\|")
            if not text:
                raise PluginError(f"{files[module]} has no docstring: its first sentence "
                                  "says what the module is on the architecture page")
            lines.append(f"| `{files[module].relative_to(root).as_posix()}` | {text} |")
        lines.append("")
    return "\n".join(lines)


def on_page_markdown(markdown: str, page: Any, config: MkDocsConfig, files: Files) -> str:
    if MODULE_MAP in markdown:
        return markdown.replace(MODULE_MAP, module_map(Path(config["docs_dir"]).parent))
    return markdown


def on_files(files: Files, config: MkDocsConfig) -> Files:
    docs_dir = Path(config["docs_dir"])
    generated = {uri: make() for uri, make in PAGES.items()}
    generated["benchmarks.md"] = benchmarks_page(docs_dir)
    for uri, content in generated.items():
        existing = files.get_file_from_path(uri)
        if existing is not None:
            if not (docs_dir / uri).read_text().startswith(PLACEHOLDER):
                raise PluginError(f"docs/{uri} is generated: its file in the repository is "
                                  "only a placeholder (see `placeholder`)")
            files.remove(existing)
        files.append(File.generated(config, uri, content=content))
    return files
