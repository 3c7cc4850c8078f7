"""Run the whole benchmark and present it: table, plain-language summary, JSON, PNG chart."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import platform
import sqlite3
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any, TextIO

from localstate._bench.airflow_flush import (
    POLICY,
    airflow_sink_unavailable,
    measure_airflow_flush,
)
from localstate._bench.airflow_peer import measure_metastore_aset
from localstate._bench.baselines import (
    PEER_MODES,
    aiosqlite_executemany,
    central_bulk_upsert,
    flush_rows_per_s,
)
from localstate._bench.progress import Progress
from localstate._bench.runner import BenchConfig, BenchRow, rss_mb, run_scenario
from localstate._sync.central.central_store import CentralStore
from localstate.errors import LocalStateError

__all__ = ["machine_info", "print_table", "run_bench", "summary", "write_json", "write_plot"]


async def run_bench(cfg: BenchConfig) -> dict[str, Any]:
    """Every mode for every K (and the shared-key scenario), then the raw baselines."""
    cfg.folder.mkdir(parents=True, exist_ok=True)
    store_modes = [m for m in cfg.modes if m not in PEER_MODES]
    plan = [("distinct", m, k) for k in cfg.triggers for m in store_modes]
    if cfg.shared:
        plan += [("shared", m, max(cfg.triggers)) for m in store_modes if m != "bare"]
    central = await CentralStore.open(cfg.url)  # create the schema once, up front
    dialect = central.dialect
    await central.close()
    # peers and sinks are always accounted for: measured, or skipped with the reason printed
    skipped = {"airflow_variable": "Variable.set needs a running Airflow's Execution API; "
                                   "the e2e test measures a real triggerer's writes instead"}
    airflow_why = _airflow_sink_plan(cfg, dialect)
    progress = Progress(len(plan) + 4 + (airflow_why is None), label="localstate bench",
                        enabled=cfg.progress)
    rows: list[BenchRow] = []
    for scenario, mode, k in plan:
        try:
            rows.append(await run_scenario(cfg, scenario, mode, k, progress))
        except LocalStateError as exc:  # one failed mode must not lose the others' figures
            rows.append(BenchRow(scenario, mode, k, rss_mb=rss_mb(), note=f"failed: {exc}"))
            progress.step(f"{scenario} {mode} K={k}: FAILED ({exc})")
    _ratios(rows)
    n = max(1000, max(cfg.triggers))
    raw_local = await aiosqlite_executemany(cfg.folder, n * 5)
    rows.append(BenchRow("baseline", "aiosqlite_executemany", n, sets=n * 5,
                         sets_per_s=raw_local, rss_mb=rss_mb(),
                         note="1,000 rows per local commit, synchronous=FULL"))
    progress.step(f"aiosqlite executemany: {raw_local:,.0f} rows/s")
    flush_keys = min(10_000, n * 10)
    bulk = await central_bulk_upsert(cfg.url, flush_keys)
    # medians of 3 flushes, the sql sink's and (below) the api sink's in the same run
    flushed, flush_s = await flush_rows_per_s(cfg.url, cfg.folder, flush_keys, rounds=3)
    rows.append(BenchRow("baseline", "central_bulk", flush_keys, sets=flush_keys,
                         sets_per_s=bulk, central_txns=1, central_rows=flush_keys,
                         rows_per_txn=float(flush_keys), rss_mb=rss_mb(),
                         note={"postgresql": "asyncpg unnest",
                               "mysql": "aiomysql multi-row INSERT … ON DUPLICATE KEY UPDATE"
                               }.get(dialect, "sqlite3 executemany")))
    rows.append(BenchRow("baseline", "flush", flush_keys, sets=flush_keys, seconds=flush_s,
                         sets_per_s=flushed, central_txns=1, central_rows=flush_keys,
                         rows_per_txn=float(flush_keys), rss_mb=rss_mb(),
                         x_direct=None, note=f"{flushed / bulk:.0%} of central_bulk"))
    progress.step(f"flush of {flush_keys:,} keys: {flushed:,.0f} rows/s "
                  f"({flushed / bulk:.0%} of the raw bulk upsert)")
    api_why = _api_flush_unavailable()
    if api_why is None:
        rows.append(await _api_flush(cfg, flush_keys, flushed))
        progress.step(f"flush through sink = api: {rows[-1].note}")
    else:
        skipped["flush_api"] = api_why
    airflow_detail: dict[str, Any] | None = None
    if airflow_why is None:
        row, airflow_detail = await _airflow_flush(cfg, flushed, progress)
        rows.append(row)
        progress.step(f"flush through sink = airflow: {row.note}")
    else:
        skipped["flush_airflow"] = airflow_why
    peer_calls = 500
    peer_rate, peer_note = await measure_metastore_aset(cfg.url, peer_calls)
    if peer_rate is None:
        skipped["airflow_metastore"] = peer_note
        progress.step("Airflow peer: skipped")
    else:
        rows.append(BenchRow("baseline", "airflow_metastore", 1, sets=peer_calls,
                             sets_per_s=peer_rate, central_txns=peer_calls,
                             rows_per_txn=1.0, rss_mb=rss_mb(), note=peer_note))
        progress.step(f"Airflow MetastoreBackend.aset: {peer_rate:,.0f} calls/s")
    return {
        "machine": machine_info(),
        "settings": {
            "central_url": _hide(cfg.url), "dialect": dialect, "duration_s": cfg.duration,
            "triggers": cfg.triggers, "modes": cfg.modes, "poll_delay_s": cfg.poll_delay,
            "shared_keys": cfg.shared_keys, "flush_interval_s": cfg.flush_interval,
        },
        "rows": [r.as_dict() for r in rows],
        "skipped": {m: r for m, r in skipped.items() if r},
        **({"airflow_sink": airflow_detail} if airflow_detail else {}),
    }


def _airflow_sink_plan(cfg: BenchConfig, dialect: str) -> str | None:
    """None when the ``flush_airflow`` row runs, else why not and how to make it run."""
    if cfg.airflow_sink is False:
        return ("--no-airflow-sink (--airflow-sink measures a flush through sink = airflow in "
                "a real airflow triggerer: minutes)")
    missing = airflow_sink_unavailable()
    if missing is not None:
        return missing
    if cfg.airflow_sink is None and dialect != "postgresql":
        return ("runs by default with a PostgreSQL central DB (--central-url postgresql://…); "
                "--airflow-sink runs it here on a throwaway PostgreSQL (minutes)")
    return None


async def _airflow_flush(cfg: BenchConfig, sql_rows_per_s: float, progress: Progress
                         ) -> tuple[BenchRow, dict[str, Any] | None]:
    """A flush of ``airflow_keys`` dirty keys through ``sink = airflow``, in a real triggerer
    on PostgreSQL (`localstate._bench.airflow_flush`)."""
    keys, folder = cfg.airflow_keys, cfg.folder / "airflow"
    try:
        r = await measure_airflow_flush(cfg.url, folder, keys, progress.status)
    except Exception as exc:  # any failure of the deployment: the other rows still count
        first = (str(exc) or type(exc).__name__).splitlines()[0]
        return BenchRow("baseline", "flush_airflow", keys, rss_mb=rss_mb(),
                        note=f"failed: {first} (logs: {folder / 'logs'})"), None
    return BenchRow(
        "baseline", "flush_airflow", keys, sets=keys, seconds=r.seconds,
        sets_per_s=r.rows_per_s, central_txns=r.commits, central_rows=keys,
        rows_per_txn=keys / r.commits if r.commits else None, rss_mb=rss_mb(),
        note=f"{r.commits / keys:.1f} commits per key; {r.agets:,} aget + {r.asets:,} aset "
             f"calls through a real airflow triggerer's supervisor in {r.flushes} flushes "
             f"(conflict_policy {POLICY}), metadata DB on {r.server}; "
             f"{r.rows_per_s / sql_rows_per_s:.2%} of the sql sink's flush"), asdict(r)


def _api_flush_unavailable() -> str | None:
    """Why the ``flush_api`` row cannot run here (None: it can): it serves the REST API and
    talks to it, which the base install does not bring."""
    missing = [m for m in ("fastapi", "uvicorn", "httpx") if importlib.util.find_spec(m) is None]
    if missing:
        return (f"{', '.join(missing)} not installed: pip install 'localstate[api,client]' "
                "for the flush through sink = api")
    return None


async def _api_flush(cfg: BenchConfig, keys: int, sql_rows_per_s: float) -> BenchRow:
    """The same flush through ``sink = api``: a `localstate serve` process on the same central
    DB writes each batch (one request, one transaction)."""
    from localstate._bench.api_server import api_server  # the api and client extras

    try:
        async with api_server(cfg.url, cfg.folder) as server:
            rate, seconds = await flush_rows_per_s(
                cfg.url, cfg.folder, keys, tag="api", rounds=3, sink="api",
                api_url=server.url, api_token=server.token, enabled=True)
    except LocalStateError as exc:
        return BenchRow("baseline", "flush_api", keys, rss_mb=rss_mb(),
                        note=f"failed: {exc}")
    return BenchRow("baseline", "flush_api", keys, sets=keys, seconds=seconds,
                    sets_per_s=rate, central_txns=1, central_rows=keys, rss_mb=rss_mb(),
                    rows_per_txn=float(keys), x_direct=None,
                    note=f"{rate / sql_rows_per_s:.0%} of the sql sink's flush (one "
                         "request to localstate serve)")


def _ratios(rows: list[BenchRow]) -> None:
    by = {(r.scenario, r.mode, r.triggers): r for r in rows}
    for r in rows:
        direct = by.get((r.scenario, "direct", r.triggers))
        bare = by.get(("distinct", "bare", r.triggers))
        if direct is not None and direct.sets_per_s:
            r.x_direct = r.sets_per_s / direct.sets_per_s
        if bare is not None and bare.sets_per_s:
            r.x_bare = r.sets_per_s / bare.sets_per_s


def _hide(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


def machine_info() -> dict[str, Any]:
    """The machine and versions a benchmark ran on (its JSON's ``machine``)."""
    import aiosqlite
    import orjson
    import sqlalchemy

    from localstate import __version__

    return {
        "python": sys.version.split()[0], "platform": platform.platform(),
        "cpus": os.cpu_count(), "memory_gb": _memory_gb(), "sqlite": sqlite3.sqlite_version,
        "localstate": __version__, "sqlalchemy": sqlalchemy.__version__,
        "aiosqlite": aiosqlite.__version__, "orjson": orjson.__version__,
        # the machine is shared: how loaded it was when the run began (1-minute average)
        "load_at_start": round(os.getloadavg()[0], 1),
    }


def _memory_gb() -> float | None:
    """The machine's memory in GB (``MemTotal``; None where /proc/meminfo is not)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return round(int(line.split()[1]) / 1024**2, 1)
    except OSError:
        pass
    return None


def _fmt(value: float | None, spec: str = ",.0f") -> str:
    return "-" if value is None else format(value, spec)


def print_table(result: dict[str, Any], out: TextIO = sys.stdout) -> None:
    head = (f"{'scenario':<9} {'mode':<22} {'K':>6} {'sets/s':>11} {'x direct':>9} "
            f"{'x bare':>7} {'p50 ms':>7} {'p99 ms':>7} {'txns':>6} {'rows/txn':>8} "
            f"{'lag p99':>8} {'RSS MB':>7}")
    print(head, file=out)
    print("-" * len(head), file=out)
    for r in result["rows"]:
        print(
            f"{r['scenario']:<9} {r['mode']:<22} {r['triggers']:>6} {_fmt(r['sets_per_s']):>11} "
            f"{_fmt(r['x_direct'], '.1f'):>9} {_fmt(r['x_bare'], '.3f'):>7} "
            f"{_fmt(r['set_p50_ms'], '.3f'):>7} {_fmt(r['set_p99_ms'], '.2f'):>7} "
            f"{r['central_txns']:>6} {_fmt(r['rows_per_txn'], _per_txn(r)):>8} "
            f"{_fmt(r['lag_p99_ms'], ',.0f'):>8} {r['rss_mb']:>7.0f}",
            file=out,
        )
    for r in result["rows"]:
        if r["note"].startswith("failed"):
            print(f"{r['mode']} {r['note']}", file=out)
    for mode, reason in result.get("skipped", {}).items():
        print(f"skipped {mode}: {reason}", file=out)


def _per_txn(row: dict[str, Any]) -> str:
    """Whole rows per transaction, or two decimals below 10 (sink = airflow: a fraction)."""
    return ",.0f" if (row["rows_per_txn"] or 0) >= 10 else ".2f"


def summary(result: dict[str, Any]) -> str:
    """A plain-language sentence per K: what local-first buys over direct writes."""
    rows = [r for r in result["rows"] if r["scenario"] == "distinct"]
    lines = []
    for k in sorted({r["triggers"] for r in rows}):
        by = {r["mode"]: r for r in rows if r["triggers"] == k}
        direct, local = by.get("direct"), by.get("local")
        if not direct or not local or not direct["sets_per_s"]:
            continue
        fewer = (f"{direct['central_txns'] / local['central_txns']:,.0f}x fewer database "
                 "transactions" if local["central_txns"] else
                 f"no database transaction in the run (direct: {direct['central_txns']:,})")
        line = (f"with {k:,} trigger{'s' if k != 1 else ''}, local-first (local durability) "
                f"took {local['sets_per_s'] / direct['sets_per_s']:,.0f}x the updates of direct "
                f"writes with {fewer}")
        memory = by.get("memory")
        if memory:
            line += (f"; memory durability {memory['sets_per_s'] / direct['sets_per_s']:,.0f}x")
        lines.append(line + ".")
    peer = next((r for r in result["rows"] if r["mode"] == "airflow_metastore"), None)
    local_rows = [r for r in rows if r["mode"] == "local" and r["sets_per_s"]]
    if peer and peer["sets_per_s"] and local_rows:
        best = max(local_rows, key=lambda r: r["triggers"])
        lines.append(
            f"Airflow's own MetastoreBackend.aset took {peer['sets_per_s']:,.0f} writes/s (one "
            f"transaction each); local-first with {best['triggers']:,} triggers took "
            f"{best['sets_per_s'] / peer['sets_per_s']:,.0f}x that."
        )
    flush = next((r for r in result["rows"] if r["mode"] == "flush"), None)
    bulk = next((r for r in result["rows"] if r["mode"] == "central_bulk"), None)
    if flush and bulk and bulk["sets_per_s"]:
        lines.append(
            f"A flush of {flush['triggers']:,} dirty keys wrote {flush['sets_per_s']:,.0f} rows/s, "
            f"{flush['sets_per_s'] / bulk['sets_per_s']:.0%} of the raw bulk upsert "
            f"({bulk['note']})."
        )
    api = next((r for r in result["rows"] if r["mode"] == "flush_api"), None)
    if flush and api and api["sets_per_s"] and flush["sets_per_s"]:
        lines.append(
            f"Through sink = api (one request to localstate serve) the same flush wrote "
            f"{api['sets_per_s']:,.0f} rows/s, {api['sets_per_s'] / flush['sets_per_s']:.0%} "
            "of the sql sink's.")
    af = next((r for r in result["rows"] if r["mode"] == "flush_airflow"), None)
    if af and af["sets_per_s"]:
        lines.append(
            f"Through sink = airflow (a real airflow triggerer, conflict_policy max) a flush of "
            f"{af['triggers']:,} dirty keys took {af['seconds']:,.1f} s, "
            f"{af['sets_per_s']:,.1f} rows/s"
            + (f" ({af['sets_per_s'] / flush['sets_per_s']:.2%} of the sql sink's)"
               if flush and flush["sets_per_s"] else "")
            + f", with {af['central_txns']:,} PostgreSQL commits "
              f"({af['central_txns'] / af['triggers']:.1f} per key).")
    return "\n".join(lines)


def write_json(result: dict[str, Any], path: Path) -> None:
    path.write_text(json.dumps(result, indent=2, default=str))


def write_plot(result: dict[str, Any], path: Path) -> None:
    """Throughput and central transactions against K (matplotlib: the `plot` extra)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise SystemExit(
            "--plot needs matplotlib: pip install 'localstate[plot]'"
        ) from exc
    rows = [r for r in result["rows"] if r["scenario"] == "distinct"]
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(15, 4.2),
                                        gridspec_kw={"width_ratios": [3, 3, 2]})
    for i, mode in enumerate(sorted({r["mode"] for r in rows})):
        color = f"C{i}"  # one colour per mode in both panels
        pts = sorted(((r["triggers"], r) for r in rows if r["mode"] == mode),
                     key=lambda p: p[0])
        ks = [k for k, _ in pts]
        ax1.plot(ks, [r["sets_per_s"] for _, r in pts], marker="o", label=mode, color=color)
        if mode != "bare":
            ax2.plot(ks, [max(r["central_txns_per_s"], 1e-3) for _, r in pts], marker="o",
                     label=mode, color=color)
    for ax, title in ((ax1, "acknowledged sets/s"), (ax2, "central transactions/s")):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("triggers (K)")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    _sink_panel(ax3, result)
    fig.suptitle(f"localstate bench ({result['settings']['dialect']} central DB)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


#: the flush rows of each sink, in the order the panel shows them
SINK_ROWS = (("flush", "sql"), ("flush_api", "api"), ("flush_airflow", "airflow"))


def _sink_panel(ax: Any, result: dict[str, Any]) -> None:
    """Flush rows/s of every sink measured in the run, on a log scale (the sinks differ by
    orders of magnitude), each with its keys, time and commits; a sink not measured is named,
    empty."""
    by = {r["mode"]: r for r in result["rows"] if r["scenario"] == "baseline"}
    names = [name for _mode, name in SINK_ROWS]
    rates = [(by.get(mode) or {}).get("sets_per_s") or 0.0 for mode, _name in SINK_ROWS]
    # bars stand on 1 row/s: the log scale has no 0
    bars = ax.bar(names, rates, bottom=1.0,
                  color=[f"C{i}" for i in range(len(names))])
    for bar, (mode, _name), rate in zip(bars, SINK_ROWS, rates, strict=True):
        row = by.get(mode)
        if not rate or row is None:
            label, top = "not measured", 1.0
        else:
            label = (f"{rate:,.{0 if rate >= 100 else 1}f} rows/s\n{row['triggers']:,} keys "
                     f"in {row['seconds']:,.{2 if row['seconds'] < 10 else 0}f} s")
            if row["central_txns"]:
                label += f"\n{row['central_txns']:,} commit{'s' * (row['central_txns'] != 1)}"
            top = 1.0 + rate
        ax.annotate(label, (bar.get_x() + bar.get_width() / 2, top),
                    ha="center", va="bottom", fontsize=7)
    ax.set_yscale("log")
    ax.set_ylim(1.0, max(rates, default=1.0) * 30 or 10.0)  # room for the labels
    ax.set_title("one flush, rows/s, by sink (log)")
    ax.grid(True, axis="y", alpha=0.3)


def run(cfg: BenchConfig) -> dict[str, Any]:
    return asyncio.run(run_bench(cfg))

