"""`LocalStateMount`: the ASGI app the plugin mounts in Airflow's API server at /localstate.

It is built when Airflow loads its plugins (in every Airflow process, the scheduler and the
CLI included), so it is cheap and touches nothing: no database, no store. The app it serves
(`localstate.airflow._serving.open_serving`) is opened by the first request, once (concurrent
first requests wait for the same opening), and closed at the API server's shutdown.

Starlette does not run the lifespan of a mounted app; Airflow 3.3's API server enters the
lifespan of each mounted FastAPI app itself, so this app is a FastAPI app whose lifespan
closes what a request opened (under a server that does not, the process's exit ends the
connections). An opening that fails (the database unreachable) answers 503 and is tried
again by the next request.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from starlette.types import ASGIApp, Receive, Scope, Send

from localstate.api._app import RawStatePath
from localstate.api._errors import error_response, from_store_error
from localstate.api._paths import STATE_PATH
from localstate.errors import LocalStateError

__all__ = ["LocalStateMount", "root_middlewares"]

log = logging.getLogger("localstate.airflow.mount")

Opener = Callable[[], Awaitable[tuple[ASGIApp, Callable[[], Awaitable[None]]]]]


async def _open_serving() -> tuple[ASGIApp, Callable[[], Awaitable[None]]]:
    from localstate.airflow._serving import open_serving

    return await open_serving()


class LocalStateMount(FastAPI):
    """Opens the served app on the first request, closes it with the server (see module)."""

    def __init__(self, opener: Opener = _open_serving) -> None:
        super().__init__(title="localstate", lifespan=self._lifespan, openapi_url=None,
                         docs_url=None, redoc_url=None)
        self._opener = opener
        self._served: ASGIApp | None = None
        self._close: Callable[[], Awaitable[None]] | None = None
        self._lock: asyncio.Lock | None = None  # made on the server's loop, at first use

    @asynccontextmanager
    async def _lifespan(self, _app: FastAPI) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await self.aclose()

    async def aclose(self) -> None:
        """Close the served app, if a request opened it; the next request opens it again."""
        close, self._close, self._served = self._close, None, None
        if close is not None:
            await close()

    async def _serving(self) -> ASGIApp:
        if self._served is not None:
            return self._served
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self._served is None:
                self._served, self._close = await self._opener()
                log.info("localstate: serving its API and UI in this API server")
            return self._served

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await super().__call__(scope, receive, send)
            return
        try:
            served = await self._serving()
        except LocalStateError as exc:
            log.error("localstate: cannot open its store on Airflow's metadata DB: %s", exc)
            error = from_store_error(exc)
            status = error.status if error.status >= 500 else 503
            await error_response(status, "store_unavailable", error.message,
                                 headers={"Retry-After": "5"})(scope, receive, send)
            return
        await served(scope, receive, send)


def root_middlewares(mount_prefix: str) -> list[dict[str, Any]]:
    """The plugin's ``fastapi_root_middlewares``: Airflow's app routes to the mount at
    `mount_prefix` on the decoded path, where a name holding a newline (``%0A``) matches no
    mount and gets Airflow's bare 404. `RawStatePath` routes the state URLs on the raw path in
    Airflow's app too, so they reach this app, which says 422 ``invalid_name``. It costs every
    request of the API server one prefix test."""
    return [{"middleware": RawStatePath, "name": "localstate_raw_path",
             "kwargs": {"prefix": mount_prefix + STATE_PATH}}]
