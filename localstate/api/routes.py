"""The ``/api/v1`` routes: state variables, status, health.

Reads show what the central DB committed (through the app's own `CentralStore`, on the server's
event loop: the store may talk to the DB from a thread of its own), so a read that starts after
a write was acknowledged sees that write or a later one. The serving store's unfinished business
(dirty keys, keys whose last flush met a conflict) is overlaid only when asked for with
``?pending=true``, marked by its ``flush_state`` (see `localstate.api.view`).

Writes are one statement each on the central DB (see `localstate.api.writes`): a PUT with
``expected_version`` is a compare-and-set against the committed version, a plain PUT an
unconditional upsert, a DELETE a compare-and-delete; each answers from its own statement's row.
When a PUT or DELETE answers, the central DB holds it.
"""

# No `from __future__ import annotations` here: FastAPI reads the route signatures at run
# time, and the Annotated aliases below are local to build_router.
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query, Request, Response
from fastapi.security import HTTPBearer

from localstate import __version__
from localstate.api.audit import audit
from localstate.api.auth import Authorizer, Principal
from localstate.api.errors import ApiError
from localstate.api.paths import decode_cursor, encode_cursor, state_name
from localstate.api.schemas import (
    ErrorBody,
    Fleet,
    FleetMember,
    Health,
    Me,
    PutBody,
    StateItem,
    StateList,
    Status,
    Throughput,
)
from localstate.api.view import Item, item_from_row, local_override, local_overrides
from localstate.api.writes import delete_current, delete_if_version, put
from localstate.codec import encode
from localstate.entry import StateKey
from localstate.model import MAX_VERSION, FlushState, Record, check_name, epoch_to_datetime
from localstate.store import StateStore
from localstate.sync.central_store import CentralStore
from localstate.sync.fleet import fleet_summary

__all__ = ["RateMeter", "build_router", "caller_of", "central_or_503"]

log = logging.getLogger(__name__)

MAX_PAGE = 1000

_bearer = HTTPBearer(
    auto_error=False, scheme_name="bearer",
    description="a token from the api_tokens setting (none configured: no token needed)",
)

_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorBody, "description": text}
    for code, text in {
        401: "no token, or not a valid one", 403: "outside the token's owners or role",
        422: "bad input (names, value, query)", 503: "the central DB is unavailable",
    }.items()
}


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


def _named(owner: str, key: str) -> str:
    return f"owner {owner!r} key {key!r}"


def _state_item(item: Item | Record) -> StateItem:
    state = item.flush_state
    return StateItem(
        owner=item.owner, key=item.key, value=item.value, version=item.version,
        updated_at=item.updated_at, updated_by=item.updated_by,
        flush_state=FlushState(state).value,
    )


def central_or_503(central: Callable[[], CentralStore | None]) -> CentralStore:
    """The app's own reader of the central DB (503 before the app's lifespan opened it)."""
    c = central()
    if c is None:
        raise ApiError(503, "store_unavailable",
                       "the app has not started: run it under an ASGI server (its lifespan "
                       "opens the central DB), or pass central= to create_app")
    return c


def caller_of(auth: Authorizer) -> Callable[..., Awaitable[Principal]]:
    """The dependency giving the request's `Principal` (401 without a valid token)."""

    async def principal(request: Request, _credentials: Annotated[Any, Depends(_bearer)]
                        ) -> Principal:
        return await auth.principal(request)

    return principal


def build_router(store: StateStore, auth: Authorizer,
                 central: Callable[[], CentralStore | None]) -> APIRouter:
    """The routes over `store`; `central()` gives the app's own reader of the central DB."""
    router = APIRouter(prefix="/api/v1")
    meter = RateMeter()
    fleet_details = store.settings.api_fleet_details

    def require_central() -> CentralStore:
        return central_or_503(central)

    Caller = Annotated[Principal, Depends(caller_of(auth))]
    OwnerDoc = Annotated[str, Path(description="the owner, percent-encoded (a '/' is %2F)")]
    KeyDoc = Annotated[str, Path(description="the key, percent-encoded")]
    Pending = Annotated[bool, Query(
        description="overlay the serving store's writes the central DB lacks (flush_state "
                    "dirty) and its keys whose last flush met a conflict (flush_state conflict); "
                    "by default a read shows only what the central DB committed")]

    @router.get("/state", response_model=StateList, responses=_ERRORS,
                summary="List state variables (cursor pagination)")
    async def list_state(
        caller: Caller,
        owner_prefix: Annotated[str, Query(max_length=250,
                                           description="only owners starting with this")] = "",
        cursor: Annotated[str | None, Query(max_length=2000,
                                            description="next_cursor of the page before")] = None,
        limit: Annotated[int, Query(ge=1, le=MAX_PAGE, description="rows per page")] = 100,
        pending: Pending = False,
    ) -> StateList:
        if owner_prefix:
            check_name("owner_prefix", owner_prefix)
        prefixes = caller.list_prefixes(owner_prefix)
        after = decode_cursor(cursor)
        c = require_central()
        overrides = local_overrides(store, prefixes, after) if pending else {}
        tombstones = sum(1 for i in overrides.values() if i.deleted)
        merged: dict[StateKey, Item] = {}
        for prefix in prefixes:
            rows = await c.list_rows(owner_prefix=prefix, after=after,
                                     limit=limit + 1 + tombstones)
            merged.update((r[:2], item_from_row(r)) for r in rows)
        merged.update(overrides)
        # list_rows orders byte-wise (UTF-8), which is the code-point order of sorted(): the
        # page ends where every prefix's rows and the overrides agree, and the cursor (the
        # page's last key) only moves forward
        keys = sorted(k for k, i in merged.items() if not i.deleted)
        page = keys[:limit]
        more = len(keys) > limit
        return StateList(items=[_state_item(merged[k]) for k in page],
                         next_cursor=encode_cursor(page[-1]) if more else None)

    item_path = "/state/{owner:path}/{key}"

    @router.get(item_path, response_model=StateItem, responses=_ERRORS,
                summary="Read one state variable")
    async def get_state(request: Request, caller: Caller, owner: OwnerDoc, key: KeyDoc,
                        pending: Pending = False) -> StateItem:
        owner, key = state_name(request)
        caller.require_read(owner)
        item = local_override(store, (owner, key)) if pending else None
        if item is None:
            row = (await require_central().read_many([(owner, key)])).get((owner, key))
            item = None if row is None else item_from_row(row)
        if item is None or item.deleted:
            raise ApiError(404, "not_found", f"{_named(owner, key)} has no value")
        return _state_item(item)

    @router.put(item_path, response_model=StateItem, responses={**_ERRORS, 409: {
        "model": ErrorBody, "description": "expected_version is not the committed version"}},
        summary="Write one state variable (in the central DB when this answers)")
    async def put_state(request: Request, caller: Caller, owner: OwnerDoc, key: KeyDoc,
                        body: PutBody) -> StateItem:
        owner, key = state_name(request)
        caller.require_write(owner)
        data = encode(body.value, store.settings.max_value_bytes)  # 4xx before any query
        row = await put(store, require_central(), (owner, key), data, body.expected_version,
                        by=caller.identity or store.triggerer_id)
        audit(caller, "PUT /api/v1/state", (owner,), 1,
              f"{_named(owner, key)} now at version {row.version}")
        return _state_item(item_from_row(row))

    @router.delete(item_path, status_code=204, response_class=Response, responses={
        **_ERRORS, 404: {"model": ErrorBody, "description": "no value to delete"},
        409: {"model": ErrorBody, "description": "expected_version is not the committed one"}},
        summary="Delete one state variable (in the central DB when this answers)")
    async def delete_state(
        request: Request, caller: Caller, owner: OwnerDoc, key: KeyDoc,
        expected_version: Annotated[int | None, Query(
            ge=1, le=MAX_VERSION,
            description="delete only if the committed record is at this version")] = None,
    ) -> Response:
        owner, key = state_name(request)
        caller.require_write(owner)
        c = require_central()
        by = caller.identity or store.triggerer_id
        if expected_version is not None:
            await delete_if_version(store, c, (owner, key), expected_version, by=by)
        elif not await delete_current(store, c, (owner, key), by=by):
            raise ApiError(404, "not_found", f"{_named(owner, key)} has no value to delete")
        audit(caller, "DELETE /api/v1/state", (owner,), 1, f"{_named(owner, key)} deleted")
        return Response(status_code=204)

    @router.get("/status", response_model=Status, responses=_ERRORS,
                summary="Cache and sync-worker health of the serving store")
    async def status(caller: Caller) -> Status:
        s = store.stats()
        sink = central()
        where = sink.url if sink is not None else "(not open)"
        return Status(
            triggerer_id=store.triggerer_id, cache_enabled=s.cache_enabled,
            cache_turning_off=s.cache_turning_off, cache_turning_off_s=s.cache_turning_off_s,
            central_url=where if caller.admin else "(hidden: shown to admins only)",
            dirty_keys=s.dirty_keys, flush_lag_s=s.oldest_unflushed_s,
            flush_lag_p50_s=s.flush_lag_p50_s, flush_lag_p99_s=s.flush_lag_p99_s,
            last_flush_at=None if s.last_flush_at is None else epoch_to_datetime(
                s.last_flush_at),
            flushes=s.flushes, conflicts=s.conflicts, central_errors=s.central_errors,
            last_error=s.last_error if caller.admin or s.last_error is None
            else "(hidden: shown to admins only; see the server's log)", sets=s.sets, gets=s.gets,
            central_transactions=s.central_transactions, central_rows=s.central_rows,
            keys_in_memory=s.keys_in_memory, throughput=meter.sample(s.sets, s.central_rows),
            events_committed=sink.events_committed if sink is not None else 0,
            events_pending=s.events_pending, oldest_pending_event_s=s.oldest_pending_event_s,
            events_by_owner=s.events_by_owner,
        )

    @router.get("/fleet", response_model=Fleet, responses=_ERRORS,
                summary="Every triggerer's lag and backlog, from the fleet table")
    async def fleet(caller: Caller) -> Fleet:
        rows = await require_central().read_fleet()
        if caller.owners != ("",):  # a tenant's token: its own triggerer, no one else's
            rows = [r for r in rows if caller.bound and r.triggerer == caller.identity]
        details = caller.admin or fleet_details
        view = fleet_summary(rows, time.time())
        members = [FleetMember(**{
            **m, "last_flush_at": epoch_to_datetime(m["last_flush_at"]),
            "oldest_unflushed_at": None if m["oldest_unflushed_at"] is None
            else epoch_to_datetime(m["oldest_unflushed_at"]),
            **({} if details else {"host": None, "pid": None}),
        }) for m in view["triggerers"]]
        return Fleet(**{**view, "triggerers": members})

    @router.get("/me", response_model=Me, responses=_ERRORS,
                summary="Who the caller is and what it may do (the page hides what it may not)")
    async def me(caller: Caller) -> Me:
        return Me(name=caller.name, can_write=caller.can_write, owners=list(caller.owners))

    @router.get("/health", response_model=Health, summary="Liveness (no token needed)",
                responses={503: {"model": Health, "description": "the store is closed"}})
    async def health(response: Response) -> Health:
        if store.closed:
            response.status_code = 503
        return Health(status="closed" if store.closed else "ok", version=__version__,
                      auth_required=auth.required)

    return router
