"""Central URLs: a wrong one is a `ConfigError` naming the setting and the way out, before any
connection is tried; the embedded default creates `$AIRFLOW_HOME` as Airflow does. On
PostgreSQL the transaction bound lives in each transaction, nothing in the session."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event, text

from localstate import ConfigError, StateStore
from localstate._sync.central.engine import async_url, make_engine, read_connection
from localstate._testing.postgres_server import PostgresServer


@pytest.mark.parametrize(("url", "says"), [
    ("mssql+pyodbc://sa:pw@db/airflow", "the 'mssql' dialect is not supported"),
    ("oracle://u@h/db", "supported: sqlite, postgresql, mysql"),
    ("postgresql+psycopg2://u@h/db", "use postgresql+asyncpg://"),
    ("mysql+mysqldb://airflow:pw@db/airflow", "use mysql+aiomysql://"),
    ("not a url", "is not a database URL"),
])
async def test_an_unusable_central_url_is_a_config_error(url: str, says: str, tmp_path: Path
                                                         ) -> None:
    with pytest.raises(ConfigError, match="central_url") as caught:
        await StateStore.open(cache_path=tmp_path / "c.db", central_url=url)
    assert says in str(caught.value)
    assert "pw" not in str(caught.value)  # the password is never shown


async def test_the_embedded_default_creates_a_missing_airflow_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    home = tmp_path / "does" / "not" / "exist"
    monkeypatch.setenv("AIRFLOW_HOME", str(home))
    async with StateStore(triggerer_id="t") as store:
        await store.set("o", "k", 1, durability="central")
        assert await store.get("o", "k") == 1
    assert (home / "localstate-central.db").is_file()


async def test_a_sqlite_file_in_a_missing_folder_names_the_folder(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    with pytest.raises(ConfigError, match=re.escape(f"the folder {missing} of the SQLite file")):
        await StateStore.open(cache_path=tmp_path / "c.db",
                              central_url=f"sqlite:///{missing / 'central.db'}")
    assert not missing.exists()


@pytest.mark.parametrize(("url", "full"), [
    ("sqlite:///x.db", "sqlite+aiosqlite:///x.db"),
    ("postgresql://u:pw@h:5/db", "postgresql+asyncpg://u:pw@h:5/db"),
    ("postgresql+asyncpg://u@h/db", "postgresql+asyncpg://u@h/db"),
    ("mysql://u:pw@h:5/db", "mysql+aiomysql://u:pw@h:5/db"),
    ("mysql+aiomysql://u@h/db", "mysql+aiomysql://u@h/db"),
])
def test_async_url_picks_the_async_driver(url: str, full: str) -> None:
    assert async_url(url) == full


async def test_postgres_bounds_are_set_in_each_transaction_and_left_out_of_the_session(
    pg_server: PostgresServer,
) -> None:
    """What a pooler in transaction mode can carry: the bound set by each transaction for
    itself (SET LOCAL), no session setting and no statement kept by name on the connection."""
    engine = make_engine(pg_server.url, transaction_timeout=2.5)
    shown = "SELECT current_setting('lock_timeout'), " \
        "current_setting('idle_in_transaction_session_timeout'), " \
        "current_setting('statement_timeout')"
    try:
        for _ in range(2):
            async with engine.begin() as conn:
                assert tuple((await conn.execute(text(shown))).one()) == ("2500ms", "2500ms",
                                                                          "7500ms")
        async with engine.connect() as conn:
            raw = (await conn.get_raw_connection()).driver_connection
            assert raw is not None
            await conn.rollback()
            # outside the store's transactions, the session has the server's defaults
            assert tuple(await raw.fetchrow(shown)) == ("0", "0", "0")
            assert await raw.fetchval("SELECT count(*) FROM pg_prepared_statements") == 0
    finally:
        await engine.dispose()


async def test_postgres_bounds_ride_on_the_begin_and_bound_reads_too(
    pg_server: PostgresServer,
) -> None:
    """The bound is sent in the same message as the transaction's BEGIN (no statement of its
    own reaches SQLAlchemy's cursor), in write and read transactions alike."""
    engine = make_engine(pg_server.url, transaction_timeout=1.5)
    sent: list[str] = []

    @event.listens_for(engine.sync_engine, "before_cursor_execute")
    def _sent(_conn: Any, _cursor: Any, statement: str, _params: Any, _context: Any,
              _many: bool) -> None:
        sent.append(statement)

    try:
        async with engine.begin() as conn:
            assert (await conn.execute(text("SHOW lock_timeout"))).scalar_one() == "1500ms"
        async with read_connection(engine) as conn:
            shown = (await conn.execute(text(
                "SELECT current_setting('idle_in_transaction_session_timeout')"))).scalar_one()
            assert shown == "1500ms"
        assert sent == ["SHOW lock_timeout",
                        "SELECT current_setting('idle_in_transaction_session_timeout')"]
    finally:
        await engine.dispose()


async def test_a_pooled_connection_the_server_dropped_is_replaced_on_checkout(
    pg_server: PostgresServer,
) -> None:
    """A server restart (here: every backend of the database terminated) costs no failed
    call: the connection's ping fails as it leaves the pool, and a new one is made. A
    connection that answers its ping is used again."""
    name = f"ping_{os.getpid()}_{time.monotonic_ns() % 10**9}"
    pg_server.create_database(name)
    engine = make_engine(pg_server.url_for(name))
    try:
        pids = []
        for _ in range(2):
            async with engine.connect() as conn:
                pids.append((await conn.execute(text("SELECT pg_backend_pid()"))).scalar_one())
        first = pids[0]
        assert pids == [first, first]
        assert pg_server.terminate_backends(name) >= 1
        async with engine.begin() as conn:
            second = (await conn.execute(text("SELECT pg_backend_pid()"))).scalar_one()
            assert (await conn.execute(text("SHOW lock_timeout"))).scalar_one() != "0"
        assert second != first
    finally:
        await engine.dispose()


async def test_the_central_url_can_turn_the_statement_caches_back_on(
    pg_server: PostgresServer,
) -> None:
    """Where no pooler is in between, ``?statement_cache_size=100&prepared_statement_cache_size
    =100`` keeps statements prepared by name on the connection (one round trip less each)."""
    engine = make_engine(f"{pg_server.url}?statement_cache_size=100"
                         "&prepared_statement_cache_size=100")
    try:
        async with engine.begin() as conn:
            await conn.execute(text("SELECT 1"))
            named = (await conn.execute(text(
                "SELECT count(*) FROM pg_prepared_statements"))).scalar_one()
        assert named >= 1
    finally:
        await engine.dispose()
    with pytest.raises(ConfigError, match="statement_cache_size='lots'"):
        make_engine(f"{pg_server.url}?statement_cache_size=lots")
