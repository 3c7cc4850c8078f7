"""The ``/api/v1`` routes: state variables, status, health.

Reads show what the central DB committed (through the app's own `CentralStore`, on the server's
event loop), so a read that starts after a write was acknowledged sees that write or a later
one. The server's local store's unfinished business (dirty keys, keys whose last flush met a
conflict), when it has one (``localstate serve``), is overlaid only when asked for with
``?pending=true``, marked by its ``flush_state`` (see `localstate.api._view`).

Writes are one statement each on the central DB, answered from that statement's own row: a
PUT with ``expected_version`` is a compare-and-set against the committed version, a plain PUT
an unconditional upsert, a DELETE a compare-and-delete (`CentralStore.delete_current`). When a
PUT or DELETE answers, the central DB holds it. A write takes effect at the commit of its one
statement and its answer is that statement's row, never a read made after it (which could show
another request's write): the writes are linearizable. No local store is written through: a
process that also writes these keys through a store meets the API's writes at its flush's
version fence, like any other writer.

Handlers are module-level; they take the server's parts through the dependencies of
`localstate.api._context`.
"""

# No `from __future__ import annotations` here: FastAPI reads the route signatures at run
# time.
import logging
import time
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Request, Response

from localstate import __version__
from localstate._cache.entry import StateKey
from localstate._core.codec import encode
from localstate._core.model import (
    MAX_VERSION,
    NAME_RULE,
    FlushState,
    Record,
    check_name,
    epoch_to_datetime,
)
from localstate._sync.central.fleet import fleet_summary
from localstate.api._auth import audit
from localstate.api._context import Caller, Central, Context, Writable
from localstate.api._errors import ApiError
from localstate.api._paths import decode_cursor, encode_cursor, state_name
from localstate.api._schemas import (
    ErrorBody,
    Fleet,
    FleetMember,
    Health,
    Me,
    PutBody,
    StateItem,
    StateList,
    Status,
)
from localstate.api._view import Item, item_from_row, local_override, local_overrides

__all__ = ["MAX_PAGE", "router"]

log = logging.getLogger("localstate.api.routes")

MAX_PAGE = 1000

_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorBody, "description": text}
    for code, text in {
        401: "no token, or not a valid one", 403: "outside the token's owners or role",
        422: "bad input (names, value, query)", 502: "the central DB failed on this request",
        503: "the central DB is unavailable",
    }.items()
}


def _named(owner: str, key: str) -> str:
    return f"owner {owner!r} key {key!r}"


def _state_item(item: Item | Record) -> StateItem:
    state = item.flush_state
    return StateItem(
        owner=item.owner, key=item.key, value=item.value, version=item.version,
        updated_at=item.updated_at, updated_by=item.updated_by,
        flush_state=FlushState(state).value,
    )


router = APIRouter(prefix="/api/v1")

OwnerDoc = Annotated[str, Path(
    description=f"the owner, percent-encoded (a '/' is %2F): {NAME_RULE}; else 422 "
                "invalid_name, naming the character")]
KeyDoc = Annotated[str, Path(
    description=f"the key, percent-encoded: {NAME_RULE}; else 422 invalid_name, naming the "
                "character")]
Pending = Annotated[bool, Query(
    description="overlay the server's local store's writes the central DB lacks (flush_state "
                "dirty) and its keys whose last flush met a conflict (flush_state conflict); "
                "by default a read shows only what the central DB committed")]
_ITEM_PATH = "/state/{owner:path}/{key}"


@router.get("/state", response_model=StateList, responses=_ERRORS,
            summary="List state variables (cursor pagination)")
async def list_state(
    caller: Caller,
    ctx: Context,
    c: Central,
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
    overrides = (local_overrides(ctx.local, prefixes, after)
                 if pending and ctx.local is not None else {})
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


@router.get(_ITEM_PATH, response_model=StateItem, responses={
    **_ERRORS, 404: {"model": ErrorBody, "description": "no value"}},
            summary="Read one state variable")
async def get_state(request: Request, caller: Caller, ctx: Context, c: Central, owner: OwnerDoc,
                    key: KeyDoc, pending: Pending = False) -> StateItem:
    owner, key = state_name(request)
    caller.require_read(owner)
    item = (local_override(ctx.local, (owner, key))
            if pending and ctx.local is not None else None)
    if item is None:
        row = (await c.read_many([(owner, key)])).get((owner, key))
        item = None if row is None else item_from_row(row)
    if item is None or item.deleted:
        raise ApiError(404, "not_found", f"{_named(owner, key)} has no value")
    return _state_item(item)


@router.put(_ITEM_PATH, response_model=StateItem, responses={**_ERRORS, 409: {
    "model": ErrorBody, "description": "expected_version is not the committed version"},
    413: {"model": ErrorBody, "description": "the value is over max_value_bytes"}},
    summary="Write one state variable (in the central DB when this answers)")
async def put_state(request: Request, caller: Caller, ctx: Context, c: Writable,
                    owner: OwnerDoc, key: KeyDoc, body: PutBody) -> StateItem:
    owner, key = state_name(request)
    caller.require_write(owner)
    data = encode(body.value, ctx.settings.max_value_bytes)  # 4xx before any query
    by = caller.identity or ctx.writer_name
    if body.expected_version is None:
        row = await c.write_direct(owner, key, data, updated_at=time.time(), updated_by=by)
    else:
        row = await c.write_if_version(owner, key, data, body.expected_version, updated_by=by)
    audit(caller, "PUT /api/v1/state", (owner,), 1,
          f"{_named(owner, key)} now at version {row.version}")
    return _state_item(item_from_row(row))


@router.delete(_ITEM_PATH, status_code=204, response_class=Response, responses={
    **_ERRORS, 404: {"model": ErrorBody, "description": "no value to delete"},
    409: {"model": ErrorBody, "description": "expected_version is not the committed one"}},
    summary="Delete one state variable (in the central DB when this answers)")
async def delete_state(
    request: Request, caller: Caller, ctx: Context, c: Writable, owner: OwnerDoc, key: KeyDoc,
    expected_version: Annotated[int | None, Query(
        ge=1, le=MAX_VERSION,
        description="delete only if the committed record is at this version")] = None,
) -> Response:
    owner, key = state_name(request)
    caller.require_write(owner)
    by = caller.identity or ctx.writer_name
    if expected_version is not None:
        await c.write_if_version(owner, key, None, expected_version, updated_by=by)
    elif not await c.delete_current(owner, key, updated_by=by):
        raise ApiError(404, "not_found", f"{_named(owner, key)} has no value to delete")
    audit(caller, "DELETE /api/v1/state", (owner,), 1, f"{_named(owner, key)} deleted")
    return Response(status_code=204)


@router.get("/status", response_model=Status, responses=_ERRORS,
            summary="Cache and sync-worker health of the server's local store (a server "
                    "without one: its own writes to the central DB)")
async def status(caller: Caller, ctx: Context) -> Status:
    sink = ctx.central
    where = sink.url if sink is not None else "(not open)"
    shown = where if caller.admin else "(hidden: shown to admins only)"
    committed = sink.events_committed if sink is not None else 0
    if ctx.local is None:  # no cache of its own: what it wrote to the central DB
        transactions = sink.transactions if sink is not None else 0
        rows = sink.rows_written if sink is not None else 0
        return Status(
            triggerer_id=ctx.writer_name, cache_enabled=False, cache_turning_off=False,
            cache_turning_off_s=0.0, central_url=shown,
            dirty_keys=0, flush_lag_s=0.0, flush_lag_p50_s=None, flush_lag_p99_s=None,
            last_flush_at=None, flushes=0, conflicts=0, central_errors=0, last_error=None,
            sets=0, gets=0, central_transactions=transactions, central_rows=rows,
            keys_in_memory=0, throughput=ctx.meter.sample(0, rows),
            events_committed=committed, events_pending=0, oldest_pending_event_s=0.0,
            events_by_owner={},
        )
    s = ctx.local.stats()
    return Status(
        triggerer_id=ctx.local.triggerer_id, cache_enabled=s.cache_enabled,
        cache_turning_off=s.cache_turning_off, cache_turning_off_s=s.cache_turning_off_s,
        central_url=shown, dirty_keys=s.dirty_keys, flush_lag_s=s.oldest_unflushed_s,
        flush_lag_p50_s=s.flush_lag_p50_s, flush_lag_p99_s=s.flush_lag_p99_s,
        last_flush_at=None if s.last_flush_at is None else epoch_to_datetime(s.last_flush_at),
        flushes=s.flushes, conflicts=s.conflicts, central_errors=s.central_errors,
        last_error=s.last_error if caller.admin or s.last_error is None
        else "(hidden: shown to admins only; see the server's log)", sets=s.sets, gets=s.gets,
        central_transactions=s.central_transactions, central_rows=s.central_rows,
        keys_in_memory=s.keys_in_memory, throughput=ctx.meter.sample(s.sets, s.central_rows),
        events_committed=committed, events_pending=s.events_pending,
        oldest_pending_event_s=s.oldest_pending_event_s, events_by_owner=s.events_by_owner,
    )


@router.get("/fleet", response_model=Fleet, responses=_ERRORS,
            summary="Every triggerer's lag and backlog, from the fleet table")
async def fleet(caller: Caller, ctx: Context, c: Central) -> Fleet:
    rows = await c.read_fleet()
    if caller.owners != ("",):  # a tenant's token: its own triggerer, no one else's
        rows = [r for r in rows if caller.bound and r.triggerer == caller.identity]
    details = caller.admin or ctx.settings.api_fleet_details
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
            responses={503: {"model": Health, "description": "the server is shutting down, "
                                                            "or its local store is closed"}})
async def health(response: Response, ctx: Context) -> Health:
    if ctx.closed:
        response.status_code = 503
    return Health(status="closed" if ctx.closed else "ok", version=__version__,
                  auth_required=ctx.auth.required)
