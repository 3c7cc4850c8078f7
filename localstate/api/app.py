"""`create_app`: the FastAPI application over one `StateStore`.

    store = await StateStore.open(...)
    app = create_app(store)                 # tokens from store.settings.api_tokens

Routes: ``/api/v1/state`` (list), ``/api/v1/state/{owner}/{key}`` (GET, PUT, DELETE),
``/api/v1/status``, ``/api/v1/health``; the OpenAPI document at ``/api/v1/openapi.json`` (and
its browser view at ``/api/docs``); the web UI at ``/``. See `localstate.api.routes` for what
each read shows and how writes are made.

The application's lifespan (run by any ASGI server) opens its own `CentralStore` on the store's
``central_url`` for every read and write of the routes (each write one statement on the central
DB, see `localstate.api.writes`): the store itself may talk to the central DB from a thread of
its own, so its client is not borrowed. Pass `central` to use another one (then the caller
closes it). With ``manage_store=True`` the lifespan also opens the store and closes it at
shutdown; otherwise the caller owns the store.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

from fastapi import FastAPI, HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from localstate import __version__
from localstate.api.auth import Authorizer
from localstate.api.csrf import CsrfGuard
from localstate.api.errors import error_response, install_error_handlers
from localstate.api.paths import STATE_PATH
from localstate.api.routes import build_router
from localstate.api.sink_routes import SINK_PATHS, build_sink_router
from localstate.api.ui import build_ui_router
from localstate.config import Settings
from localstate.setting_specs import ApiToken
from localstate.store import StateStore
from localstate.sync.central_store import CentralStore

__all__ = ["create_app"]

_STATE_PATH = STATE_PATH.encode()


class BodyLimit:
    """Refuse request bodies over `limit` bytes with 413, before they are read whole; the
    paths ending in one of `batch_paths` (a flush, a batched read) over `batch_limit`."""

    def __init__(self, app: ASGIApp, limit: int, batch_paths: tuple[str, ...] = (),
                 batch_limit: int = 0) -> None:
        self.app = app
        self.default_limit = limit
        self.batch_paths = batch_paths
        self.batch_limit = batch_limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = (self.batch_limit if str(scope.get("path", "")).endswith(self.batch_paths)
                 else self.default_limit)
        message = f"the request body is over {limit} bytes"
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    too_big = int(value) > limit
                except ValueError:
                    too_big = False
                if too_big:
                    await error_response(413, "too_large", message)(scope, receive, send)
                    return
        received = 0

        async def limited() -> Message:
            nonlocal received
            msg = await receive()
            if msg["type"] == "http.request":
                received += len(msg.get("body", b""))
                if received > limit:  # a chunked body with no Content-Length
                    raise HTTPException(413, message)
            return msg

        await self.app(scope, limited, send)


class RawStatePath:
    """Route ``/api/v1/state/{owner}/{key}`` on the raw, still percent-encoded path.

    Routing runs on the decoded path, where a ``%2F`` inside a name is a ``/`` like the one
    between owner and key: a key ending in ``/`` then matched no route and Starlette redirected
    the request (307) to another state variable's URL, and a name holding a newline matched no
    route either (the route's pattern stops at one). The routes take the names from the raw path
    anyway (`localstate.api.paths.state_name`), so routing on it changes nothing else.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        raw = scope.get("raw_path") if scope["type"] == "http" else None
        # mounted (Airflow's API server mounts the app under /localstate): the raw path holds
        # the mount's root_path before the app's own path, as Starlette's decoded path does
        root = str(scope.get("root_path", "")).encode()
        if isinstance(raw, bytes) and raw.startswith(root + _STATE_PATH):
            with contextlib.suppress(UnicodeDecodeError):  # not ASCII: state_name says 400
                scope = {**scope, "path": raw.split(b"?", 1)[0].decode("ascii")}
        await self.app(scope, receive, send)


def create_app(
    store: StateStore,
    *,
    settings: Settings | None = None,
    tokens: Sequence[ApiToken] | None = None,
    central: CentralStore | None = None,
    manage_store: bool = False,
    auth: Authorizer | None = None,
    asset_states: bool = False,
) -> FastAPI:
    """The API and UI over `store`.

    `tokens` default to ``settings.api_tokens`` (`settings` defaults to the store's); with
    none the API is open. `auth` replaces the token check altogether (the Airflow plugin's
    authorizer also admits Airflow's users). `central` defaults to one the lifespan opens on
    the store's ``central_url`` (give one when the store's sink is not the SQL central DB).
    `asset_states`: the central DB is Airflow's metadata DB, whose ``asset_state_store`` holds
    Airflow's asset state (`localstate.api.sink_routes` then reads it for ``sink = airflow``).
    """
    s = settings or store.settings
    if auth is None:
        auth = Authorizer(s.api_tokens if tokens is None else tokens)
    reader: list[CentralStore | None] = [central]

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        async with contextlib.AsyncExitStack() as stack:
            if manage_store:
                await stack.enter_async_context(store)
            if central is None:
                opened = await CentralStore.open(
                    store.settings.resolved_central_url,
                    upgrade_schema=store.settings.upgrade_schema,
                    transaction_timeout=store.settings.central_transaction_timeout)
                stack.push_async_callback(opened.close)
                reader[0] = opened
                stack.callback(reader.__setitem__, 0, None)
            yield

    app = FastAPI(
        title="localstate",
        version=__version__,
        description="State variables of Airflow triggers: read, list, fix a watermark, and "
                    "watch the local caches flush to the central DB.",
        openapi_url="/api/v1/openapi.json",
        docs_url="/api/docs",
        redoc_url=None,
        lifespan=lifespan,
    )
    install_error_handlers(app)
    app.include_router(build_router(store, auth, lambda: reader[0]))
    app.include_router(build_sink_router(store, auth, lambda: reader[0],
                                         asset_states=asset_states,
                                         max_rows=s.api_max_batch_rows))
    app.include_router(build_ui_router())
    # value limit, room for JSON whitespace and escapes, and the body's own fields; a batch
    # (sink = api) splits its requests below MAX_BATCH_BODY
    app.add_middleware(BodyLimit, limit=4 * s.max_value_bytes + 64 * 1024,
                       batch_paths=SINK_PATHS, batch_limit=s.api_max_request_bytes)
    app.add_middleware(RawStatePath)
    # outermost: a cross-site write is refused before its body is read
    app.add_middleware(CsrfGuard, trusted_origins=s.api_trusted_origins)
    return app
