"""The cost of a central connection that a pooler in transaction mode can share, in one run:
a flush of many keys (one large transaction) and a claim storm (many small ones).

    python benches/bench_pooler.py                # starts a throwaway PostgreSQL and PgBouncer
    python benches/bench_pooler.py --keys 10000 --rounds 9

First the round trips each way makes (a counting TCP proxy in front of PostgreSQL or
PgBouncer): per claim (`StateStore.claim`: the claim's transaction and the read of the owner's
keys after it), per read of one owner's keys (`StateStore.load`), per flush of one key. Then
the flush of `--keys` dirty keys (each flush after every key was set again, as
`benches/bench_flush.py` measures it), then `CLAIMS` claims at once (a takeover), each way,
their rounds interleaved so that the machine's drift hits each the same:

* ``session`` (the baseline: the engine as it was): the transaction bounds sent as startup
  parameters, once per connection, and asyncpg's and SQLAlchemy's prepared statement caches on
  (named statements, prepared once per connection), straight to PostgreSQL;
* ``now, statement caches on by URL``: the engine as it is now with the central URL turning
  the statement caches back on (``?statement_cache_size=100&prepared_statement_cache_size=100``,
  for a direct connection: it cannot run behind PgBouncer before 1.21);
* ``pooler-safe direct``: the engine as it is now (bounds set per transaction, in the round
  trip of its BEGIN; statements prepared unnamed in their transaction; a one-round-trip ping
  of a pooled connection), straight to PostgreSQL;
* ``pooler-safe via PgBouncer``: the same engine through PgBouncer in transaction mode (the
  official Airflow Helm chart's settings); the session engine cannot run there at all;
* ``first pooler-safe direct`` and ``first pooler-safe via PgBouncer``: the first pooler-safe
  engine (the bounds a statement of their own after BEGIN, SQLAlchemy's pre-ping: BEGIN, an
  unnamed ``;`` prepared and run, ROLLBACK), the "before" of this change.

The ``session`` and ``first pooler-safe`` ways claim as before too (`claims_as_built`): a
transaction per claim, its history row a statement of its own. The others make the claims
waiting for a claim slot together, in one statement.

One store per way, open for the whole run; each round flushes every store once and claims
through it. Prints the median and the fastest of each and the median over the rounds of its
ratio to the same round's session figure (drift between rounds, large on a shared machine,
cancels out of those ratios).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

import localstate._sync.central.central_store as central_store_module
from localstate import StateStore
from localstate._bench.report import machine_info
from localstate._sync.central.engine import (
    DEFAULT_TRANSACTION_TIMEOUT,
    _postgres_bounds_sql,
    async_url,
    make_engine,
)
from localstate._testing.db_server import HOST, free_port

CACHES_ON = "statement_cache_size=100&prepared_statement_cache_size=100"
#: owners claimed at once per round: a takeover of that many triggers (a claim storm)
CLAIMS = 300


def session_engine(url: str, *,
                   transaction_timeout: float | None = DEFAULT_TRANSACTION_TIMEOUT
                   ) -> AsyncEngine:
    """The PostgreSQL engine as it was before it became pooler-safe: the baseline."""
    ms = str(max(1, round((transaction_timeout or 0) * 1000)))
    settings = {} if transaction_timeout is None else {
        "idle_in_transaction_session_timeout": ms, "lock_timeout": ms,
        "statement_timeout": str(3 * int(ms))}
    return create_async_engine(async_url(url), pool_pre_ping=True, pool_size=5, max_overflow=5,
                               pool_timeout=transaction_timeout or 60.0,
                               connect_args={"server_settings": settings})


def first_pooler_safe_engine(url: str, *,
                             transaction_timeout: float | None = DEFAULT_TRANSACTION_TIMEOUT
                             ) -> AsyncEngine:
    """The first pooler-safe PostgreSQL engine: the bounds sent as a statement of their own
    (prepared unnamed, then run: two round trips) after each BEGIN, and SQLAlchemy's pre-ping
    (BEGIN, ``;`` prepared and run, ROLLBACK) on each checkout."""
    engine = create_async_engine(
        async_url(url), pool_pre_ping=True, pool_size=5, max_overflow=5,
        pool_timeout=transaction_timeout or 60.0,
        connect_args={"statement_cache_size": 0, "prepared_statement_cache_size": 0})
    if transaction_timeout is not None:
        statement = _postgres_bounds_sql(max(1, round(transaction_timeout * 1000)))

        @event.listens_for(engine.sync_engine, "begin")
        def _on_begin(conn: Any) -> None:
            conn.exec_driver_sql(statement)

    return engine


@contextlib.contextmanager
def claims_as_built(way: str) -> Iterator[None]:
    """The claims of the ``session`` and ``first pooler-safe`` ways as they were: one
    transaction per claim, the history row a statement of its own after the claim's (on the
    other ways, waiting claims are made together, their history rows in the same statement).
    """
    if not (way == "session" or way.startswith("first ")):
        yield
        return
    saved = {name: central_store_module.__dict__[name]
             for name in ("claim_with_history", "claim_many")}
    for name in saved:
        setattr(central_store_module, name, lambda *_args: None)
    try:
        yield
    finally:
        for name, function in saved.items():
            setattr(central_store_module, name, function)


class RoundTripCounter:
    """A TCP proxy in front of `target` (host, port) that counts round trips: each time a
    client sends after it last received (or first sends), on any of its connections."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.port = free_port()
        self.trips = 0
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> RoundTripCounter:
        self._server = await asyncio.start_server(self._serve, HOST, self.port)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        assert self._server is not None
        self._server.close()

    def url(self, url: str) -> str:
        """`url` with this proxy in place of its host and port."""
        return make_url(url).set(host=HOST, port=self.port).render_as_string(
            hide_password=False)

    async def _serve(self, client_r: asyncio.StreamReader,
                     client_w: asyncio.StreamWriter) -> None:
        server_r, server_w = await asyncio.open_connection(*self.target)
        last = ["server"]

        async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                       side: str) -> None:
            try:
                while data := await reader.read(65536):
                    if side == "client" and last[0] == "server":
                        self.trips += 1
                    last[0] = side
                    writer.write(data)
                    await writer.drain()
            except OSError:
                pass
            finally:
                writer.close()

        await asyncio.gather(pipe(client_r, server_w, "client"),
                             pipe(server_r, client_w, "server"))


async def count_round_trips(url: str, folder: Path, name: str,
                            engine_factory: Callable[..., AsyncEngine], n: int = 20
                            ) -> dict[str, float]:
    """Round trips per claim, per read of one owner and per flush of one key, through a
    `RoundTripCounter` in front of `url`'s server (each the mean of `n`, sequential)."""
    parsed = make_url(url)
    async with RoundTripCounter((parsed.host or HOST, parsed.port or 5432)) as counter:
        store, _owners = await open_store(counter.url(url), folder, 1, name, engine_factory)
        try:
            await store.claim(f"bench:rt:{name}:warm")
            out: dict[str, float] = {}
            for what in ("claim", "read", "flush"):
                counter.trips = 0
                for i in range(n):
                    owner = f"bench:rt:{name}:{i}"
                    if what == "claim":
                        await store.claim(owner)
                    elif what == "read":
                        await store.load(owner)
                    else:
                        await store.set(owner, "watermark", i, durability="memory")
                        await store.flush()
                out[what] = counter.trips / n
            return out
        finally:
            await store.close()


async def open_store(url: str, folder: Path, keys: int, name: str,
                     engine_factory: Callable[..., AsyncEngine]) -> tuple[StateStore, list[str]]:
    """A store whose central DB engine `engine_factory` makes, its `keys` owners written and
    flushed once (so every measured flush rewrites rows the central DB holds)."""
    original = central_store_module.__dict__["make_engine"]
    setattr(central_store_module, "make_engine", engine_factory)  # noqa: B010
    try:
        store = await StateStore.open(cache_path=folder / f"{name}.db", central_url=url,
                                      triggerer_id=name, flush_interval=3600.0,
                                      max_batch=keys)
    finally:
        setattr(central_store_module, "make_engine", original)  # noqa: B010
    store.entry_table.kick_at = keys + 1  # no max_batch kick while the keys are dirtied
    owners = [f"bench:pooler:{name}:{i}" for i in range(keys)]
    for start in range(0, keys, 5000):
        await asyncio.gather(*(store.set(o, "watermark", 0, durability="memory")
                               for o in owners[start:start + 5000]))
    await store.flush()
    return store, owners


async def timed_flush(store: StateStore, owners: list[str], round_no: int) -> float:
    """Seconds of one flush of every owner, each set again first (outside the timing)."""
    for i, owner in enumerate(owners):
        await store.set(owner, "watermark", round_no * len(owners) + i + 1,
                        durability="memory")
    await store.sync_local()
    started = time.perf_counter()
    report = await store.flush()
    seconds = time.perf_counter() - started
    assert report.written == len(owners), report
    return seconds


async def timed_claims(store: StateStore, round_no: int) -> float:
    """Seconds of `CLAIMS` claims at once (a takeover), new owners each round."""
    started = time.perf_counter()
    await asyncio.gather(*(store.claim(f"bench:claim:{store.triggerer_id}:{round_no}:{i}")
                           for i in range(CLAIMS)))
    return time.perf_counter() - started


async def run(direct: str, pooled: str, folder: Path, keys: int, rounds: int
              ) -> dict[str, Any]:
    ways: dict[str, tuple[str, Callable[..., AsyncEngine]]] = {
        "session": (direct, session_engine),
        "now, statement caches on by URL": (f"{direct}?{CACHES_ON}", make_engine),
        "first pooler-safe direct": (direct, first_pooler_safe_engine),
        "first pooler-safe via PgBouncer": (pooled, first_pooler_safe_engine),
        "pooler-safe direct": (direct, make_engine),
        "pooler-safe via PgBouncer": (pooled, make_engine),
    }
    names = list(ways)
    round_trips = {}
    for i, (name, (url, factory)) in enumerate(ways.items()):
        with claims_as_built(name):
            round_trips[name] = await count_round_trips(url, folder, f"rt{i}", factory)
        print(f"round trips {name:<32} " + ", ".join(
            f"{what} {n:.2f}" for what, n in round_trips[name].items()), flush=True)
    stores = {name: await open_store(url, folder, keys, f"way{i}", factory)
              for i, (name, (url, factory)) in enumerate(ways.items())}
    times: dict[str, list[float]] = {name: [] for name in ways}
    claims: dict[str, list[float]] = {name: [] for name in ways}
    try:
        for r in range(1, rounds + 1):
            # each round starts with the next way: no way always runs right after another
            for name in names[r % len(names):] + names[:r % len(names)]:
                times[name].append(await timed_flush(*stores[name], r))
                with claims_as_built(name):
                    claims[name].append(await timed_claims(stores[name][0], r))
            print(f"round {r}/{rounds}: " + ", ".join(
                f"{name} {t[-1] * 1000:.1f} ms / {claims[name][-1] * 1000:.0f} ms"
                for name, t in times.items()), flush=True)
    finally:
        for store, _owners in stores.values():
            await store.close()
    result: dict[str, Any] = {"machine": machine_info(), "keys": keys, "claims": CLAIMS,
                              "rounds": rounds}
    for name in ways:
        result[name] = {"round_trips": round_trips[name]}
        for what, t in (("flush", times[name]), ("claims", claims[name])):
            # each round's figure against the same round's session figure: drift between
            # rounds cancels out; the median of those ratios is the figure
            base = (times if what == "flush" else claims)["session"]
            paired = statistics.median(x / b for x, b in zip(t, base, strict=True))
            result[name][what] = {"median_s": statistics.median(t), "min_s": min(t),
                                  "x_session": paired, "all_s": t}
            print(f"{what:<6} {name:<32} median {statistics.median(t) * 1000:7.1f} ms, "
                  f"fastest {min(t) * 1000:7.1f} ms; {paired:5.3f}x the session engine "
                  "(median of the rounds' ratios)", flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=21,
                        help="flushes per way, interleaved; the median is printed")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    from localstate._testing.pgbouncer import PgBouncer
    from localstate._testing.postgres_server import PostgresServer

    with tempfile.TemporaryDirectory(prefix="ls-pooler-") as tmp:
        folder = Path(tmp)
        with PostgresServer(folder / "pg") as pg, PgBouncer(pg) as bouncer:
            direct = pg.url
            pooled = bouncer.url_for(make_url(direct).database or pg.dbname)
            result = asyncio.run(run(direct, pooled, folder, args.keys, args.rounds))
            result["pgbouncer"] = bouncer.show("VERSION")[0]["version"]
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
