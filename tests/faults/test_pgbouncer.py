"""Everything that reaches the central DB, through PgBouncer in transaction mode.

A real PgBouncer (Debian's, `localstate._testing.pgbouncer`) set up as the official Airflow
Helm chart sets it up (``pool_mode = transaction``, ``ignore_startup_parameters =
extra_float_digits``, clients from an ``auth_file``, 10 server connections) in front of the
suite's PostgreSQL. Each test's database is reached through it only (read back directly, to
check what the pooler let through):

* many clients' transactions interleaved over two server connections: no named statement
  looked for on the wrong one, each transaction with its bound;
* ``localstate db upgrade``;
* a ``sink = sql`` fleet of three writer processes (claims, sets, flushes, their stores
  closed): every acknowledged value central;
* compare-and-set, ``emit`` and claims from one store, a second store's stale CAS refused;
* ``localstate serve`` over it: REST writes, and a ``sink = api`` store's flush through it;
* localstate's plugin inside a real ``airflow api-server`` whose ``sql_alchemy_conn`` is
  PgBouncer's: a triggerer's ``sink = api`` flush lands in the central DB;
* the frozen-zombie takeover (`test_frozen_flush.frozen_flush_schedule`): a writer stopped
  inside its flush transaction stalls no claim beyond ``central_transaction_timeout`` + 5 s.

Each test also checks that PgBouncer pooled its transactions (its ``SHOW STATS``): the pooler
was in the path, not beside it.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from airflow_api_server import api_server, migrate, new_airflow, triggerer_token
from api_server import RW_TOKEN, ServeProcess
from fault_tally import FaultTally
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine
from test_claim_failover import start
from test_frozen_flush import frozen_flush_schedule

from localstate import StateStore
from localstate._sync.central.central_store import CentralStore
from localstate._sync.central.engine import make_engine
from localstate._testing.pgbouncer import PgBouncer
from localstate._testing.postgres_server import PostgresServer
from localstate.errors import VersionConflict

pytestmark = pytest.mark.postgres

LOCALSTATE = Path(sys.executable).parent / "localstate"
TRIGGERER = "triggerer-a"


@pytest.fixture(scope="module")
def bouncer(pg_server: PostgresServer) -> Iterator[PgBouncer]:
    with PgBouncer(pg_server) as pgbouncer:
        yield pgbouncer


def new_database(pg: PostgresServer, prefix: str) -> str:
    """A fresh database's name."""
    name = f"{prefix}_{os.getpid()}_{time.monotonic_ns() % 10**9}"
    pg.create_database(name)
    return name


def upgrade(url: str) -> None:
    done = subprocess.run([str(LOCALSTATE), "db", "upgrade", "--central-url", url],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


async def central_values(url: str, keys: list[tuple[str, str]]) -> dict[tuple[str, str], Any]:
    """The central values of `keys`, read straight from PostgreSQL."""
    central = await CentralStore.open(url, upgrade_schema=False)
    try:
        rows = await central.read_many(keys)
    finally:
        await central.close()
    return {k: json.loads(r.data or "null") for k, r in rows.items()}


@pytest.fixture
def database(pg_server: PostgresServer, bouncer: PgBouncer, request: pytest.FixtureRequest
             ) -> tuple[str, str]:
    """(the URL through PgBouncer, the direct URL) of a fresh database, upgraded through
    PgBouncer."""
    name = new_database(pg_server, request.node.name[5:25])
    pooled = bouncer.url_for(name)
    upgrade(pooled)
    return pooled, pg_server.url_for(name)


async def test_many_clients_share_two_server_connections_without_a_statement_lost(
    pg_server: PostgresServer,
) -> None:
    """Transactions of 3 engines (up to 30 client connections) interleaved over 2 server
    connections: a statement prepared by name on one server connection and looked for on
    another would fail ("prepared statement ... does not exist"); none does, and each
    transaction runs with its bound."""
    with PgBouncer(pg_server, pool_size=2) as small:
        engines = [make_engine(small.url_for(pg_server.dbname), transaction_timeout=3)
                   for _ in range(3)]

        async def work(engine: AsyncEngine, n: int) -> list[tuple[int, str]]:
            seen = []
            for i in range(15):
                async with engine.begin() as conn:
                    total = (await conn.execute(text("SELECT CAST(:a AS int) + :b"),
                                                {"a": n, "b": i})).scalar_one()
                    bound = (await conn.execute(text("SHOW lock_timeout"))).scalar_one()
                    seen.append((int(total), str(bound)))
            return seen

        try:
            results = await asyncio.gather(*(work(e, n) for n in range(10) for e in engines))
        finally:
            for engine in engines:
                await engine.dispose()
        assert small.transactions(pg_server.dbname) >= 30 * 15
    assert results == [[(n + i, "3s") for i in range(15)] for n in range(10) for _ in engines]


async def test_db_upgrade_through_pgbouncer_makes_the_schema_current(
    pg_server: PostgresServer, bouncer: PgBouncer,
) -> None:
    name = new_database(pg_server, "upgrade")
    upgrade(bouncer.url_for(name))
    assert bouncer.transactions(name) > 0
    central = await CentralStore.open(pg_server.url_for(name), upgrade_schema=False)
    await central.close()  # SchemaError unless the schema is current


async def test_a_sink_sql_fleet_of_three_writers_through_pgbouncer(
    database: tuple[str, str], bouncer: PgBouncer, tmp_path: Path,
) -> None:
    pooled, direct = database
    owners = {f"w{w}": [f"fleet:w{w}:{i:02d}" for i in range(40)] for w in range(3)}
    writers = [await start(name, pooled, tmp_path) for name in owners]
    try:
        for (name, mine), (w, _reader) in zip(owners.items(), writers, strict=True):
            claims = json.loads(await w.call(claim_many=mine))
            assert all(isinstance(epoch, int) for _o, _s, epoch in claims), (name, claims[:3])
        for value in (1, 2, 3):
            answers = await asyncio.gather(*(
                w.send(write=o, key="watermark", value=value)
                for (w, _r), mine in zip(writers, owners.values(), strict=True) for o in mine))
            assert all(a.startswith("ok") for a in answers), answers[:3]
            if value < 3:  # the last round is flushed by the stores' close
                flushed = await asyncio.gather(*(w.call(flush=True) for w, _r in writers))
                assert all(f.split() == ["0", "0"] for f in flushed), flushed
        for w, _reader in writers:
            w.send(quit=True)
        for w, reader in writers:
            assert await asyncio.wait_for(w.proc.wait(), 60) == 0, w.name
            await reader
    finally:
        for w, _reader in writers:
            if w.proc.returncode is None:
                w.proc.kill()
                await w.proc.wait()
    keys = [(o, "watermark") for mine in owners.values() for o in mine]
    central = await central_values(direct, keys)
    assert central == dict.fromkeys(keys, 3)
    assert bouncer.transactions(direct.rsplit("/", 1)[1]) > 0


async def test_cas_emit_and_claims_through_pgbouncer(
    database: tuple[str, str], tmp_path: Path,
) -> None:
    pooled, direct = database
    # the central compare-and-set (the CLI's and REST's --expected-version): two writers on
    # the same version, each on its own pooled connection, one wins
    first = await CentralStore.open(pooled, upgrade_schema=False)
    second = await CentralStore.open(pooled, upgrade_schema=False)
    try:
        await first.write_if_version("cas:x", "n", "1", 0, updated_by="a")
        results = await asyncio.gather(
            first.write_if_version("cas:x", "n", "2", 1, updated_by="a"),
            second.write_if_version("cas:x", "n", "3", 1, updated_by="b"),
            return_exceptions=True)
    finally:
        await first.close()
        await second.close()
    assert sum(isinstance(r, VersionConflict) for r in results) == 1, results
    winners = [r for r in results if not isinstance(r, BaseException)]
    assert len(winners) == 1, results
    winner = winners[0]
    # emit and claims from a store, a takeover by a second one
    async with StateStore(central_url=pooled, cache_path=tmp_path / "a.db",
                          triggerer_id="pooler-a") as store:
        assert await store.claim("events:x") == 1
        assert await store.compare_and_set("local:x", "n", 1, expected_version=0) == 1
        for i in range(1, 6):
            await store.emit("events:x", {"item": i}, watermark=i)
        report = await store.flush()
        assert report.events == 5, report
        async with StateStore(central_url=pooled, cache_path=tmp_path / "b.db",
                              triggerer_id="pooler-b") as other:
            assert await other.claim("events:x") == 2
            await other.emit("events:x", {"item": 6}, watermark=6)
            assert (await other.flush()).events == 1
    central = await central_values(direct, [("cas:x", "n"), ("events:x", "watermark"),
                                            ("local:x", "n")])
    assert central == {("cas:x", "n"): json.loads(str(winner.data)),
                       ("events:x", "watermark"): 6, ("local:x", "n"): 1}


async def test_serve_through_pgbouncer_takes_rest_writes_and_an_api_sink_flush(
    database: tuple[str, str], tmp_path: Path,
) -> None:
    pooled, direct = database
    server = ServeProcess(pooled, store_id="pooler-serve")
    await asyncio.to_thread(server.start)
    try:
        headers = {"Authorization": f"Bearer {RW_TOKEN}"}
        async with httpx.AsyncClient(base_url=server.url, headers=headers, timeout=60) as http:
            for i in range(20):
                r = await http.put(f"/api/v1/state/rest:{i:02d}/watermark", json={"value": i})
                assert r.status_code in (200, 201), r.text
        owners = [f"api:{i:03d}" for i in range(300)]
        async with StateStore(cache_path=tmp_path / "api.db", triggerer_id="pooler-api",
                              sink="api", api_url=server.url, api_token=RW_TOKEN,
                              flush_interval=3600) as store:
            for i, owner in enumerate(owners):
                await store.set(owner, "watermark", i)
            report = await store.flush()
            assert report.written == len(owners), report
    finally:
        await asyncio.to_thread(server.stop)
    rest = await central_values(direct, [(f"rest:{i:02d}", "watermark") for i in range(20)])
    assert rest == {(f"rest:{i:02d}", "watermark"): i for i in range(20)}
    api = await central_values(direct, [(o, "watermark") for o in owners])
    assert api == {(o, "watermark"): i for i, o in enumerate(owners)}


async def test_a_writer_frozen_in_its_flush_behind_pgbouncer_stalls_no_takeover(
    database: tuple[str, str], pg_server: PostgresServer, bouncer: PgBouncer, tmp_path: Path,
    fault_tally: FaultTally,
) -> None:
    """The zombie's transaction holds a PgBouncer server connection and its row locks; the
    server ends it after the bound (set per transaction), and the survivor's claims, queued
    behind it in PgBouncer's pool, all commit within the bound + 5 s."""
    pooled, _direct = database
    await frozen_flush_schedule(pg_server, "sql", pooled, {}, tmp_path, fault_tally)
    assert bouncer.transactions(pooled.rsplit("/", 1)[1]) > 0


async def test_the_plugin_in_an_airflow_api_server_behind_pgbouncer(
    pg_server: PostgresServer, bouncer: PgBouncer, tmp_path: Path,
) -> None:
    """``sql_alchemy_conn`` is PgBouncer's, as the chart sets it with its PgBouncer on: the
    plugin's store inside ``airflow api-server`` reaches the central DB through it, and a
    triggerer's ``sink = api`` flush lands there."""
    deployment = new_airflow(pg_server, tmp_path)
    migrate(deployment)  # straight to PostgreSQL: Airflow's migration takes a session lock
    name = deployment.airflow_dsn.rsplit("/", 1)[1]
    before = bouncer.transactions(name)
    deployment.env.update({
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": bouncer.dsn_for(name).replace(
            "postgresql://", "postgresql+psycopg://", 1),
        # psycopg 3 names a statement it has run five times; PgBouncer before 1.21 cannot
        # follow named statements across transactions (psycopg2, the chart image's, never
        # prepares): Airflow's own sessions then prepare nothing
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONNECT_ARGS": "psycopg_pooler_args.CONNECT_ARGS",
        "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1] / "support"),
                                       deployment.env["PYTHONPATH"]]),
    })
    owners = [f"asset_watcher:pooled-{i:03d}" for i in range(100)]
    with api_server(deployment) as api:
        async with StateStore(cache_path=tmp_path / "triggerer.db", triggerer_id=TRIGGERER,
                              sink="api", api_url=f"{api.url}/localstate",
                              api_token=triggerer_token(TRIGGERER),
                              flush_interval=3600) as store:
            for i, owner in enumerate(owners):
                await store.set(owner, "watermark", i)
            report = await store.flush()
            assert report.written == len(owners), report
    central = await central_values(pg_server.url_for(name), [(o, "watermark") for o in owners])
    assert central == {(o, "watermark"): i for i, o in enumerate(owners)}
    assert bouncer.transactions(name) > before
