"""`LocalStateHook`: state variables from a task, through a ``localstate`` connection.

In Airflow 3 a task has no database. It reaches localstate the way it reaches any service:
through a connection and a hook. The connection (type ``localstate``) names the API that the
plugin serves in Airflow's API server, and a token::

    AIRFLOW_CONN_LOCALSTATE_DEFAULT='{"conn_type": "localstate",
        "host": "http://airflow-api-server:8080/localstate", "password": "<token>"}'

The hook is a thin front over `localstate.client`: each call is one request, and the errors
are the client's (`AccessDenied` for a 401 or 403, `VersionConflict`, `CentralUnavailable`)::

    from localstate.airflow.hook import LocalStateHook

    @task
    def load(dag_run=None, ti=None):
        hook = LocalStateHook()                       # localstate_conn_id="localstate_default"
        seen = hook.get("asset_watcher:orders", "watermark", default=0)
        owner = LocalStateHook.task_owner(ti.dag_id, ti.task_id)   # "dag:<dag_id>/<task_id>"
        rec = hook.record(owner, "cursor")
        hook.compare_and_set(owner, "cursor", seen, expected_version=rec.version if rec else 0)

Each method has an async twin (``aget``, ``arecord``, ``aset``, ``adelete``,
``acompare_and_set``, ``alist``) for deferrable operators and triggers.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any, ClassVar

from airflow.sdk import BaseHook

from localstate._core.api_connection import CONN_TYPE, DEFAULT_CONN_ID, Endpoint, endpoint
from localstate._core.model import Record
from localstate.client import AsyncStateClient, StateClient

__all__ = ["LocalStateHook"]


class LocalStateHook(BaseHook):
    """Read and write localstate's state variables through a ``localstate`` connection.

    The connection's host is the API's URL (``http://<api-server>:8080/localstate``); its
    password is a bearer token from ``[localstate] api_tokens``. Give each DAG a token limited
    to its own owners (``dag:<dag_id>/``), plus the watchers it reads.
    """

    conn_name_attr: ClassVar[str] = "localstate_conn_id"
    default_conn_name: ClassVar[str] = DEFAULT_CONN_ID
    conn_type: ClassVar[str] = CONN_TYPE
    hook_name: ClassVar[str] = "localstate"

    def __init__(self, localstate_conn_id: str = DEFAULT_CONN_ID, *, timeout: float = 30.0
                 ) -> None:
        super().__init__()
        self.localstate_conn_id = localstate_conn_id
        self.timeout = timeout
        self._client: StateClient | None = None
        #: the async client and the event loop it was opened on (httpx's pool belongs to it)
        self._async: tuple[asyncio.AbstractEventLoop, AsyncStateClient] | None = None

    @staticmethod
    def task_owner(dag_id: str, task_id: str) -> str:
        """The owner a task's own state goes under: ``dag:<dag_id>/<task_id>``."""
        return f"dag:{dag_id}/{task_id}"

    # -- the connection --------------------------------------------------------------------

    def endpoint(self) -> Endpoint:
        """The API's URL and token, from the connection."""
        conn = self.get_connection(self.localstate_conn_id)
        return endpoint(self.localstate_conn_id, conn.host, port=conn.port,
                        schema=conn.schema, password=conn.password, extra=conn.extra_dejson)

    async def aendpoint(self) -> Endpoint:
        conn = await self.aget_connection(self.localstate_conn_id)
        return endpoint(self.localstate_conn_id, conn.host, port=conn.port,
                        schema=conn.schema, password=conn.password, extra=conn.extra_dejson)

    def get_conn(self) -> StateClient:
        """The blocking client on the connection's API (opened once per hook)."""
        if self._client is None:
            found = self.endpoint()
            self._client = StateClient(found.url, token=found.token, timeout=self.timeout,
                                       ca_bundle=found.ca_bundle)
        return self._client

    async def aget_conn(self) -> AsyncStateClient:
        """The async client on the connection's API (one per event loop)."""
        loop = asyncio.get_running_loop()
        if self._async is not None and self._async[0] is loop:
            return self._async[1]
        if self._async is not None:
            # opened on another loop: httpx cannot close its pool from this one
            self._async = None
        found = await self.aendpoint()
        client = AsyncStateClient(found.url, token=found.token, timeout=self.timeout,
                                  ca_bundle=found.ca_bundle)
        self._async = (loop, client)
        return client

    def test_connection(self) -> tuple[bool, str]:
        """The Connections form's Test button: the API answers, and the token is valid."""
        try:
            client = self.get_conn()
            client.status()
        except Exception as exc:
            return False, f"{type(exc).__name__}: {exc}"
        return True, f"the localstate API at {self.endpoint().url} answered"

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    async def aclose(self) -> None:
        self.close()
        if self._async is not None:
            await self._async[1].close()
            self._async = None

    # -- blocking calls --------------------------------------------------------------------

    def get(self, owner: str, key: str, default: Any = None) -> Any:
        """The committed value (`default` when there is none)."""
        return self.get_conn().get(owner, key, default)

    def record(self, owner: str, key: str) -> Record | None:
        """The committed record with its version, or None."""
        return self.get_conn().record(owner, key)

    def set(self, owner: str, key: str, value: Any) -> Record:
        """Write `value`; the central DB holds it when this returns. Its record."""
        return self.get_conn().set(owner, key, value)

    def compare_and_set(self, owner: str, key: str, value: Any, *, expected_version: int
                        ) -> Record:
        """Write only over the committed `expected_version` (0: only if absent); else
        `VersionConflict` with the version found."""
        return self.get_conn().set(owner, key, value, expected_version=expected_version)

    def delete(self, owner: str, key: str, *, expected_version: int | None = None) -> bool:
        """Delete; False when there was no value."""
        return self.get_conn().delete(owner, key, expected_version=expected_version)

    def list(self, owner_prefix: str = "", *, page_size: int = 100) -> Iterator[Record]:
        """Every record whose owner starts with `owner_prefix` (within the token's owners)."""
        return self.get_conn().list(owner_prefix, page_size=page_size)

    # -- async twins -----------------------------------------------------------------------

    async def aget(self, owner: str, key: str, default: Any = None) -> Any:
        return await (await self.aget_conn()).get(owner, key, default)

    async def arecord(self, owner: str, key: str) -> Record | None:
        return await (await self.aget_conn()).record(owner, key)

    async def aset(self, owner: str, key: str, value: Any) -> Record:
        return await (await self.aget_conn()).set(owner, key, value)

    async def acompare_and_set(self, owner: str, key: str, value: Any, *,
                               expected_version: int) -> Record:
        return await (await self.aget_conn()).set(owner, key, value,
                                                   expected_version=expected_version)

    async def adelete(self, owner: str, key: str, *, expected_version: int | None = None
                      ) -> bool:
        return await (await self.aget_conn()).delete(owner, key,
                                                     expected_version=expected_version)

    async def alist(self, owner_prefix: str = "", *, page_size: int = 100
                    ) -> AsyncIterator[Record]:
        client = await self.aget_conn()
        async for rec in client.list(owner_prefix, page_size=page_size):
            yield rec
