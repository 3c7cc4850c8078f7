"""Shared fixtures: real PostgreSQL and MySQL-family (MariaDB) servers for the session, real
SQLite files per test.

Every central test takes `central_url`, parametrized over the three backends, so each runs on
the embedded SQLite default, on PostgreSQL and on MySQL without being written three times.
Tests marked `@collations` run on a fourth: a PostgreSQL database that orders text as en-US
(ICU) does.
"""

from __future__ import annotations

import itertools
import os
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from fault_tally import FaultTally

from localstate import StateStore
from localstate._testing.mysql_server import MysqlServer
from localstate._testing.postgres_server import PostgresServer

BACKENDS = ["sqlite", "postgresql", "mysql"]
#: PostgreSQL databases by the locale they order text in: None is the cluster's C (byte-wise)
PG_LOCALES: dict[str, str | None] = {"postgresql": None, "postgresql-en-US": "en-US"}
#: the backends of a test whose result hangs on how the database orders text (listings,
#: cursors, prefix filters): PostgreSQL also on a database that orders as real installations
#: do (ICU en-US: 'a' < 'B', punctuation weighed last); apply with `@collations`
COLLATION_BACKENDS = [*BACKENDS, "postgresql-en-US"]
collations = pytest.mark.parametrize("backend", COLLATION_BACKENDS, indirect=True)
_db_names = itertools.count(1)


def pytest_configure(config: pytest.Config) -> None:
    # The Airflow tests import Airflow at collection, before any test's isolated home exists,
    # and Airflow creates folders in $AIRFLOW_HOME when imported: give it a throwaway one.
    os.environ["AIRFLOW_HOME"] = tempfile.mkdtemp(prefix="localstate-tests-airflow-home-")


@pytest.fixture(autouse=True)
def _isolated_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No test reads the developer's airflow.cfg or AIRFLOW__LOCALSTATE__* variables."""
    for name in list(os.environ):
        if name.startswith("AIRFLOW__LOCALSTATE__") or name == "AIRFLOW_CONFIG":
            monkeypatch.delenv(name)
    home = tmp_path / "airflow-home"
    home.mkdir()
    monkeypatch.setenv("AIRFLOW_HOME", str(home))


@pytest.fixture(scope="session")
def pg_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PostgresServer]:
    server = PostgresServer(tmp_path_factory.mktemp("postgres"))
    server.start()
    yield server
    server.close()


@pytest.fixture(scope="session")
def mysql_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MysqlServer]:
    server = MysqlServer(tmp_path_factory.mktemp("mysql"))
    server.start()
    yield server
    server.close()


@pytest.fixture(scope="module")
def private_pg(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PostgresServer]:
    """A PostgreSQL server of the test module's own, for tests that stop and start it."""
    server = PostgresServer(tmp_path_factory.mktemp("private-postgres"))
    server.start()
    yield server
    server.close()


@pytest.fixture(params=["postgresql", "mysql"])
def db_server(request: pytest.FixtureRequest) -> PostgresServer | MysqlServer:
    """A server the suite owns, for the tests that stop, restart or cut it (each backend)."""
    server: PostgresServer | MysqlServer = request.getfixturevalue(
        "mysql_server" if request.param == "mysql" else "pg_server")
    return server


def sqlite_url(path: Path) -> str:
    return f"sqlite:///{path}"


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def central_url(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """A fresh, empty central database on the backend under test."""
    if backend == "sqlite":
        return sqlite_url(tmp_path / "central.db")
    name = f"central_{os.getpid()}_{next(_db_names)}"
    if backend == "mysql":
        my: MysqlServer = request.getfixturevalue("mysql_server")
        my.ensure_running()
        return my.create_database(name)
    pg: PostgresServer = request.getfixturevalue("pg_server")
    return pg.create_database(name, locale=PG_LOCALES[backend])


StoreFactory = Callable[..., Awaitable[StateStore]]


def value_id(value: object) -> str:
    """A test id for a parametrized value, the same in every process (pytest-xdist workers
    must collect identical ids; a bare object()'s repr holds its address)."""
    return "object()" if type(value) is object else repr(value)


@pytest_asyncio.fixture
async def open_store(central_url: str, tmp_path: Path) -> AsyncIterator[StoreFactory]:
    """Open stores on the test's central DB, each with its own cache file; all closed after."""
    opened: list[StateStore] = []
    ids = itertools.count(1)

    async def factory(**options: Any) -> StateStore:
        n = next(ids)
        options.setdefault("triggerer_id", f"triggerer-{n}")
        options.setdefault("cache_path", tmp_path / f"cache-{options['triggerer_id']}.db")
        options.setdefault("central_url", central_url)
        options.setdefault("flush_interval", 60.0)  # tests flush explicitly unless they say
        store = await StateStore.open(**options)
        opened.append(store)
        return store

    yield factory
    for store in opened:
        await store.close()


_FAULT_TALLY = FaultTally()


@pytest.fixture(scope="session")
def fault_tally() -> FaultTally:
    """What the fault-injection scenarios tried and found lost, printed after the run."""
    return _FAULT_TALLY


def pytest_sessionfinish(session: pytest.Session) -> None:
    # under pytest-xdist each worker has its own tally: it travels to the controller with the
    # worker's output, and the controller prints the sum
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput["fault_tally"] = _FAULT_TALLY.as_dict()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    data = getattr(node, "workeroutput", {}).get("fault_tally")
    if data:
        _FAULT_TALLY.merge(data)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    lines = _FAULT_TALLY.lines()
    if lines:
        terminalreporter.section("fault-injection summary")
        for line in lines:
            terminalreporter.write_line(line)

