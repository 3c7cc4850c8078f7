"""What the route handlers take: the server's `ServerContext` and the dependencies giving it.

The app (`localstate.api._app.create_app`) keeps one `ServerContext` on ``app.state``: its
settings, its authorizer, its own `CentralStore` (opened by the app's lifespan, or given), the
optional local `StateStore` whose unfinished writes ``?pending=true`` overlays (``localstate
serve``'s), and the status page's rate meter. Handlers are module-level functions that take these
through FastAPI dependencies: `Caller` (the request's `Principal`, 401 without a valid
token), `Context`, `Central` (503 before the lifespan opened the central DB) and `Writable`
(also 503 once the server is shutting down, or its local store is closed).
"""

# No `from __future__ import annotations`: FastAPI reads the dependencies' signatures at run
# time.
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Any

from fastapi import Depends, Request
from fastapi.security import HTTPBearer

from localstate._core.config import Settings
from localstate._store import StateStore
from localstate._sync.central.central_store import CentralStore
from localstate.api._auth import Authorizer, Principal
from localstate.api._errors import ApiError
from localstate.api._schemas import Throughput
from localstate.errors import StoreClosed

__all__ = ["Caller", "Central", "Context", "RateMeter", "ServerContext",
           "Writable", "caller", "central", "context", "writable"]

class RateMeter:
    """Recent rates of two counters, from samples at most one a second over `window` s."""

    def __init__(self, window: float = 60.0, clock: Callable[[], float] = time.monotonic
                 ) -> None:
        self.window = window
        self._clock = clock
        self._samples: deque[tuple[float, int, int]] = deque()

    def sample(self, sets: int, rows: int) -> Throughput | None:
        now = self._clock()
        if not self._samples or now - self._samples[-1][0] >= 1.0:
            self._samples.append((now, sets, rows))
        while len(self._samples) > 2 and now - self._samples[1][0] >= self.window:
            self._samples.popleft()
        t0, sets0, rows0 = self._samples[0]
        span = now - t0
        if span <= 0:
            return None
        return Throughput(window_s=round(span, 3), sets_per_s=max(0, sets - sets0) / span,
                          central_rows_per_s=max(0, rows - rows0) / span)


@dataclass
class ServerContext:
    """One app's server: what every handler reads (see the module)."""

    settings: Settings
    auth: Authorizer
    #: the local store whose unfinished writes ``?pending=true`` overlays, and whose cache
    #: and flush figures the status shows (``localstate serve``'s); None: the server has none
    local: StateStore | None = None
    #: the central DB is Airflow's, whose ``asset_state_store`` /api/v1/read may read
    asset_states: bool = False
    #: the app's own reader and writer of the central DB: set by its lifespan (or given)
    central: CentralStore | None = None
    #: the lifespan has ended: writes answer 503
    stopped: bool = False
    meter: RateMeter = field(default_factory=RateMeter)

    @property
    def closed(self) -> bool:
        """The server takes no more writes: shutting down, or its local store closed."""
        return self.stopped or (self.local is not None and self.local.closed)

    @property
    def writer_name(self) -> str:
        """Who a write of the open API (no caller identity) is recorded as."""
        if self.local is not None:
            return self.local.triggerer_id
        return self.settings.resolved_triggerer_id


_bearer = HTTPBearer(
    auto_error=False, scheme_name="bearer",
    description="a token from the api_tokens setting (none configured: no token needed)",
)


def context(request: Request) -> ServerContext:
    """The app's `ServerContext`."""
    found: ServerContext = request.app.state.localstate
    return found


async def caller(request: Request, _credentials: Annotated[Any, Depends(_bearer)]
                 ) -> Principal:
    """The request's `Principal` (401 without a valid token, when tokens are configured)."""
    return await context(request).auth.principal(request)


def central(request: Request) -> CentralStore:
    """The app's own reader of the central DB (503 before the app's lifespan opened it)."""
    found = context(request).central
    if found is None:
        raise ApiError(503, "store_unavailable",
                       "the app has not started: run it under an ASGI server (its lifespan "
                       "opens the central DB), or pass central= to create_app")
    return found


def writable(request: Request) -> CentralStore:
    """`central`, for a write: 503 too once the server is shutting down (or its local store
    is closed)."""
    if context(request).closed:
        raise StoreClosed("the API server is shutting down: it takes no more writes")
    return central(request)


Caller = Annotated[Principal, Depends(caller)]
Context = Annotated[ServerContext, Depends(context)]
Central = Annotated[CentralStore, Depends(central)]
Writable = Annotated[CentralStore, Depends(writable)]
