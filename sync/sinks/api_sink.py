"""`ApiSink`: the `Sink` of ``sink = api``, through a localstate API server over HTTP.

For processes that may not hold database credentials (Airflow 3's trigger runner, tasks and
workers: ADR 0005). The server (``localstate serve``, or localstate's app mounted in
Airflow's API server) writes each flush batch in ONE transaction with the same fenced upsert
and conflict policies as the SQL sink (`localstate.api._sink_routes`), so everything
`localstate._sync.central.central_store` promises holds through it: the writer id travels with the
batch, and the client's own policies are the ones applied.

One request per flush batch, one per batch of read-through misses, over one keep-alive
connection pool (httpx.AsyncClient); bodies are `localstate._core.protocol`. Errors are the SQL
sink's, so the sync worker backs off and catches up the same way:

================================================  =========================================
the server...                                     raised
================================================  =========================================
down, refusing, resetting, timing out; 502-504    `CentralUnavailable` (retry: the outcome
                                                  of a lost flush is unknown, and a resend
                                                  is a replay the fence accepts)
401, 403                                          `AccessDenied`, naming the api_token setting
404 (no such endpoint: not a localstate API)      `ConfigError`, naming the api_url setting
409                                               `VersionConflict` / `WriteRejected`
other 4xx, 5xx                                    as `localstate._core.protocol` maps them
================================================  =========================================
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final, cast

import httpx

from localstate._cache.entry import StateKey
from localstate._core.config import Settings
from localstate._core.conflicts import PolicyMap
from localstate._core.protocol import (
    CLAIM_PATH,
    FLUSH_PATH,
    MAX_BATCH_BODY,
    MAX_BATCH_ROWS,
    READ_PATH,
    RELEASE_PATH,
    WRITE_PATH,
    WireError,
    decode_body,
    decode_outcomes,
    decode_rows,
    encode_body,
    encode_rows,
    error_for,
    field_header,
)
from localstate._core.rows import CentralRow, DirtyRow, EventRow, EventStatus, FlushOutcome
from localstate._core.tls import verification, verification_hint
from localstate._sync.central.fleet import FleetStatus
from localstate.errors import (
    AccessDenied,
    CentralUnavailable,
    ConfigError,
    LocalStateError,
    OwnerLost,
)

__all__ = ["ApiSink"]

#: keys one read asks for (the server's limit is higher)
_READ_CHUNK: Final = 50_000
_DIRTY_HEADER: Final = field_header(DirtyRow)
_FLEET_HEADER: Final = field_header(FleetStatus)
_EVENT_HEADER: Final = field_header(EventRow)
#: answers that mean "the API server is not there right now" (a proxy in front of it)
_GATEWAY: Final = frozenset({502, 503, 504})


class ApiSink:
    """Flushes and reads through a localstate API server. Open with `ApiSink.open(settings)`
    (on the loop that will use it: the connection pool belongs to that loop)."""

    def __init__(self, base_url: str, token: str | None, *, timeout: float = 30.0,
                 transport: httpx.AsyncBaseTransport | None = None,
                 read_source: str | None = None, ca_bundle: Path | None = None) -> None:
        """`read_source`: where `read_many` asks the server to read keys from (None:
        localstate's table; `ASSET_STATE_SOURCE`: Airflow's own ``asset_state_store``, what
        ``sink = airflow`` reads its misses through, `localstate._sync.sinks.asset_states`)."""
        headers = {"Content-Type": "application/json"}
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        self._http = httpx.AsyncClient(
            base_url=base_url.rstrip("/"), headers=headers, transport=transport,
            verify=verification(ca_bundle),
            timeout=httpx.Timeout(timeout, connect=min(timeout, 10.0)),
            limits=httpx.Limits(max_keepalive_connections=4, keepalive_expiry=60.0),
        )
        self.url = f"localstate API {base_url.rstrip('/')}"
        self._source = {} if read_source is None else {"source": read_source}
        #: committed flush transactions (one per request) and the rows they wrote
        self.transactions = 0
        self.rows_written = 0
        #: this triggerer's status for the fleet table, sent with the next flush
        self._fleet_next: FleetStatus | None = None

    @classmethod
    async def open(cls, settings: Settings) -> ApiSink:
        """The sink the settings name (``api_url``, ``api_token``, ``central_timeout``)."""
        if settings.api_url is None:
            raise ConfigError(
                "sink = api needs the api_url setting: the localstate API server to flush "
                "through (AIRFLOW__LOCALSTATE__API_URL, e.g. http://airflow-api-server:8080/localstate"
                " or http://state.internal:8686), or an Airflow connection "
                "localstate_default of type localstate whose host is that URL")
        return cls(settings.api_url, settings.api_token, timeout=settings.central_timeout,
                   ca_bundle=settings.api_ca_bundle)

    # -- one request ---------------------------------------------------------------------

    async def _post(self, path: str, body: bytes) -> dict[str, Any]:
        try:
            response = await self._http.post(path, content=body)
        except httpx.TransportError as exc:
            raise CentralUnavailable(
                f"{self.url} did not answer ({type(exc).__name__}: {exc or 'no detail'})"
                f"{verification_hint(exc)}; writes stay in the local cache and are retried"
            ) from exc
        if response.is_error:
            raise self._error(response)
        try:
            return decode_body(response.content)
        except WireError as exc:
            raise CentralUnavailable(f"{self.url} sent a body that is not JSON ({exc}); "
                                     "retried") from None

    def _error(self, response: httpx.Response) -> LocalStateError:
        status = response.status_code
        error = error_for(response)
        if status in (401, 403):
            return AccessDenied(
                f"{error}; check the api_token setting: sink = api needs a read-write token "
                "of the API server whose owner prefixes cover every owner this process "
                "writes", status=status)
        if status == 404:
            return ConfigError(
                f"{error}; the api_url setting ({self._http.base_url}) does not point at a "
                "localstate API server with the batched sink endpoints (localstate serve, or "
                "the Airflow plugin's /localstate)")
        if status in _GATEWAY and not isinstance(error, CentralUnavailable):
            return CentralUnavailable(f"{error}; retried")
        return error

    # -- Sink ----------------------------------------------------------------------------

    async def write_batch(
        self, rows: Sequence[DirtyRow], policies: PolicyMap, *, writer: str | None = None
    ) -> list[FlushOutcome]:
        if not rows:
            return []
        request: dict[str, Any] = {"fields": _DIRTY_HEADER, "writer": writer,
                                   "policies": policies.spec, "rows": encode_rows(rows)}
        status, self._fleet_next = self._fleet_next, None
        if status is not None:  # recorded by the server in the flush's transaction
            request["fleet_fields"] = _FLEET_HEADER
            request["fleet"] = encode_rows([status])[0]
        body = encode_body(request)
        if (len(body) > MAX_BATCH_BODY or len(rows) > MAX_BATCH_ROWS) and len(rows) > 1:
            half = len(rows) // 2  # a huge batch goes as two requests (two transactions)
            self._fleet_next = status
            return [*await self.write_batch(rows[:half], policies, writer=writer),
                    *await self.write_batch(rows[half:], policies, writer=writer)]
        answer = await self._post(FLUSH_PATH, body)
        outcomes = decode_outcomes(answer.get("fields"), answer.get("written"),
                                   answer.get("outcomes"), rows)
        self.transactions += 1
        self.rows_written += sum(1 for o in outcomes if o.resolution == "written")
        return outcomes

    async def write_with_events(
        self, rows: Sequence[DirtyRow], events: Sequence[EventRow], policies: PolicyMap, *,
        writer: str | None = None, triggerer: str | None = None,
    ) -> tuple[list[FlushOutcome], list[EventStatus]]:
        """`write_batch` of `rows` with `events`, in ONE transaction of the server's
        (`EventSink`): a request too large for one body goes as the events with the first
        part of the rows, then the rest of the rows (the events' watermarks are never
        committed before them). `triggerer`: this process's triggerer id (a server that
        knows the caller records the caller's identity instead)."""
        request: dict[str, Any] = {"fields": _DIRTY_HEADER, "writer": writer,
                                   "triggerer": triggerer,
                                   "policies": policies.spec, "rows": encode_rows(rows),
                                   "event_fields": _EVENT_HEADER,
                                   "events": encode_rows(events)}
        status, self._fleet_next = self._fleet_next, None
        if status is not None:
            request["fleet_fields"] = _FLEET_HEADER
            request["fleet"] = encode_rows([status])[0]
        body = encode_body(request)
        if len(body) > MAX_BATCH_BODY and len(rows) > 1:
            half = len(rows) // 2
            self._fleet_next = status
            first, statuses = await self.write_with_events(rows[:half], events, policies,
                                                           writer=writer, triggerer=triggerer)
            return [*first, *await self.write_batch(rows[half:], policies, writer=writer)
                    ], statuses
        answer = await self._post(FLUSH_PATH, body)
        outcomes = decode_outcomes(answer.get("fields"), answer.get("written"),
                                   answer.get("outcomes"), rows) if rows else []
        statuses = _event_statuses(answer.get("event_statuses"), len(events))
        self.transactions += 1
        self.rows_written += sum(1 for o in outcomes if o.resolution == "written")
        return outcomes, statuses

    async def read_many(self, keys: Sequence[StateKey]) -> dict[StateKey, CentralRow]:
        found: dict[StateKey, CentralRow] = {}
        for start in range(0, len(keys), _READ_CHUNK):
            chunk = [list(k) for k in keys[start:start + _READ_CHUNK]]
            for r in await self._read({"keys": chunk, **self._source}):
                found[(r.owner, r.key)] = r
        return found

    async def read_owner(self, owner: str) -> list[CentralRow]:
        return await self._read({"owner": owner})

    async def _read(self, request: dict[str, Any]) -> list[CentralRow]:
        answer = await self._post(READ_PATH, encode_body(request))
        return decode_rows(CentralRow, answer.get("fields"), answer.get("rows"))

    async def _write(self, request: dict[str, Any]) -> tuple[CentralRow | None, bool]:
        answer = await self._post(WRITE_PATH, encode_body(request))
        raw = answer.get("row")
        rows = [] if raw is None else decode_rows(CentralRow, answer.get("fields"), [raw])
        self.transactions += 1
        self.rows_written += len(rows) or bool(answer.get("deleted"))
        return (rows[0] if rows else None), bool(answer.get("deleted"))

    async def write_direct(
        self, owner: str, key: str, data: str | None, *, updated_at: float, updated_by: str,
        writer: str | None = None,
    ) -> CentralRow:
        row, _ = await self._write({"op": "direct", "owner": owner, "key": key, "data": data,
                                    "updated_at": updated_at, "updated_by": updated_by,
                                    "writer": writer})
        return _written(row)

    async def delete_current(self, owner: str, key: str, *, updated_by: str,
                             writer: str | None = None) -> bool:
        _, deleted = await self._write({"op": "delete_current", "owner": owner, "key": key,
                                        "updated_by": updated_by, "writer": writer})
        return deleted

    async def write_if_version(
        self, owner: str, key: str, data: str | None, expected_version: int, *,
        updated_by: str, updated_at: float | None = None, writer: str | None = None,
    ) -> CentralRow:
        row, _ = await self._write({
            "op": "if_version", "owner": owner, "key": key, "data": data,
            "expected_version": expected_version, "updated_at": updated_at,
            "updated_by": updated_by, "writer": writer})
        return _written(row)

    # -- claims and the fleet table, kept by the server's central DB --------------------

    async def claim(self, owner: str, *, claimant: str, writer: str | None = None,
                    unless_claimed_since: float | None = None) -> int:
        """Bump `owner`'s claim epoch through the server (`CentralStore.claim`, one
        transaction there); the new epoch, or `OwnerLost` when the server answers that a
        claim newer than `unless_claimed_since` stands."""
        answer = await self._post(CLAIM_PATH, encode_body(
            {"owner": owner, "claimant": claimant, "writer": writer,
             "unless_claimed_since": unless_claimed_since}))
        current = answer.get("claimed_since")
        if isinstance(current, int) and not isinstance(current, bool):
            raise OwnerLost.claimed_since(owner, current)
        epoch = answer.get("epoch")
        if isinstance(epoch, bool) or not isinstance(epoch, int):
            raise CentralUnavailable(f"{self.url} answered a claim without its epoch; retried")
        self.transactions += 1
        return epoch

    async def record_release(self, owner: str, *, epoch: int, claimant: str,
                             writer: str | None = None) -> bool:
        """Record `owner`'s release at `epoch` in its history through the server
        (`CentralStore.record_release`, one transaction there); whether it was."""
        answer = await self._post(RELEASE_PATH, encode_body(
            {"owner": owner, "epoch": epoch, "claimant": claimant, "writer": writer}))
        recorded = answer.get("recorded") is True
        self.transactions += recorded
        return recorded

    def note_fleet(self, status: FleetStatus) -> None:
        """Send `status` with the next flush (`FleetReporting`)."""
        self._fleet_next = status

    async def read_fleet(self) -> list[FleetStatus]:
        """Every triggerer's row of the server's fleet table."""
        answer = await self._post(READ_PATH, encode_body({"fleet": True}))
        return decode_rows(FleetStatus, answer.get("fields"), answer.get("rows"))

    async def close(self) -> None:
        """Close the connection pool. Safe twice."""
        await self._http.aclose()


def _event_statuses(raw: Any, count: int) -> list[EventStatus]:
    """The server's status of each event sent, checked (`WireError` for anything else)."""
    if (not isinstance(raw, list) or len(raw) != count
            or any(s not in ("committed", "duplicate", "refused") for s in raw)):
        raise WireError(f"the server answered no status for each of the {count} events sent "
                        "(an older localstate plugin? upgrade it in Airflow's API server)")
    return cast(list[EventStatus], raw)


def _written(row: CentralRow | None) -> CentralRow:
    if row is None:
        raise CentralUnavailable("the localstate API answered a write without its record; "
                                 "the outcome is unknown: read, then retry")
    return row
