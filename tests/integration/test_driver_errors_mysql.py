"""MySQL's "not there right now" errors are `CentralUnavailable`, and the engine's pings
reconnect: against a MariaDB server of this module's own (it is stopped, restarted and its
connections killed with ``KILL``).

The error numbers a real server sends too rarely to provoke on cue (deadlocks, too many
connections) are checked on the classifier with the driver's own exception classes.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiomysql
import pymysql
import pytest
import pytest_asyncio
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, OperationalError

from localstate._sync.central.central_store import CentralStore
from localstate._sync.central.driver_errors import is_unreachable
from localstate._testing.mysql_server import MysqlServer
from localstate.errors import CentralError, CentralUnavailable

KEY = ("o", "k")


@pytest.fixture(scope="module")
def my(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MysqlServer]:
    with MysqlServer(tmp_path_factory.mktemp("mysql-errors")) as server:
        yield server


@pytest.fixture
def url(my: MysqlServer, request: pytest.FixtureRequest) -> str:
    my.start()  # a test before may have left it stopped
    name = "errors_" + request.node.name.removeprefix("test_")[:40]
    my.drop_database(name)
    return my.create_database(name)


@pytest_asyncio.fixture
async def central(url: str) -> AsyncIterator[CentralStore]:
    store = await CentralStore.open(url)
    yield store
    await store.close()


async def connect(url: str) -> aiomysql.Connection:
    u = make_url(url)
    return await aiomysql.connect(host=u.host, port=u.port, user=u.username, db=u.database,
                                  autocommit=False)


async def test_a_stopped_server_is_unavailable(my: MysqlServer, central: CentralStore) -> None:
    await central.write_direct(*KEY, '"v"', updated_at=1.0, updated_by="t")
    my.stop("fast")
    with pytest.raises(CentralUnavailable, match="failed to read"):
        await central.read_many([KEY])
    with pytest.raises(CentralUnavailable, match="failed to open"):
        await CentralStore.open(central.engine.url.render_as_string(hide_password=False))


async def hold_the_row_and_start_a_write(url: str, central: CentralStore
                                         ) -> tuple[aiomysql.Connection, asyncio.Task[object]]:
    """A second connection holds the row's lock; the store's write waits inside its statement
    (returned once the server shows it waiting)."""
    blocker = await connect(url)
    async with blocker.cursor() as cur:
        await cur.execute("SELECT * FROM localstate_state FOR UPDATE")
    write: asyncio.Task[object] = asyncio.create_task(
        central.write_direct(*KEY, '"w"', updated_at=2.0, updated_by="t"))
    for _ in range(500):
        if await the_waiting_write(blocker) is not None:
            return blocker, write
        await asyncio.sleep(0.02)
    raise AssertionError(f"the store's write never reached the server: {write}")


async def the_waiting_write(conn: aiomysql.Connection) -> int | None:
    """The connection id of the store's write waiting in its statement, if any."""
    async with conn.cursor() as cur:
        await cur.execute("SELECT id FROM information_schema.processlist WHERE db = DATABASE() "
                          "AND info LIKE 'INSERT INTO localstate_state%'")
        row = await cur.fetchone()
    return None if row is None else int(row[0])


async def test_a_connection_killed_mid_statement_is_unavailable_and_reconnects(
    my: MysqlServer, url: str, central: CentralStore,
) -> None:
    await central.write_direct(*KEY, '"v"', updated_at=1.0, updated_by="t")
    blocker, write = await hold_the_row_and_start_a_write(url, central)
    try:
        victim = await the_waiting_write(blocker)
        my.execute(f"KILL CONNECTION {victim}")  # MariaDB: 1927, MySQL 8: 2013
        with pytest.raises(CentralUnavailable, match="failed to write"):
            await write
        await blocker.rollback()
    finally:
        blocker.close()
    assert (await central.read_many([KEY]))[KEY].data == '"v"'  # and it reconnects


async def test_a_server_shut_down_mid_statement_is_unavailable(
    my: MysqlServer, url: str, central: CentralStore,
) -> None:
    await central.write_direct(*KEY, '"v"', updated_at=1.0, updated_by="t")
    blocker, write = await hold_the_row_and_start_a_write(url, central)
    try:
        await asyncio.to_thread(my.stop, "fast")  # 1053 server shutdown / 2013 lost
        with pytest.raises(CentralUnavailable, match="failed to write"):
            await write
    finally:
        blocker.close()
    my.start()
    assert (await central.read_many([KEY]))[KEY].data == '"v"'


async def test_a_lock_wait_timeout_is_unavailable(url: str, central: CentralStore) -> None:
    await central.write_direct(*KEY, '"v"', updated_at=1.0, updated_by="t")
    async with central.engine.connect() as conn:  # the pool's connections: 1 s lock waits
        await conn.exec_driver_sql("SET GLOBAL innodb_lock_wait_timeout = 1")
    await central.engine.dispose()
    try:
        blocker, write = await hold_the_row_and_start_a_write(url, central)
        try:
            with pytest.raises(CentralUnavailable, match="Lock wait timeout"):
                await write  # 1205
        finally:
            blocker.close()
    finally:
        async with central.engine.connect() as conn:
            await conn.exec_driver_sql("SET GLOBAL innodb_lock_wait_timeout = 50")


@pytest.mark.parametrize("mode", ["fast", "immediate"])
async def test_pings_reconnect_after_a_restart_under_an_open_store(
    my: MysqlServer, central: CentralStore, mode: str,
) -> None:
    """pool_pre_ping: the pooled connections the restart broke are replaced on checkout,
    so the next call works (the aiomysql/PyMySQL ping of sqlalchemy#13306 works here)."""
    await central.write_direct(*KEY, '"v"', updated_at=1.0, updated_by="t")
    async with central.engine.connect(), central.engine.connect():  # two pooled connections
        pass
    await asyncio.to_thread(my.restart, mode)
    assert (await central.read_many([KEY]))[KEY].data == '"v"'
    written = await central.write_direct(*KEY, '"w"', updated_at=2.0, updated_by="t")
    assert written.version == 2


async def test_pings_reconnect_after_kill_of_idle_connections(
    my: MysqlServer, url: str, central: CentralStore,
) -> None:
    await central.write_direct(*KEY, '"v"', updated_at=1.0, updated_by="t")
    async with central.engine.connect(), central.engine.connect():
        pass
    assert my.kill_connections(make_url(url).database) >= 1
    last = '"v"'
    for n in range(3):  # every pooled connection was killed: each checkout pings, reconnects
        assert (await central.read_many([KEY]))[KEY].data == last
        last = f'"{n}"'
        await central.write_direct(*KEY, last, updated_at=2.0 + n, updated_by="t")


def _wrapped(orig: BaseException) -> DBAPIError:
    return OperationalError("SELECT 1", {}, orig)


@pytest.mark.parametrize("error", [
    pymysql.err.OperationalError(2003, "Can't connect to MySQL server on '127.0.0.1'"),
    pymysql.err.OperationalError(2006, "MySQL server has gone away"),
    pymysql.err.OperationalError(2013, "Lost connection to MySQL server during query"),
    pymysql.err.OperationalError(1053, "Server shutdown in progress"),
    pymysql.err.OperationalError(1927, "Connection was killed"),
    pymysql.err.OperationalError(1205, "Lock wait timeout exceeded"),
    pymysql.err.OperationalError(1213, "Deadlock found when trying to get lock"),
    pymysql.err.OperationalError(1040, "Too many connections"),
    pymysql.err.OperationalError(4031, "The client was disconnected by the server"),
], ids=lambda e: str(e.args[0]))
def test_transient_mysql_errors_are_unreachable(error: BaseException) -> None:
    assert is_unreachable(error)
    assert is_unreachable(_wrapped(error))


@pytest.mark.parametrize("error", [
    pymysql.err.ProgrammingError(1146, "Table 'x.localstate_state' doesn't exist"),
    pymysql.err.IntegrityError(1062, "Duplicate entry"),
    pymysql.err.DataError(1406, "Data too long for column 'owner'"),
    pymysql.err.OperationalError(1045, "Access denied for user"),
    pymysql.err.OperationalError(1049, "Unknown database 'nope'"),
], ids=lambda e: str(e.args[0]))
def test_real_mysql_failures_are_not_unreachable(error: BaseException) -> None:
    assert not is_unreachable(error)
    assert not is_unreachable(_wrapped(error))


async def test_a_real_mysql_failure_is_a_central_error_not_unavailable(
    central: CentralStore,
) -> None:
    async with central.engine.begin() as conn:
        await conn.exec_driver_sql("DROP TABLE localstate_state")
    with pytest.raises(CentralError, match="doesn't exist") as caught:
        await central.read_many([KEY])
    assert not isinstance(caught.value, CentralUnavailable)


async def test_an_unknown_database_is_a_central_error(my: MysqlServer, tmp_path: Path) -> None:
    with pytest.raises(CentralError, match="Unknown database") as caught:
        await CentralStore.open(my.url_for("no_such_db"))
    assert not isinstance(caught.value, CentralUnavailable)
