"""Shared fixtures and the suite's tiers.

The tests sit in folders by kind, and each folder is a marker (`pytest -m unit`):

* ``unit/``: the library in this process on real SQLite files; a test of the central DB is
  parametrized over the backends (`central_url`), so in the whole run it also meets the
  PostgreSQL and MySQL-family (MariaDB) servers the suite starts for the session;
* ``structure/``: the layout's rules (imports, layers, private names, the public surface);
* ``integration/``: real processes started for the test: the installed ``localstate`` command,
  ``localstate serve``, PgBouncer, Redis, Prometheus, the queue brokers, a database server of
  its own to stop; and a real browser;
* ``airflow/``: real Airflow 3.3 processes (API server, triggerer, scheduler, dag processor);
* ``faults/``: fault injection: crashes (SIGKILL), outages, power loss, hostile input;
* ``packaging/``: the wheel, the upgrade from the previous release, the docs site, the
  Kubernetes manifests.

Helpers shared by the folders are modules of ``support/`` (on ``sys.path`` through pyproject's
``pythonpath``: ``from airflow_harness import stop``). ``./scripts/test --quick`` runs
``unit/`` and ``structure/`` with ``--backend sqlite --forbid-servers``: only the SQLite case
of each backend-parametrized test, and any attempt to start a database server, an Airflow
process, a broker or a browser fails the test that made it.

Every central test takes `central_url`, parametrized over the three backends, so each runs on
the embedded SQLite default, on PostgreSQL and on MySQL without being written three times.
Tests marked `@collations` run on a fourth: a PostgreSQL database that orders text as en-US
(ICU) does.
"""

from __future__ import annotations

import itertools
import os
import shlex
import sys
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


TESTS = Path(__file__).resolve().parent
#: the folders of tests/ that hold tests, each the marker of its tests (declared in pyproject)
TIERS = ("unit", "structure", "integration", "airflow", "faults", "packaging")
#: the server fixtures of this file, by the backend whose server they start
SERVER_FIXTURES = {"pg_server": "postgresql", "private_pg": "postgresql",
                   "mysql_server": "mysql"}
#: programs that are servers, brokers or browsers (the executable's name, or the module after
#: ``python -m``): none starts under ``--forbid-servers``
SERVER_PROGRAMS = frozenset({
    "postgres", "initdb", "pg_ctl", "mariadbd", "mysqld", "mariadb-install-db", "pgbouncer",
    "redis-server", "prometheus", "tansu", "moto.server", "airflow", "chromium", "chrome",
})


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("localstate")
    group.addoption(
        "--backend", action="append", choices=BACKENDS, metavar="NAME",
        help="run the central DB tests on this backend only (repeatable; sqlite, postgresql, "
             "mysql): the other backends' cases and the tests that start their servers are "
             "deselected")
    group.addoption(
        "--forbid-servers", action="store_true",
        help="fail any test that starts a database server, PgBouncer, a broker, Prometheus, "
             "an Airflow process, `localstate serve` or a browser (the quick tier's guard)")


def pytest_configure(config: pytest.Config) -> None:
    # The Airflow tests import Airflow at collection, before any test's isolated home exists,
    # and Airflow creates folders in $AIRFLOW_HOME when imported: give it a throwaway one.
    os.environ["AIRFLOW_HOME"] = tempfile.mkdtemp(prefix="localstate-tests-airflow-home-")
    if config.getoption("forbid_servers"):
        sys.addaudithook(refuse_servers)


def server_started_by(args: Any) -> str | None:
    """The server, broker or browser a command line starts, or None for any other program."""
    if isinstance(args, (str, bytes, os.PathLike)):
        text = os.fsdecode(args)
        argv = shlex.split(text) if " " in text else [text]
    else:
        argv = [os.fsdecode(arg) for arg in args]
    names = [Path(arg).name for arg in argv]
    if not names:
        return None
    program, rest = names[0], names[1:]
    if program.startswith("python") and rest[:1] == ["-m"] and len(rest) > 1:
        program, rest = rest[1], rest[2:]
    if any("playwright" in arg for arg in argv):
        return "Playwright's browser driver"
    if program in SERVER_PROGRAMS or program.split(".")[0] == "airflow":
        return program
    if program in ("localstate", "localstate.cli") and rest[:1] == ["serve"]:
        return "localstate serve"
    return None


def refuse_servers(event: str, args: tuple[Any, ...]) -> None:
    """An audit hook (``--forbid-servers``): a subprocess that would start a server fails."""
    if event != "subprocess.Popen":
        return
    started = server_started_by(args[1])
    if started is not None:
        raise RuntimeError(f"--forbid-servers (the quick tier): this test starts {started}; "
                           f"move it to tests/integration/ or tests/airflow/")


def _chosen_backends(config: pytest.Config) -> set[str] | None:
    chosen = config.getoption("backend")
    return set(chosen) if chosen else None


def _backends_of(item: pytest.Item) -> set[str]:
    """The central backends a test runs on: each parameter whose value names one (`backend`,
    `db_server`, a module's own such as an outage's backend; ``postgresql-en-US`` is
    PostgreSQL's), and the server fixtures it asks for."""
    backends: set[str] = set()
    callspec = getattr(item, "callspec", None)
    for value in callspec.params.values() if callspec is not None else ():
        if isinstance(value, str) and value.split("-")[0] in BACKENDS:
            backends.add(value.split("-")[0])
    backends.update(backend for name, backend in SERVER_FIXTURES.items()
                    if name in getattr(item, "fixturenames", ()))
    return backends


def _require_backend(request: pytest.FixtureRequest, backend: str) -> None:
    """A server fixture asked for (getfixturevalue included) outside the chosen backends
    fails the test: ``--backend sqlite`` starts no server."""
    chosen = _chosen_backends(request.config)
    if chosen is not None and backend not in chosen:
        pytest.fail(f"{request.fixturename} starts a {backend} server, which --backend "
                    f"{' '.join(sorted(chosen))} leaves out", pytrace=False)


#: The suite's longest tests and modules (nodeid prefixes), longest first, with their seconds
#: in a whole-suite run on two workers (a loaded machine; CI's are about two thirds). They are
#: dealt out first, so that the last minutes of a run are short tests that spread over both
#: workers, not one long test with the other worker idle. The rest keep their order.
LONGEST_FIRST = [
    "tests/airflow/test_airflow_events_chaos.py",  # 232-508 s
    "tests/airflow/test_airflow_queue_chaos.py",  # 477-634 s alone (load 7-23)
    "tests/packaging/test_wheel.py",  # 90-170 (both tests share one build)
    "tests/airflow/test_airflow_queue_watchers.py",  # 81 for the module on 2 workers
    # 36-335 each: the docs' installs, the two with Airflow 280-335
    "tests/packaging/test_docs_install.py",
    # 96
    "tests/airflow/test_cli_bench.py::test_bench_flushes_through_sink_airflow_in_a_real_triggerer",
    "tests/airflow/test_airflow_plugin.py",  # 105 (one Airflow deployment for the module)
    # 100
    "tests/packaging/test_upgrade.py::test_sigkill_rounds_then_upgrade_lose_no_acknowledged_write",
    "tests/airflow/test_airflow_graceful_stop.py",  # 88
    "tests/airflow/test_airflow_api_e2e.py",  # 78 (one Airflow deployment for the module)
    "tests/integration/test_outage_logs.py",  # 68 (a 60 s outage)
    "tests/faults/test_soak.py",  # 62
    "tests/airflow/test_cli_bench.py::test_the_quick_start_runs_on_the_base_install_alone",  # 62
    "tests/airflow/test_deploy_guide.py",  # 53
    "tests/airflow/test_airflow_e2e.py",  # 48
    "tests/airflow/test_asset_events.py",  # 30 (one Airflow deployment for the module)
    "tests/faults/test_frozen_flush.py",  # 17-37 each
    "tests/faults/test_linearizable.py",  # 11-27 each
    "tests/airflow/test_cli_bench.py",  # 24-26 each
    "tests/faults/test_hostile_cli.py",  # 26
    "tests/unit/test_sync_worker.py::test_the_watermark_never_goes_backwards_under_a_random_failover",
    "tests/faults/test_power_loss.py",  # 17-23 each
    "tests/faults/test_toggle_outage.py",  # 17-23 each
    "tests/structure/test_imports.py::test_every_module_imports_first_in_a_fresh_interpreter",  # 22
    "tests/faults/test_hostile_rest.py",  # 21
    "tests/integration/test_cli.py",  # 1-18 each, 271 in all
    "tests/integration/test_cli_api.py",  # 7-18 each
    "tests/packaging/test_upgrade.py",  # 15 each
    "tests/faults/test_api_outage.py",  # 12-16 each
    "tests/faults/test_hostile_input.py",  # 15
    "tests/faults/test_process_crash.py",  # 9-14 each
    "tests/integration/test_ui_browser.py",  # 3-11 each
]
#: Modules whose tests share a module-scoped fixture (an Airflow deployment, a server of
#: their own, a built wheel): each runs whole on one worker, so that fixture is set up once.
#: Every other test is handed out on its own, to whichever worker is free.
ONE_WORKER_MODULES = frozenset({
    "tests/faults/test_central_hang.py",
    "tests/faults/test_pgbouncer.py",
    "tests/faults/test_power_loss.py",
    "tests/faults/test_restart_while_down.py",
    "tests/airflow/test_airflow_api_e2e.py",
    "tests/airflow/test_airflow_plugin.py",
    "tests/integration/test_airflow_queues_kafka.py",
    "tests/integration/test_airflow_queues_redis.py",
    "tests/integration/test_airflow_queues_sqs.py",
    "tests/unit/test_airflow_trigger.py",
    "tests/airflow/test_asset_events.py",
    "tests/integration/test_driver_errors_mysql.py",
    "tests/integration/test_postgres_server.py",
    "tests/packaging/test_wheel.py",
})


def _rank(nodeid: str) -> int:
    return next((n for n, prefix in enumerate(LONGEST_FIRST) if nodeid.startswith(prefix)),
                len(LONGEST_FIRST))


def tier_of(path: Path) -> str:
    """The tier of a test file: its folder under tests/."""
    parts = path.resolve().relative_to(TESTS).parts
    if len(parts) < 2 or parts[0] not in TIERS:
        raise pytest.UsageError(f"{path}: a test sits in one of the folders {', '.join(TIERS)} "
                                f"of tests/ (see tests/conftest.py)")
    return parts[0]


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Each test marked with its tier; with ``--backend``, the other backends' tests
    deselected; longest first (a stable sort: within a rank, tests keep their order)."""
    for item in items:
        item.add_marker(tier_of(item.path))
    chosen = _chosen_backends(config)
    if chosen is not None:
        left_out = [item for item in items if _backends_of(item) - chosen]
        if left_out:
            config.hook.pytest_deselected(items=left_out)
            dropped = set(map(id, left_out))
            items[:] = [item for item in items if id(item) not in dropped]
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
def pg_server(tmp_path_factory: pytest.TempPathFactory,
              request: pytest.FixtureRequest) -> Iterator[PostgresServer]:
    _require_backend(request, "postgresql")
    server = PostgresServer(tmp_path_factory.mktemp("postgres"))
    server.start()
    yield server
    server.close()


@pytest.fixture(scope="session")
def mysql_server(tmp_path_factory: pytest.TempPathFactory,
                 request: pytest.FixtureRequest) -> Iterator[MysqlServer]:
    _require_backend(request, "mysql")
    server = MysqlServer(tmp_path_factory.mktemp("mysql"))
    server.start()
    yield server
    server.close()


@pytest.fixture(scope="module")
def private_pg(tmp_path_factory: pytest.TempPathFactory,
               request: pytest.FixtureRequest) -> Iterator[PostgresServer]:
    """A PostgreSQL server of the test module's own, for tests that stop and start it."""
    _require_backend(request, "postgresql")
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

