"""Tests for the throwaway PostgreSQL server helper (real server, no mocks)."""

from __future__ import annotations

import os
import pathlib
import pwd
import socket
from collections.abc import Iterator

import asyncpg
import pytest

from localstate._testing import postgres_binaries
from localstate._testing.postgres_binaries import find_postgres_binaries
from localstate._testing.postgres_server import PostgresServer

pytestmark = pytest.mark.postgres

# What a query on a connection whose backend is gone (terminated or server stopped) raises.
CONNECTION_LOST = (asyncpg.PostgresConnectionError, asyncpg.InterfaceError, OSError)


@pytest.fixture(scope="module")
def shared_pg(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PostgresServer]:
    """One server for the whole module: initdb is the slow part (~1 s)."""
    with PostgresServer(tmp_path_factory.mktemp("pg")) as server:
        yield server


@pytest.fixture
def pg(shared_pg: PostgresServer) -> PostgresServer:
    """The shared server, running (a previous test may have stopped it)."""
    shared_pg.start()
    return shared_pg


async def _connect(dsn: str) -> asyncpg.Connection:
    return await asyncpg.connect(dsn, timeout=10)


async def test_select_one(pg: PostgresServer) -> None:
    conn = await _connect(pg.dsn)
    try:
        assert await conn.fetchval("SELECT 1") == 1
        assert await conn.fetchval("SELECT current_user") == pg.user
        assert await conn.fetchval("SELECT current_database()") == pg.dbname
        assert await conn.fetchval("SHOW server_encoding") == "UTF8"
        assert await conn.fetchval("SHOW max_connections") == "200"
        assert await conn.fetchval("SHOW fsync") == "off"
        preload = await conn.fetchval("SHOW shared_preload_libraries")
        assert ("pg_stat_statements" in preload) is pg.has_pg_stat_statements
    finally:
        await conn.close()


def test_urls(pg: PostgresServer) -> None:
    assert pg.host == "127.0.0.1"
    assert pg.is_running()
    assert pg.url == f"postgresql+asyncpg://{pg.user}@127.0.0.1:{pg.port}/{pg.dbname}"
    assert pg.dsn == f"postgresql://{pg.user}@127.0.0.1:{pg.port}/{pg.dbname}"
    assert pg.log_path == pg.base_dir / "postgres.log"
    assert "database system is ready to accept connections" in pg.log_path.read_text()


async def test_create_database_is_isolated(pg: PostgresServer) -> None:
    url = pg.create_database("iso_a")
    assert url == pg.url_for("iso_a")
    assert url.startswith("postgresql+asyncpg://")
    assert url.endswith(f":{pg.port}/iso_a")
    a = await _connect(pg.dsn_for("iso_a"))
    b = await _connect(pg.dsn_for(pg.create_database("iso_b").rsplit("/", 1)[1]))
    try:
        await a.execute("CREATE TABLE only_in_a (x int)")
        await a.execute("INSERT INTO only_in_a VALUES (1)")
        assert await a.fetchval("SELECT count(*) FROM only_in_a") == 1
        assert await b.fetchval("SELECT to_regclass('only_in_a')") is None
    finally:
        await a.close()
        await b.close()
    with pytest.raises(RuntimeError, match="already exists"):
        pg.create_database("iso_a")
    with pytest.raises(ValueError, match="invalid database name"):
        pg.create_database('bad"; DROP DATABASE postgres; --')
    pg.drop_database("iso_a")
    pg.drop_database("iso_a")  # missing is fine
    assert pg.create_database("iso_a") == url  # and it can be recreated


def test_a_database_can_order_text_as_a_language_does(pg: PostgresServer) -> None:
    """The cluster is C (byte-wise); `locale="en-US"` gives a database ordered as most real
    installations are: letters first, case only between otherwise equal names."""
    pg.create_database("order_c")
    assert pg.create_database("order_en", locale="en-US") == pg.url_for("order_en")
    probe = "SELECT 'a' < 'B', 'asset:294' < 'Asset/039', 'a' < 'A'"
    assert pg.psql(probe, dbname="order_c").strip() == "f|f|f"
    assert pg.psql(probe, dbname="order_en").strip() == "t|t|t"
    # the server's own collation still says byte-wise where asked to
    assert pg.psql("SELECT 'a' < 'B' COLLATE \"C\"", dbname="order_en").strip() == "f"
    with pytest.raises(ValueError, match="language tag"):
        pg.create_database("order_bad", locale="en_US.UTF-8' TEMPLATE template1 --")
    pg.drop_database("order_c")
    pg.drop_database("order_en")


async def test_terminate_backends_kills_open_connection(pg: PostgresServer) -> None:
    pg.create_database("term_other")
    victim = await _connect(pg.dsn)
    victim2 = await _connect(pg.dsn)
    bystander = await _connect(pg.dsn_for("term_other"))
    try:
        assert await victim.fetchval("SELECT 1") == 1
        assert pg.terminate_backends() == 2
        with pytest.raises(asyncpg.ConnectionDoesNotExistError, match="administrator command"):
            await victim.fetchval("SELECT 1")
        # asyncpg noticed victim2's EOF while awaiting victim: "connection is closed".
        with pytest.raises((asyncpg.ConnectionDoesNotExistError, asyncpg.InterfaceError)):
            await victim2.fetchval("SELECT 1")
        # Other databases are untouched; the default database takes new connections.
        assert await bystander.fetchval("SELECT 1") == 1
        fresh = await _connect(pg.dsn)
        try:
            assert await fresh.fetchval("SELECT 1") == 1
            assert pg.terminate_backends("term_other") == 1
            assert pg.terminate_backends("term_other") == 0
            assert await fresh.fetchval("SELECT 1") == 1
        finally:
            await fresh.close()
        with pytest.raises(CONNECTION_LOST):
            await bystander.fetchval("SELECT 1")
    finally:
        for conn in (victim, victim2, bystander):
            conn.terminate()


async def test_stop_makes_connections_fail(pg: PostgresServer) -> None:
    conn = await _connect(pg.dsn)
    try:
        pg.stop()
        assert not pg.is_running()
        pg.stop()  # idempotent
        pg.stop("immediate")
        with pytest.raises(CONNECTION_LOST):
            await conn.fetchval("SELECT 1")
        with pytest.raises(ConnectionRefusedError):  # nothing listens any more
            await _connect(pg.dsn)
    finally:
        conn.terminate()
    with pytest.raises(ValueError, match="stop mode"):
        pg.stop("sudden")


@pytest.mark.parametrize("mode", ["fast", "immediate"])
async def test_restart_same_port_during_write_loop(pg: PostgresServer, mode: str) -> None:
    port, dsn = pg.port, pg.dsn
    conn = await _connect(dsn)
    await conn.execute("DROP TABLE IF EXISTS writes; CREATE TABLE writes (i int PRIMARY KEY)")
    outcomes: list[bool] = []
    for i in range(6):
        if i == 2:
            pg.stop(mode)  # outage in the middle of the write loop
        if i == 4:
            pg.start()  # back, on the same port
        try:
            if conn.is_closed():
                conn = await _connect(dsn)
            await conn.execute("INSERT INTO writes VALUES ($1)", i)
            outcomes.append(True)
        except CONNECTION_LOST:
            outcomes.append(False)
    try:
        assert outcomes == [True, True, False, False, True, True]
        assert pg.port == port
        assert pg.dsn == dsn
        assert pg.is_running()
        rows = {r["i"] for r in await conn.fetch("SELECT i FROM writes")}
        # synchronous_commit=off: an immediate stop may lose the last commits.
        assert {4, 5} <= rows <= {0, 1, 4, 5}
        if mode == "fast":
            assert rows == {0, 1, 4, 5}
    finally:
        await conn.close()

    pg.restart(mode)
    assert pg.port == port
    assert pg.is_running()


async def test_own_server_lifecycle_and_cleanup(tmp_path: pathlib.Path) -> None:
    server = PostgresServer(tmp_path)
    assert not server.is_running()
    with pytest.raises(RuntimeError, match="call start"):
        _ = server.port
    server.stop()  # never started: a no-op
    with server:
        assert server.is_running()
        runtime_dir = server.runtime_dir
        conn = await _connect(server.dsn)
        assert await conn.fetchval("SELECT 1") == 1
        await conn.close()
        if os.geteuid() == 0:
            # PostgreSQL refuses root: the cluster lives in a postgres-owned temp dir.
            assert runtime_dir != tmp_path
            assert runtime_dir.name.startswith("localstate-pg-")
            assert runtime_dir.stat().st_uid == pwd.getpwnam("postgres").pw_uid
            assert (server.data_dir / "PG_VERSION").exists()
    assert not server.is_running()
    server.close()  # idempotent
    if runtime_dir != tmp_path:
        assert not runtime_dir.exists()
    assert server.log_path.is_file()
    assert not server.log_path.is_symlink()
    assert "shut down" in server.log_path.read_text()
    with pytest.raises(RuntimeError, match="closed"):
        server.start()


def test_start_failure_reports_log_tail(tmp_path: pathlib.Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        server = PostgresServer(tmp_path, port=busy.getsockname()[1])
        try:
            with pytest.raises(RuntimeError, match="could not bind") as excinfo:
                server.start()
            assert "postgres.log" in str(excinfo.value)
            assert not server.is_running()
        finally:
            server.close()


def test_missing_binaries_error_says_how_to_install(
    monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path
) -> None:
    assert find_postgres_binaries().initdb.is_file()
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(postgres_binaries, "_DEBIAN_ROOT", tmp_path / "no-postgresql")
    with pytest.raises(RuntimeError, match=r"apt-get install postgresql"):
        find_postgres_binaries()
