"""The batched sink endpoints: what `sink = api` (`localstate._sync.sinks.api_sink.ApiSink`) calls.

* ``POST /api/v1/flush``: a batch of fenced rows (`DirtyRow`), the writer id (the client's
  cache file) and the client's conflict policies (its ``conflict_policy`` setting). The whole
  batch goes through the central store's `write_batch` in ONE transaction, with the same fence
  and policies as the SQL sink; the answer is each row's `FlushOutcome` (written, adopted with
  the central record, or retry). With events, each event's status; their history rows name
  the caller's identity as the triggerer that flushed them (else the ``triggerer`` the body
  names).
* ``POST /api/v1/read``: the central records (tombstones included) of a list of keys, or of
  one owner: one query for a batch of read-through misses, or a `load(owner)`. With
  ``"source": "asset_state_store"`` the keys (of ``asset_watcher:<asset name>`` owners) are
  read from Airflow's own ``asset_state_store`` instead (`localstate._sync.sinks.asset_states`), as
  ``sink = airflow`` reads its misses in batches; only a server in Airflow's API server on
  Airflow's default state backend offers it (else 404 ``no_asset_state_store``).
* ``POST /api/v1/write``: one write in its own transaction (the client's cache-off path): an
  unconditional write, a compare-and-set (409 `version_conflict` when the committed version is
  not the expected one), or a compare-and-delete of the current value.
* ``POST /api/v1/claim``: bump an owner's claim epoch (a trigger started on the caller).
* ``POST /api/v1/release``: record in an owner's history that the caller released it at the
  epoch it held (the trigger left it); the claim itself stands.

Bodies follow `localstate._core.protocol`. Authorization: the bearer token's owner prefixes cover
every owner a request names and, for the writes, its role is read-write: otherwise 403 and
nothing is read or written. The body is read only after the token is checked.
"""

# No `from __future__ import annotations`: FastAPI reads the route signatures at run time.
import asyncio
import functools
import logging
import math
import re
from collections.abc import Iterable, Sequence
from operator import attrgetter
from typing import Any, Final, NamedTuple

from fastapi import APIRouter, Request, Response

from localstate._cache.entry import UNKNOWN_BASE, StateKey
from localstate._core.codec import decode
from localstate._core.conflicts import PolicyMap
from localstate._core.model import MAX_VERSION, asset_name, check_name, check_names
from localstate._core.protocol import (
    ASSET_STATE_SOURCE,
    WireError,
    decode_body,
    decode_rows,
    encode_body,
    encode_outcomes,
    encode_rows,
    field_header,
)
from localstate._core.rows import CentralRow, DirtyRow, EventRow, FlushOutcome
from localstate._sync.central.central_store import CentralStore
from localstate._sync.central.fleet import FleetStatus
from localstate._sync.sinks.asset_states import read_asset_states
from localstate.api._auth import Principal, audit, claimed_detail, recorded_as
from localstate.api._context import Caller, Central, Context, ServerContext, Writable
from localstate.api._errors import ApiError
from localstate.api._schemas import error_responses
from localstate.errors import ConfigError, OwnerLost, ValueTooLarge

__all__ = ["SINK_PATHS", "router"]

log = logging.getLogger("localstate.api.sink_routes")

#: the paths whose bodies are batches (the app lets them be larger than one value's)
SINK_PATHS: Final = ("/api/v1/flush", "/api/v1/read")
#: keys one read may name
MAX_READ_KEYS: Final = 100_000
#: 9999-12-31T23:59:59Z: the latest time every central DB's timestamp column holds
_MAX_TIME: Final = 253_402_300_799.0
#: a pid's column is a 32-bit integer
_MAX_PID: Final = 2**31 - 1
#: the writer column's length
_MAX_WRITER: Final = 64
#: flush bodies larger than this are decoded and checked in a worker thread
_OFF_LOOP_BYTES: Final = 256 * 1024
#: a run of digits as long as 2^63's: the only JSON texts that may hold a wider integer
_LONG_DIGITS: Final = re.compile(r"\d{19}")
_JSON: Final = "application/json"
#: distinct conflict_policy specs whose PolicyMap the server keeps (clients share a few)
_POLICY_CACHE: Final = 64
_OUTCOME_HEADER: Final = field_header(FlushOutcome, CentralRow)
_CENTRAL_HEADER: Final = field_header(CentralRow)
_FLEET_HEADER: Final = field_header(FleetStatus)


def _json(body: dict[str, Any]) -> Response:
    return Response(encode_body(body), media_type=_JSON)


def _policies(spec: Any) -> PolicyMap:
    """A client's policy map (its conflict_policy setting), parsed once per distinct spec."""
    if not isinstance(spec, str) and not (
            isinstance(spec, dict)
            and all(isinstance(k, str) and isinstance(v, str) for k, v in spec.items())):
        raise WireError("'policies' must be a policy spec (a string) or an object mapping "
                        "owner globs to policy specs (the conflict_policy setting)")
    try:
        return _policy_map(spec if isinstance(spec, str) else tuple(spec.items()))
    except ConfigError as exc:
        raise WireError(f"'policies' is not a valid conflict_policy: {exc}") from None


@functools.lru_cache(maxsize=_POLICY_CACHE)
def _policy_map(spec: str | tuple[tuple[str, str], ...]) -> PolicyMap:
    return PolicyMap(spec if isinstance(spec, str) else dict(spec))


def _check_rows(rows: Sequence[DirtyRow], max_value_bytes: int) -> None:
    """A flush's values (the wire checked their types): names, JSON, size, versions, one
    key once. Column by column (each distinct name checked once, the JSON parsed in C)."""
    for field in ("owner", "key", "updated_by"):
        check_names(field, set(map(attrgetter(field), rows)))
    versions = list(map(attrgetter("version"), rows))
    if min(versions) < 1 or max(versions) >= MAX_VERSION:
        raise WireError(f"a version is not from 1 to {MAX_VERSION - 1} (2^63 - 2: a key at "
                        "the ceiling could never be written again); delete the key and write "
                        "it afresh, or restart its versions lower")
    bases = list(map(attrgetter("base_version"), rows))
    if min(bases) < UNKNOWN_BASE or max(bases) >= MAX_VERSION:
        raise WireError("a base_version is out of range")
    epochs = list(map(attrgetter("epoch"), rows))
    if min(epochs) < 0 or max(epochs) >= MAX_VERSION:
        raise WireError(f"an epoch is not from 0 to {MAX_VERSION - 1} (at 2^63 - 1 no claim "
                        "could follow it)")
    _check_times("updated_at", map(attrgetter("updated_at"), rows))
    if len(set(zip(map(attrgetter("owner"), rows), map(attrgetter("key"), rows),
                   strict=True))) != len(rows):
        raise WireError("a flush batch names a key twice; one row per key")
    data = [d for d in map(attrgetter("data"), rows) if d is not None]
    if data and max(map(len, data)) * 4 > max_value_bytes:
        for r in rows:
            _check_data(r.owner, r.key, r.data, max_value_bytes)
        return
    try:
        list(map(decode, data))
    except ValueError:
        for r in rows:  # which one: the message names it
            _check_data(r.owner, r.key, r.data, max_value_bytes)
        raise
    for r in rows:
        if r.data is not None and _LONG_DIGITS.search(r.data):
            _check_ints(r.owner, r.key, r.data)


def _check_ints(owner: str, key: str, data: str) -> None:
    """No integer beyond 64 bits: orjson would read it back as a float (altered)."""
    import json

    def walk(v: Any) -> None:
        if isinstance(v, int) and not isinstance(v, bool) and not -2**63 <= v < 2**64:
            raise WireError(f"{owner}/{key}: data holds an integer beyond 64 bits ({v}); "
                            "store it as a string")
        if isinstance(v, list):
            for x in v:
                walk(x)
        elif isinstance(v, dict):
            for x in v.values():
                walk(x)

    walk(json.loads(data))


def _check_times(field: str, times: Iterable[float | None]) -> None:
    """POSIX times within what every central DB's timestamp holds (1970 to 9999)."""
    for t in times:
        if t is not None and not (0.0 <= t <= _MAX_TIME):  # NaN fails both
            raise WireError(f"{field} {t!r} is not a POSIX time from 0 (1970) to "
                            f"{_MAX_TIME:.0f} (year 9999)")


def _check_fleet(status: FleetStatus) -> None:
    """A flush's fleet report, within its table's columns."""
    check_name("triggerer", status.triggerer)
    check_name("host", status.host)
    if not 0 <= status.pid <= _MAX_PID:
        raise WireError(f"fleet pid {status.pid} is not from 0 to {_MAX_PID}")
    if not 0 <= status.dirty_keys <= MAX_VERSION:
        raise WireError("fleet dirty_keys is out of range")
    _check_times("fleet flushed_at", (status.flushed_at, status.oldest_unflushed))
    for name in ("rows_per_s", "flush_interval"):
        value = getattr(status, name)
        if not 0.0 <= value <= 1e12:
            raise WireError(f"fleet {name} {value!r} is not a number from 0 to 1e12")


def _check_events(events: Sequence[EventRow], max_value_bytes: int) -> None:
    """A flush's events (the wire checked their types): names, JSON payloads within
    max_value_bytes, seqs and epochs in range."""
    if not events:
        return
    check_names("owner", {e.owner for e in events})
    check_names("key", {e.key for e in events})
    for e in events:
        if not 1 <= e.seq <= MAX_VERSION or not 0 <= e.epoch <= MAX_VERSION:
            raise WireError(f"{e.owner}/{e.key}: an event's seq or epoch is out of range")
        _check_data(e.owner, e.key, e.payload, max_value_bytes)


def _check_data(owner: str, key: str, data: Any, max_value_bytes: int) -> None:
    """A value as it travels: JSON text within max_value_bytes, or None (a deletion)."""
    if data is None:
        return
    if not isinstance(data, str):
        raise WireError(f"{owner}/{key}: data must be JSON text or null")
    if len(data) * 4 > max_value_bytes:
        size = len(data.encode("utf-8", "surrogatepass"))
        if size > max_value_bytes:
            raise ValueTooLarge(f"{owner}/{key}: the value is {size} bytes, over "
                                f"max_value_bytes ({max_value_bytes})",
                                size=size, limit=max_value_bytes)
    try:
        decode(data)
    except ValueError:
        raise WireError(f"{owner}/{key}: data is not JSON text (or holds NaN, infinity "
                        "or an integer beyond 64 bits)") from None
    if _LONG_DIGITS.search(data):
        _check_ints(owner, key, data)


def _require_owners(caller: Principal, owners: Iterable[str], *, write: bool) -> None:
    """403 unless `caller` may read (or write) every one of `owners`: before any I/O."""
    if write and not caller.can_write:
        caller.require_write("")  # raises: read-only
    if caller.owners == ("",):  # every owner
        return
    for owner in set(owners):
        caller.require_read(owner)


def _writer(raw: Any) -> str | None:
    if raw is None:
        return None
    if not isinstance(raw, str):
        raise WireError("'writer' must be the cache file's id (a string) or null")
    if len(raw) > _MAX_WRITER:
        raise WireError(f"'writer' is {len(raw)} characters long; the limit is {_MAX_WRITER}")
    return check_name("writer", raw)


def _triggerer(caller: Principal, raw: Any) -> str | None:
    """The triggerer a flush's events are recorded as flushed by (their history rows): the
    caller's identity (`recorded_as`), else the triggerer id the request names, if any."""
    if raw is None:
        return caller.identity
    if not isinstance(raw, str):
        raise WireError("'triggerer' must be the writer's triggerer id (a string) or null")
    return recorded_as(caller, check_name("triggerer", raw))


class _Claimant(NamedTuple):
    """Who a claim or a release is about and by: the owner, the claimant the request names,
    the one recorded (`recorded_as`) and the caller's cache file."""

    owner: str
    named: str
    recorded: str
    writer: str | None


def _claimant(body: dict[str, Any], caller: Principal) -> _Claimant:
    """The owner and claimant of a ``/claim`` or ``/release`` body, checked."""
    owner = check_name("owner", body.get("owner"))
    named = check_name("claimant", body.get("claimant"))
    return _Claimant(owner, named, recorded_as(caller, named),
                     caller.writer_tag(_writer(body.get("writer"))))


router = APIRouter(prefix="/api/v1")


@router.post("/flush", summary="Write a batch of fenced rows in one transaction "
             "(what sink = api flushes through)", response_class=Response,
             responses=error_responses(401, 403, 422, 502, 503, s413=(
                 "too_large: the body is over api_max_request_bytes; too_many_rows: the "
                 "batch is over api_max_batch_rows")))
async def flush(request: Request, caller: Caller, ctx: Context, c: Writable) -> Response:
    if not caller.can_write:
        caller.require_write("")
    raw = await _body(request)
    try:
        if len(raw) > _OFF_LOOP_BYTES:  # parsing megabytes would stall every other request
            body, rows, events, status, named = await asyncio.to_thread(
                _parse_flush, raw, caller, ctx)
        else:
            body, rows, events, status, named = _parse_flush(raw, caller, ctx)
    except _RefusedForGood as refused:
        await c.record_rejected(refused.events, caller.writer_tag(_writer(refused.writer)),
                                _triggerer(caller, refused.triggerer))
        raise refused.error from None
    del raw  # parsed: the rows hold what the request carried
    writer = caller.writer_tag(_writer(body.get("writer")))
    policy_map = _policies(body.get("policies", "reject"))
    if caller.bound:
        await _require_own_claims(c, caller, rows, events or ())
    if status is not None:  # no await until write_batch takes it: this batch's own
        c.note_fleet(status)
    if events is None:  # a flush without events (any client)
        outcomes = await c.write_batch(rows, policy_map, writer=writer)
        audit(caller, "POST /api/v1/flush", (r.owner for r in rows), len(rows), named)
        written, full = encode_outcomes(outcomes, rows)
        return _json({"fields": _OUTCOME_HEADER, "written": written, "outcomes": full})
    # the watermarks, the de-duplication rows and the asset events: one transaction
    outcomes, statuses = await c.write_with_events(
        rows, events, policy_map, writer=writer,
        triggerer=_triggerer(caller, body.get("triggerer")))
    audit(caller, "POST /api/v1/flush", {*(r.owner for r in rows), *(e.owner for e in events)},
          len(rows), f"{len(events)} events", named)
    written, full = encode_outcomes(outcomes, rows)
    return _json({"fields": _OUTCOME_HEADER, "written": written, "outcomes": full,
                  "event_statuses": statuses})


async def _require_own_claims(c: CentralStore, caller: Principal,
                              rows: Sequence[DirtyRow], events: Sequence[EventRow]) -> None:
    """A bound caller (one triggerer's credential) flushes an owner at a claim epoch only if
    it made that claim: a row or event at the owner's current epoch claimed by another, or
    above any epoch the owner had, is 403 and nothing is written. Below the current epoch is
    a claim it lost: the fence refuses those rows as it always does."""
    epochs: dict[str, int] = {}
    for owner, epoch in [*((r.owner, r.epoch) for r in rows),
                         *((e.owner, e.epoch) for e in events)]:
        if epoch > 0:
            epochs[owner] = max(epoch, epochs.get(owner, 0))
    if not epochs:
        return
    claims = await c.read_claims(list(epochs))
    for owner, epoch in sorted(epochs.items()):
        current, claimant = claims.get(owner, (0, ""))
        if owner in claims and (epoch > current
                                or (epoch == current and claimant != caller.identity)):
            raise ApiError(403, "forbidden",
                           f"{caller.name} may not flush owner {owner!r} at claim epoch "
                           f"{epoch}: the owner's claim is {claimant!r}'s at epoch "
                           f"{current}; a triggerer flushes only the owners it claimed "
                           "(POST /api/v1/claim) with its own credential")


async def _body(request: Request) -> bytes | bytearray:
    """The request's body, gathered in one buffer (Starlette's ``request.body()`` holds its
    chunks and their join: twice the body). `localstate.api._app.BodyLimit` bounds it."""
    buffer = bytearray()
    async for chunk in request.stream():
        buffer += chunk
    return buffer


def _parse_flush(raw: bytes | bytearray, caller: Principal, ctx: ServerContext
                 ) -> tuple[dict[str, Any], list[DirtyRow], list[EventRow] | None,
                            FleetStatus | None, str]:
    """Decode and check a flush body: no I/O, so a large one runs off the event loop.
    The rows come back recorded as the caller (`recorded_as`), with the audit line's note
    of the names the request gave them; the events (None: the body carries none) checked."""
    max_rows = ctx.settings.api_max_batch_rows

    def count(rows: int) -> None:  # as the rows are decoded: no more than one slice past
        if rows > max_rows:
            raise ApiError(413, "too_many_rows", f"a flush of {rows} rows or more is over "
                           f"api_max_batch_rows ({max_rows}); send smaller batches",
                           detail={"rows": rows, "limit": max_rows,
                                   "setting": "api_max_batch_rows"})

    body = decode_body(raw, sliced="rows", on_items=count)
    # the decoded arrays go as soon as their rows are made: half the objects a large flush holds
    rows = decode_rows(DirtyRow, body.get("fields"), body.pop("rows", None))
    count(len(rows))
    _require_owners(caller, (r.owner for r in rows), write=True)
    status = None
    named = ""
    if rows:
        _check_rows(rows, ctx.settings.max_value_bytes)
        if caller.identity is not None:  # the server says who wrote, not the request
            by = caller.identity
            named = claimed_detail(caller, map(attrgetter("updated_by"), rows))
            rows = [r if r.updated_by == by else r._replace(updated_by=by) for r in rows]
        if body.get("fleet") is not None:
            status = decode_rows(FleetStatus, body.get("fleet_fields"), [body["fleet"]])[0]
            _check_fleet(status)
            if caller.bound and caller.identity is not None:  # its own fleet row only
                status = status._replace(triggerer=caller.identity)
    events = None
    if "events" in body:
        events = decode_rows(EventRow, body.get("event_fields"), body.pop("events"))
        _require_owners(caller, {e.owner for e in events}, write=True)
        try:
            _check_events(events, ctx.settings.max_value_bytes)
        except (WireError, ValueTooLarge) as exc:
            if len(events) == 1 and not rows:
                raise _RefusedForGood(events, exc, body.get("writer"),
                                      body.get("triggerer")) from exc
            raise
    return body, rows, events, status, named


class _RefusedForGood(Exception):
    """One event the checks refuse, with no rows beside it: the sink halves a refused batch
    down to single events (`SyncWorker.settle_rejected`), so this one is refused for good and
    the route records it in its owner's history before it answers."""

    def __init__(self, events: list[EventRow], error: Exception, writer: Any,
                 triggerer: Any) -> None:
        super().__init__(str(error))
        self.events = events
        self.error = error
        self.writer = writer
        self.triggerer = triggerer


@router.post("/read", summary="The central records of a batch of keys, or of one owner "
             "(tombstones included)", response_class=Response,
             responses=error_responses(401, 403, 413, 422, 502, 503, s404=(
                 "no_asset_state_store: a read of Airflow's asset_state_store from a server "
                 "that does not keep it")))
async def read(request: Request, caller: Caller, ctx: Context, c: Central) -> Response:
    body = decode_body(await request.body())
    if body.get("fleet") is True:  # the fleet table (what a write budget reads)
        fleet = await c.read_fleet()
        if not caller.admin:  # the rates a budget sums; no one else's name, host or pid
            fleet = [r if caller.bound and r.triggerer == caller.identity
                     else r._replace(triggerer="", host="", pid=0) for r in fleet]
        return _json({"fields": _FLEET_HEADER, "rows": encode_rows(fleet)})
    source = body.get("source")
    if source not in (None, ASSET_STATE_SOURCE):
        raise WireError(f"'source' must be {ASSET_STATE_SOURCE!r} or absent")
    if "owner" in body and source is None:
        owner = check_name("owner", body["owner"])
        caller.require_read(owner)
        found = await c.read_owner(owner)
    elif source is None:
        keys = _keys(body.get("keys"))
        _require_owners(caller, (o for o, _k in keys), write=False)
        found = list((await c.read_many(keys)).values())
    else:
        keys = _keys(body.get("keys"))
        _require_owners(caller, (o for o, _k in keys), write=False)
        if not ctx.asset_states:
            raise ApiError(404, "no_asset_state_store", "this localstate API server does "
                           "not read Airflow's asset_state_store: only localstate's app in "
                           "Airflow's API server (the plugin's /localstate) does, with "
                           "Airflow's default [state_store] backend")
        if not all(asset_name(o) is not None for o, _k in keys):
            raise WireError("a read of Airflow's asset_state_store names asset owners "
                            "only (asset_watcher:<asset name>), by keys")
        found = list((await read_asset_states(c, keys)).values())
    return _json({"fields": _CENTRAL_HEADER, "rows": encode_rows(found)})


@router.post("/claim", summary="Claim an owner: bump its claim epoch in one transaction "
             "(what a triggerer does when a trigger starts on it)", response_class=Response,
             responses=error_responses(401, 403, 413, 422, 502, 503))
async def claim(request: Request, caller: Caller, c: Writable) -> Response:
    body = decode_body(await request.body())
    owner, named, claimant, writer = _claimant(body, caller)
    since = body.get("unless_claimed_since")
    if since is not None and (isinstance(since, bool) or not isinstance(since, int | float)
                              or not math.isfinite(since)):
        raise ApiError(422, "invalid_input", "unless_claimed_since: a POSIX time or null")
    caller.require_write(owner)
    try:
        epoch = await c.claim(owner, claimant=claimant, writer=writer,
                              unless_claimed_since=since)
    except OwnerLost as exc:  # a newer claim stands: the caller's OwnerLost
        audit(caller, "POST /api/v1/claim", (owner,), 0, f"refused: epoch {exc.current}",
              claimed_detail(caller, (named,)))
        return _json({"claimed_since": exc.current})
    audit(caller, "POST /api/v1/claim", (owner,), 1, f"epoch {epoch}",
          claimed_detail(caller, (named,)))
    return _json({"epoch": epoch})


@router.post("/release", summary="Record an owner's release in its history (what a "
             "triggerer does when a trigger leaves it)", response_class=Response,
             responses=error_responses(401, 403, 413, 422, 502, 503))
async def release(request: Request, caller: Caller, c: Writable) -> Response:
    body = decode_body(await request.body())
    owner, named, claimant, writer = _claimant(body, caller)
    epoch = body.get("epoch")
    if isinstance(epoch, bool) or not isinstance(epoch, int) or not 0 < epoch < MAX_VERSION:
        raise ApiError(422, "invalid_input", f"epoch: the claim epoch released, from 1 to "
                       f"{MAX_VERSION - 1}")
    caller.require_write(owner)
    recorded = await c.record_release(owner, epoch=epoch, claimant=claimant, writer=writer)
    audit(caller, "POST /api/v1/release", (owner,), int(recorded), f"epoch {epoch}",
          claimed_detail(caller, (named,)))
    return _json({"recorded": recorded})


@router.post("/write", summary="One write in its own transaction: direct, compare-and-set "
             "(409 on another version) or compare-and-delete", response_class=Response,
             responses=error_responses(401, 403, 409, 413, 422, 502, 503))
async def write(request: Request, caller: Caller, ctx: Context, c: Writable) -> Response:
    body = decode_body(await request.body())
    op = body.get("op")
    owner = check_name("owner", body.get("owner"))
    key = check_name("key", body.get("key"))
    named = check_name("updated_by", body.get("updated_by"))
    by = recorded_as(caller, named)
    caller.require_write(owner)
    data = body.get("data")
    _check_data(owner, key, data, ctx.settings.max_value_bytes)
    at = body.get("updated_at")
    if at is not None and (isinstance(at, bool) or not isinstance(at, int | float)):
        raise WireError("'updated_at' must be a number of seconds or null")
    writer = caller.writer_tag(_writer(body.get("writer")))
    if isinstance(at, int) and not 0 <= at <= _MAX_TIME:  # before float(): 10**400
        raise WireError(f"updated_at {at} is not a POSIX time from 0 to {_MAX_TIME:.0f}")
    _check_times("updated_at", (None if at is None else float(at),))
    row: CentralRow | None = None
    deleted = False
    if op == "direct":
        if at is None:
            raise WireError("a direct write needs 'updated_at'")
        row = await c.write_direct(owner, key, data, updated_at=float(at), updated_by=by,
                                   writer=writer)
    elif op == "if_version":
        expected = body.get("expected_version")
        if (isinstance(expected, bool) or not isinstance(expected, int)
                or not 0 <= expected <= MAX_VERSION):
            raise WireError(f"'expected_version' must be an integer from 0 to {MAX_VERSION}")
        row = await c.write_if_version(owner, key, data, expected, updated_by=by,
                                       updated_at=None if at is None else float(at),
                                       writer=writer)
    elif op == "delete_current":
        deleted = await c.delete_current(owner, key, updated_by=by, writer=writer)
    else:
        raise WireError("'op' must be direct, if_version or delete_current")
    audit(caller, "POST /api/v1/write", (owner,), 1 if row is not None or deleted else 0,
          f"{op} {owner}/{key}", claimed_detail(caller, (named,)))
    return _json({"fields": _CENTRAL_HEADER,
                  "row": None if row is None else encode_rows([row])[0], "deleted": deleted})


def _keys(raw: Any) -> list[StateKey]:
    if not isinstance(raw, list) or len(raw) > MAX_READ_KEYS:
        raise WireError(f"'keys' must be an array of up to {MAX_READ_KEYS} [owner, key] pairs")
    keys: list[StateKey] = []
    for pair in raw:
        if not isinstance(pair, list) or len(pair) != 2:
            raise WireError("each of 'keys' must be an [owner, key] pair")
        keys.append((check_name("owner", pair[0]), check_name("key", pair[1])))
    return keys
