"""`create_app`: the FastAPI application of a localstate API server.

    app = create_app(settings)              # tokens from settings.api_tokens

Routes: ``/api/v1/state`` (list), ``/api/v1/state/{owner}/{key}`` (GET, PUT, DELETE),
``/api/v1/status``, ``/api/v1/health``; the batched endpoints of ``sink = api``
(``/api/v1/flush``, ``/read``, ``/claim``, ``/write``); the OpenAPI document at
``/api/v1/openapi.json`` (and its browser view at ``/api/docs``); the web UI at ``/``. See
`localstate.api._routes` and `localstate.api._sink_routes` for what each route does.

The server is its settings and a `CentralStore`: the application's lifespan (run by any ASGI
server) opens one on ``settings.central_url`` for every read and write of the routes, and
closes it at shutdown; pass `central` to use another one (then the caller closes it). A local
`StateStore` (``localstate serve``'s) is optional: ``?pending=true`` reads overlay its
unfinished writes, and the status shows its cache and flush figures. With
``manage_local=True`` the lifespan also opens that store and closes it at shutdown;
otherwise the caller owns it.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

from fastapi import FastAPI
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from localstate import __version__
from localstate._core.config import Settings
from localstate._core.model import NAME_RULE
from localstate._core.setting_specs import ApiToken
from localstate._store import StateStore
from localstate._sync.central.central_store import CentralStore
from localstate._sync.central.history import HistoryPolicy
from localstate.api._auth import Authorizer
from localstate.api._context import ServerContext
from localstate.api._csrf import CsrfGuard
from localstate.api._errors import ApiError, error_response, install_error_handlers
from localstate.api._history_routes import router as history_router
from localstate.api._paths import STATE_PATH
from localstate.api._routes import router
from localstate.api._sink_routes import SINK_PATHS
from localstate.api._sink_routes import router as sink_router
from localstate.api._ui import build_ui_router

__all__ = ["RawStatePath", "create_app"]

class BodyLimit:
    """Refuse request bodies over `limit` bytes with 413 ``too_large``, before they are read
    whole; the paths ending in one of `batch_paths` (a flush, a batched read) over
    `batch_limit`. The answer names the limit, and in ``detail`` its bytes and the setting
    that sets it.

    A request that declares its length (``Content-Length``, no ``Transfer-Encoding``) is
    judged by it, once, before any of its body is read: the HTTP server delivers no more body
    than that (h11 and httptools refuse a request whose body runs past it, or that declares
    both). A body of no declared length (chunked) is counted as it comes, and refused once it
    passes the limit: at most `limit` bytes of it are ever held.
    """

    def __init__(self, app: ASGIApp, limit: int, batch_paths: tuple[str, ...] = (),
                 batch_limit: int = 0) -> None:
        self.app = app
        self.default_limit = limit
        self.batch_paths = batch_paths
        self.batch_limit = batch_limit

    def _refusal(self, batch: bool) -> ApiError:
        if batch:
            limit, setting = self.batch_limit, "api_max_request_bytes"
            what = ("the request body is over api_max_request_bytes "
                    f"({self.batch_limit} bytes); send smaller batches")
        else:
            limit, setting = self.default_limit, "max_value_bytes"
            what = (f"the request body is over {self.default_limit} bytes, more than a value "
                    "of max_value_bytes can need (4 x max_value_bytes + 64 KiB)")
        return ApiError(413, "too_large", what, detail={"limit": limit, "setting": setting})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        batch = str(scope.get("path", "")).endswith(self.batch_paths)
        limit = self.batch_limit if batch else self.default_limit
        declared: int | None = None
        chunked = False
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = None
                if declared is not None and declared > limit:
                    refusal = self._refusal(batch)
                    await error_response(refusal.status, refusal.error, refusal.message,
                                         refusal.detail)(scope, receive, send)
                    return
            elif name == b"transfer-encoding":
                chunked = True
        if declared is not None and declared >= 0 and not chunked:
            await self.app(scope, receive, send)  # within the limit, and no more comes
            return
        received = 0

        async def limited() -> Message:
            nonlocal received
            msg = await receive()
            if msg["type"] == "http.request":
                received += len(msg.get("body", b""))
                if received > limit:  # a chunked body with no Content-Length
                    raise self._refusal(batch)
            return msg

        await self.app(scope, limited, send)


class RawStatePath:
    """Route the paths under `prefix` (``/api/v1/state/``: ``{owner}/{key}``) on the raw,
    still percent-encoded path.

    Routing runs on the decoded path, where a ``%2F`` inside a name is a ``/`` like the one
    between owner and key: a key ending in ``/`` then matched no route and Starlette redirected
    the request (307) to another state variable's URL, and a name holding a newline matched no
    route either (a route's pattern, and a mount's, stops at one). The routes take the names
    from the raw path anyway (`localstate.api._paths.state_name`), which says 422
    ``invalid_name`` for a control character, so routing on it changes nothing else.

    Airflow's API server routes to the plugin's mount on the decoded path too, before this
    app sees the request: the plugin adds this middleware to Airflow's app as well, with the
    mount's prefix (`localstate.airflow.plugin`), so a newline reaches the same 422.
    """

    def __init__(self, app: ASGIApp, prefix: str = STATE_PATH) -> None:
        self.app = app
        self.prefix = prefix.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        raw = scope.get("raw_path") if scope["type"] == "http" else None
        # mounted (Airflow's API server mounts the app under /localstate): the raw path holds
        # the mount's root_path before the app's own path, as Starlette's decoded path does
        root = str(scope.get("root_path", "")).encode()
        if isinstance(raw, bytes) and raw.startswith(root + self.prefix):
            with contextlib.suppress(UnicodeDecodeError):  # not ASCII: state_name says 400
                scope = {**scope, "path": raw.split(b"?", 1)[0].decode("ascii")}
        await self.app(scope, receive, send)


def create_app(
    settings: Settings,
    *,
    central: CentralStore | None = None,
    local: StateStore | None = None,
    manage_local: bool = False,
    tokens: Sequence[ApiToken] | None = None,
    auth: Authorizer | None = None,
    asset_states: bool = False,
) -> FastAPI:
    """The API and UI of a server with `settings` (its central DB, limits and tokens).

    `tokens` default to ``settings.api_tokens``; with none the API is open. `auth` replaces
    the token check altogether (the Airflow plugin's authorizer also admits Airflow's users).
    `central` defaults to one the lifespan opens on ``settings.central_url``. `local`: the
    local store whose unfinished writes ``?pending=true`` overlays (see the module).
    `asset_states`: the central DB is Airflow's metadata DB, whose ``asset_state_store`` holds
    Airflow's asset state (`localstate.api._sink_routes` then reads it for ``sink = airflow``).
    """
    if auth is None:
        auth = Authorizer(settings.api_tokens if tokens is None else tokens)
    ctx = ServerContext(settings, auth, local=local, asset_states=asset_states,
                        central=central)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        async with contextlib.AsyncExitStack() as stack:
            ctx.stopped = False
            stack.callback(setattr, ctx, "stopped", True)
            if manage_local and local is not None:
                await stack.enter_async_context(local)
            if central is None:
                opened = await CentralStore.open(
                    settings.resolved_central_url, upgrade_schema=settings.upgrade_schema,
                    transaction_timeout=settings.central_transaction_timeout)
                stack.push_async_callback(opened.close)
                opened.use_history(HistoryPolicy.of(settings))
                ctx.central = opened
                stack.callback(setattr, ctx, "central", None)
            yield

    app = FastAPI(
        title="localstate",
        version=__version__,
        description="State variables of Airflow triggers: read, list, fix a watermark, and "
                    "watch the local caches flush to the central DB.\n\n"
                    f"Owners and keys (and updated_by, claimants) are {NAME_RULE}, on every "
                    "route: in a URL (each percent-encoded as one path segment), a query or a "
                    "body. A name that breaks the rule gets 422 invalid_name, whose message "
                    "names the character and its position.",
        openapi_url="/api/v1/openapi.json",
        docs_url="/api/docs",
        redoc_url=None,
        lifespan=lifespan,
    )
    app.state.localstate = ctx
    install_error_handlers(app)
    app.include_router(router)
    app.include_router(sink_router)
    app.include_router(history_router)
    app.include_router(build_ui_router())
    # value limit, room for JSON whitespace and escapes, and the body's own fields; a batch:
    # what api_max_batch_rows rows can need, no more than a client sends (Settings)
    app.add_middleware(BodyLimit, limit=4 * settings.max_value_bytes + 64 * 1024,
                       batch_paths=SINK_PATHS, batch_limit=settings.resolved_max_request_bytes)
    app.add_middleware(RawStatePath)
    # outermost: a cross-site write is refused before its body is read
    app.add_middleware(CsrfGuard, trusted_origins=settings.api_trusted_origins)
    return app
