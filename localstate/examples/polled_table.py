"""`PolledTable`: the SQL table an example watcher polls for rows with a larger id.

``SELECT <id_column> FROM <table> WHERE <id_column> > :after ORDER BY <id_column> LIMIT <n>``
through a plain driver: asyncpg for ``postgresql://`` DSNs, the standard library's sqlite3 (on
a worker thread) for ``sqlite:///path``.
"""

from __future__ import annotations

import asyncio
import re
import sqlite3
from collections.abc import Awaitable, Callable

__all__ = ["Fetch", "PolledTable", "check_source"]

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)?")

#: the ids greater than its argument, in order, at most one batch
Fetch = Callable[[int], Awaitable[list[int]]]


def check_source(dsn: str, table: str, id_column: str) -> None:
    """Raise `ValueError` naming the argument unless the source can be polled safely (the
    names go into SQL text, so they must be plain identifiers)."""
    for what, name in (("table", table), ("id_column", id_column)):
        if not _IDENTIFIER.fullmatch(name):
            raise ValueError(f"{what} {name!r} is not a plain SQL identifier")
    if not dsn.startswith(("postgresql://", "sqlite:///")):
        raise ValueError(f"dsn {dsn!r}: expected postgresql://... or sqlite:///path")


class PolledTable:
    """``async with PolledTable(dsn, table, id_column, batch_size) as fetch:`` then
    ``await fetch(after)``; the connection is closed on exit."""

    def __init__(self, dsn: str, table: str, id_column: str, batch_size: int) -> None:
        check_source(dsn, table, id_column)
        self._dsn = dsn
        self._table = table
        self._id_column = id_column
        self._batch_size = int(batch_size)
        self._close: Callable[[], Awaitable[None]] | None = None

    def _query(self, placeholder: str) -> str:
        return (f"SELECT {self._id_column} FROM {self._table} WHERE {self._id_column} > "
                f"{placeholder} ORDER BY {self._id_column} LIMIT {self._batch_size}")

    async def __aenter__(self) -> Fetch:
        if self._dsn.startswith("postgresql://"):
            import asyncpg

            pg = await asyncpg.connect(self._dsn)
            self._close = pg.close
            sql = self._query("$1")

            async def fetch_pg(after: int) -> list[int]:
                return [int(r[0]) for r in await pg.fetch(sql, after)]

            return fetch_pg
        path = self._dsn.removeprefix("sqlite:///")
        lite = await asyncio.to_thread(sqlite3.connect, path, check_same_thread=False)
        sql = self._query("?")

        async def close_lite() -> None:
            await asyncio.to_thread(lite.close)

        self._close = close_lite

        def read(after: int) -> list[int]:
            return [int(r[0]) for r in lite.execute(sql, (after,)).fetchall()]

        async def fetch_lite(after: int) -> list[int]:
            return await asyncio.to_thread(read, after)

        return fetch_lite

    async def __aexit__(self, *exc: object) -> None:
        if self._close is not None:
            await self._close()
