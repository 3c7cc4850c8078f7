"""The API's request and response bodies (pydantic models, also the OpenAPI schemas)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt

from localstate._core.model import MAX_VERSION
from localstate._core.rows import HistoryKind

__all__ = [
    "ERROR_STATUSES",
    "ErrorBody",
    "FlushStateName",
    "Health",
    "HistoryItem",
    "HistoryPage",
    "HistorySummary",
    "Me",
    "PutBody",
    "StateItem",
    "StateList",
    "Status",
    "Throughput",
    "error_responses",
]

FlushStateName = Literal["dirty", "flushed", "conflict"]


class StateItem(BaseModel):
    """One state variable."""

    owner: str
    key: str
    value: Any = Field(description="the JSON value")
    version: int = Field(description="one more with every write; send it back as "
                                     "expected_version to write only over this version")
    updated_at: datetime
    updated_by: str = Field(description="the id of the process that wrote it")
    flush_state: FlushStateName = Field(
        description="flushed: the central DB committed this version (every plain read); with "
                    "?pending=true also dirty: the server's local store holds a write the "
                    "central DB lacks (it may yet be refused), and conflict: the server's local "
                    "store's last flush of it met another writer's record")


class StateList(BaseModel):
    items: list[StateItem]
    next_cursor: str | None = Field(
        description="pass as ?cursor= for the next page; null on the last page")


class PutBody(BaseModel):
    """PUT /api/v1/state/{owner}/{key}."""

    model_config = ConfigDict(extra="forbid")

    value: Any = Field(description="any JSON value (null included)")
    expected_version: StrictInt | None = Field(
        default=None, ge=0, le=MAX_VERSION,
        description="write only if the committed record is at this version (0: it must not "
                    "exist); 409 otherwise. One conditional statement on the central DB")


class Throughput(BaseModel):
    window_s: float = Field(description="seconds the rates are measured over")
    sets_per_s: float
    central_rows_per_s: float


class Status(BaseModel):
    """The server's health: its local store's cache and sync worker (``localstate serve``),
    or, for a server without one (the Airflow plugin's), what it committed to the central
    DB."""

    triggerer_id: str
    cache_enabled: bool
    cache_turning_off: bool = Field(
        False, description="enabled was turned off, and the store serves from the local cache "
        "until the writes the central DB lacks are flushed; then it switches")
    cache_turning_off_s: float = Field(0.0, description="seconds that turn-off has waited")
    central_url: str = Field(description="the central DB, password hidden (to admins only: "
                             "an Airflow user who may read Airflow's configuration, a "
                             "read-write token over every owner)")
    dirty_keys: int
    flush_lag_s: float = Field(description="age of the oldest write the central DB lacks")
    flush_lag_p50_s: float | None
    flush_lag_p99_s: float | None
    last_flush_at: datetime | None
    flushes: int
    conflicts: int
    central_errors: int
    last_error: str | None
    sets: int
    gets: int
    central_transactions: int
    central_rows: int
    keys_in_memory: int
    throughput: Throughput | None = Field(
        description="recent rates of the server (null until two samples exist)")
    events_committed: int = Field(
        0, description="events emitted with watermarks that this server committed to the "
        "central DB since it started (new keys; flushes of sink = api triggerers)")
    events_pending: int = Field(
        0, description="events the server's local store emitted that the central DB lacks")
    oldest_pending_event_s: float = Field(
        0.0, description="age of the oldest of those (0: none)")
    events_by_owner: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="the server's local store's event figures per owner")


class FleetMember(BaseModel):
    """One triggerer as its last flush recorded it in the fleet table."""

    triggerer: str
    host: str | None = Field(description="null unless the caller is an admin (or "
                             "api_fleet_details is on)")
    pid: int | None
    last_flush_at: datetime
    since_last_flush_s: float = Field(description="seconds since that flush")
    dirty_keys: int = Field(description="its backlog: the keys still waiting once that "
                            "flush's first batch committed (0: it was caught up)")
    oldest_unflushed_at: datetime | None
    lag_s: float = Field(description="from the oldest write it carried to the flush")
    rows_per_s: float
    flush_interval: float = Field(description="seconds between its flushes (budget included)")
    state: Literal["flushing", "idle", "stalled"] = Field(
        description="flushing: a flush within a few flush intervals; idle: none since, and "
                    "the last one left nothing waiting (nothing to write); stalled: none since, "
                    "with keys left waiting")
    stalled: bool = Field(description="whether it is stalled")
    stale: bool = Field(description="deprecated: the earlier name of stalled")


class Fleet(BaseModel):
    """Every triggerer that flushed to the central DB (`localstate_fleet`)."""

    triggerers: list[FleetMember]
    central_rows_per_s: float = Field(description="the live triggerers' rows/s together")
    stalled: int = Field(description="triggerers stalled")
    stale: int = Field(description="deprecated: the earlier name of stalled")
    idle: int = Field(description="triggerers idle (caught up, nothing to write)")


class Me(BaseModel):
    """The caller as the API knows it."""

    name: str = Field(description="the token's label, or the Airflow user")
    can_write: bool = Field(description="whether it may write (set, delete)")
    owners: list[str] = Field(description="the owner prefixes it may touch ('' is every owner)")


class Health(BaseModel):
    status: Literal["ok", "closed"]
    version: str
    auth_required: bool = Field(description="whether the API needs a bearer token")


class ErrorBody(BaseModel):
    """Every 4xx and 5xx answer."""

    error: str = Field(description="a stable code: not_found, version_conflict, ...")
    message: str = Field(description="what went wrong, for a person")
    detail: Any = None


#: what each error status of the API means, for the routes' declared responses (the REST
#: reference lists them from there)
ERROR_STATUSES: dict[int, str] = {
    401: "no token, or not a valid one",
    403: "outside the token's owners or role",
    404: "nothing of that name",
    409: "a version conflict, or a write the central DB refused",
    413: "a value, a body or a batch over its limit",
    422: "bad input (names, value, query, body)",
    502: "the central DB failed on this request",
    503: "the central DB (or the serving store) is unavailable; try again shortly",
}


def error_responses(*statuses: int, **described: str) -> dict[int | str, dict[str, Any]]:
    """The ``responses`` a route declares: each of `statuses` with its meaning, and the
    ``s404="..."``-style keyword ones with a meaning of the route's own."""
    out: dict[int | str, dict[str, Any]] = {
        status: {"model": ErrorBody, "description": ERROR_STATUSES[status]}
        for status in statuses}
    for name, text in described.items():
        out[int(name.removeprefix("s"))] = {"model": ErrorBody, "description": text}
    return out


class HistoryItem(BaseModel):
    """One row of an owner's history: a watermark a flush committed, an event with its
    outcome, a claim or a release."""

    id: int = Field(description="its place in the history (pass the last as ?before=)")
    kind: HistoryKind
    at: datetime = Field(description="a watermark's write time; an event's, claim's or "
                         "release's commit")
    key: str | None = Field(description="the state key, or the event's key")
    value: Any = Field(default=None, description="a watermark's value (null: a deletion)")
    version: int | None = Field(description="a watermark's central version")
    outcome: Literal["committed", "duplicate", "refused", "rejected"] | None = Field(
        description="an event's: committed, duplicate (a replay), refused (a zombie's: its "
                    "claim epoch is below the owner's), rejected (malformed)")
    asset_event: int | None = Field(description="the Airflow asset event a committed event "
                                    "made")
    epoch: int | None = Field(description="a claim's epoch, the epoch a release gave up; the "
                              "claim epoch of an event")
    triggerer: str | None = Field(description="the triggerer that wrote a watermark, flushed "
                                  "an event, claimed or released")
    writer: str | None = Field(description="the local cache file whose flush wrote it")


class HistorySummary(BaseModel):
    """An owner's counts at a glance."""

    events_last_hour: dict[str, int] = Field(description="events by outcome")
    last_event_at: datetime | None
    last_watermark_at: datetime | None
    last_claim_at: datetime | None
    epoch: int | None = Field(description="the latest claim's epoch")
    rows: int = Field(description="history rows held")
    since_event_s: float | None
    since_watermark_s: float | None
    lag_s: float | None = Field(description="how far the watermark trails the last event")


class HistoryPage(BaseModel):
    """GET /api/v1/history: an owner's history, newest first."""

    owner: str
    summary: HistorySummary | None = Field(description="on the first page only")
    items: list[HistoryItem]
    next_before: int | None = Field(description="pass as ?before= for the next page; null on "
                                    "the last page")
