"""`DictAccessor`: an in-memory stand-in for Airflow's ``AssetStateStoreAccessor`` with the
three methods the ``airflow`` sink calls (the real one needs a triggerer's supervisor socket:
the Airflow end-to-end tests use it). It records each call and can be taken down."""

from __future__ import annotations

import json
from typing import Any


class DictAccessor:
    def __init__(self) -> None:
        self.values: dict[str, str] = {}  # JSON text, as Airflow's table keeps it
        self.calls: list[tuple[str, str]] = []
        self.down = False

    def _check(self, op: str, key: str) -> None:
        self.calls.append((op, key))
        if self.down:
            raise ConnectionError("supervisor socket closed")

    async def aget(self, key: str, default: Any = None) -> Any:
        self._check("get", key)
        return json.loads(self.values[key]) if key in self.values else default

    async def aset(self, key: str, value: Any) -> None:
        self._check("set", key)
        self.values[key] = json.dumps(value)

    async def adelete(self, key: str) -> None:
        self._check("delete", key)
        self.values.pop(key, None)
