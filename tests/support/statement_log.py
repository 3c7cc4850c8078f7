"""Counting what really reaches the central DB: SQLAlchemy's statement and commit events."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import orjson
from sqlalchemy import Connection, event
from sqlalchemy.ext.asyncio import AsyncEngine

from localstate import StateStore
from localstate._sync.central.central_store import CentralStore
from localstate._sync.central.schema import FLEET_TABLE, HISTORY_TABLE


class StatementLog:
    """Every statement and commit an engine sends, as seen by SQLAlchemy's events."""

    def __init__(self, target: AsyncEngine | CentralStore | StateStore) -> None:
        if isinstance(target, StateStore):
            central = target.central_store
            assert central is not None
            target = central
        engine = target.engine if isinstance(target, CentralStore) else target
        self._engine = engine.sync_engine
        self.statements: list[tuple[str, Any]] = []
        self.commits = 0

    def _on_execute(self, conn: Connection, cursor: Any, statement: str, parameters: Any,
                    context: Any, executemany: bool) -> None:
        self.statements.append((statement, parameters))

    def _on_commit(self, conn: Connection) -> None:
        self.commits += 1

    @contextmanager
    def watching(self) -> Iterator[StatementLog]:
        event.listen(self._engine, "before_cursor_execute", self._on_execute)
        event.listen(self._engine, "commit", self._on_commit)
        try:
            yield self
        finally:
            event.remove(self._engine, "before_cursor_execute", self._on_execute)
            event.remove(self._engine, "commit", self._on_commit)

    def of_kind(self, verb: str) -> list[tuple[str, Any]]:
        """The statements of `verb` on the state. Left out: the bounds each PostgreSQL
        transaction sets, and the fleet row and the history rows each flush records (on
        PostgreSQL their ``WITH fleet AS (...)`` and ``WITH up AS (...) INSERT INTO
        localstate_history`` wrappers, elsewhere their statements)."""
        out = []
        for s, p in self.statements:
            text = s.lstrip()
            if "), up AS (" in text and text.startswith("WITH fleet AS ("):
                text = text[text.index("), up AS (") + len("), up AS ("):]
            elif text.startswith("WITH fleet AS ("):
                text = text[text.index(") INSERT") + 2:]
            elif text.startswith("WITH up AS ("):
                text = text[len("WITH up AS ("):]
            elif FLEET_TABLE in text.split("(", 1)[0] or HISTORY_TABLE in text.split("(", 1)[0]:
                continue
            elif text.startswith("SELECT set_config("):
                continue  # a PostgreSQL transaction's own bounds (SET LOCAL), no state read
            if text.upper().startswith(verb):
                out.append((s, p))
        return out


def rows_carried(parameters: Any) -> int:
    """How many rows one batch statement carries, read from its driver parameters.

    PostgreSQL gets one array per column (`unnest`), SQLite one JSON array (`json_each`).
    """
    values = list(parameters.values()) if isinstance(parameters, dict) else list(parameters)
    sizes = [len(v) for v in values if isinstance(v, list)]
    sizes += [len(orjson.loads(v)) for v in values if isinstance(v, str) and v.startswith("[")]
    assert sizes, parameters
    return max(sizes)
