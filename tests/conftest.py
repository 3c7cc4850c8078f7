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


#: The suite's longest tests and modules (nodeid prefixes), longest first, with their seconds
#: in a whole-suite run on two workers (a loaded machine; CI's are about two thirds). They are
#: dealt out first, so that the last minutes of a run are short tests that spread over both
#: workers, not one long test with the other worker idle. The rest keep their order.
LONGEST_FIRST = [
    "tests/test_airflow_events_chaos.py",  # 232-508 s
    "tests/test_wheel.py",  # 90-170 (both tests share one build)
    "tests/test_docs_install.py",  # 36-335 each: the docs' installs, the two with Airflow 280-335
    "tests/test_cli_bench.py::test_bench_flushes_through_sink_airflow_in_a_real_triggerer",  # 96
    "tests/test_airflow_plugin.py",  # 105 (one Airflow deployment for the module)
    "tests/test_upgrade.py::test_sigkill_rounds_then_upgrade_lose_no_acknowledged_write",  # 100
    "tests/test_airflow_graceful_stop.py",  # 88
    "tests/test_airflow_api_e2e.py",  # 78 (one Airflow deployment for the module)
    "tests/test_outage_logs.py",  # 68 (a 60 s outage)
    "tests/faults/test_soak.py",  # 62
    "tests/test_cli_bench.py::test_the_quick_start_runs_on_the_base_install_alone",  # 62
    "tests/test_deploy_guide.py",  # 53
    "tests/test_airflow_e2e.py",  # 48
    "tests/test_asset_events.py",  # 30 (one Airflow deployment for the module)
    "tests/faults/test_frozen_flush.py",  # 17-37 each
    "tests/faults/test_linearizable.py",  # 11-27 each
    "tests/test_cli_bench.py",  # 24-26 each
    "tests/faults/test_hostile_cli.py",  # 26
    "tests/test_sync_worker.py::test_the_watermark_never_goes_backwards_under_a_random_failover",
    "tests/faults/test_power_loss.py",  # 17-23 each
    "tests/faults/test_toggle_outage.py",  # 17-23 each
    "tests/test_imports.py::test_every_module_imports_first_in_a_fresh_interpreter",  # 22
    "tests/faults/test_hostile_rest.py",  # 21
    "tests/test_cli.py",  # 1-18 each, 271 in all
    "tests/test_cli_api.py",  # 7-18 each
    "tests/test_upgrade.py",  # 15 each
    "tests/faults/test_api_outage.py",  # 12-16 each
    "tests/faults/test_hostile_input.py",  # 15
    "tests/faults/test_process_crash.py",  # 9-14 each
    "tests/test_ui_browser.py",  # 3-11 each
]
#: Modules whose tests share a module-scoped fixture (an Airflow deployment, a server of
#: their own, a built wheel): each runs whole on one worker, so that fixture is set up once.
#: Every other test is handed out on its own, to whichever worker is free.
ONE_WORKER_MODULES = frozenset({
    "tests/faults/test_central_hang.py",
    "tests/faults/test_pgbouncer.py",
    "tests/faults/test_power_loss.py",
    "tests/faults/test_restart_while_down.py",
    "tests/test_airflow_api_e2e.py",
    "tests/test_airflow_plugin.py",
    "tests/test_airflow_queues_kafka.py",
    "tests/test_airflow_queues_redis.py",
    "tests/test_airflow_queues_sqs.py",
    "tests/test_airflow_trigger.py",
    "tests/test_asset_events.py",
    "tests/test_driver_errors_mysql.py",
    "tests/test_postgres_server.py",
    "tests/test_wheel.py",
})


def _rank(nodeid: str) -> int:
    return next((n for n, prefix in enumerate(LONGEST_FIRST) if nodeid.startswith(prefix)),
                len(LONGEST_FIRST))


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Longest first (a stable sort: within a rank, tests keep their order)."""
    items.sort(key=lambda item: _rank(item.nodeid))


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`-n N` (``--dist load``): hand tests out one at a time in collection order, a module of
    ONE_WORKER_MODULES as one unit (pytest-xdist's loadgroup markers do not take effect
    under pytest 9, which no longer reads the node id they rewrite)."""
    if config.getvalue("dist") != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling  # type: ignore[import-untyped]

    class LongestFirst(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return module if module in ONE_WORKER_MODULES else nodeid

    return LongestFirst(config, log)


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

