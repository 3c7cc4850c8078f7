"""`StateClient` / `AsyncStateClient`: state variables through the REST API server.

For components that reach `localstate serve` (``localstate.api``) rather than the database::

    from localstate.client import StateClient

    with StateClient("http://state.internal:8686", token=TOKEN) as client:
        client.set("dag:etl/load", "cursor", 42)                      # central when it answers
        client.get("dag:etl/load", "cursor", default=0)               # 42
        rec = client.record("dag:etl/load", "cursor")                 # Record, or None
        client.set("dag:etl/load", "cursor", 43, expected_version=rec.version)  # conditional
        for rec in client.list("dag:etl/"):                           # follows the cursors
            ...

    async with AsyncStateClient(url, token=TOKEN) as client:          # the same, awaited
        await client.get("dag:etl/load", "cursor")

Each `set` and `delete` is one statement on the central DB: when it returns, the central DB
holds the write, and `set` returns that write's own record. A `set` with `expected_version` is a
compare-and-set on the committed version. Reads (`get`, `record`, `list`) show what the central
DB committed: a read that starts after a write returned sees it or a later one, through any
server. A `CentralUnavailable` from a write leaves its outcome unknown: read, then write with
`expected_version`. The server's answers come back as the errors the store raises:

=======================================  ==================================================
server answer (`localstate._core.protocol`)    raised
=======================================  ==================================================
404 (no value)                           nothing: `get` gives the default, `record` None,
                                         `delete` False
409 version_conflict / write_rejected    `VersionConflict` (``expected``, ``actual``) /
                                         `WriteRejected`
409 version_exhausted                    `VersionExhausted` (``owner``, ``key``)
422                                      `InvalidName`, `ValueEncodingError`, `InvalidInput`
413                                      `ValueTooLarge` (``size``, ``limit``)
401, 403                                 `AccessDenied` (``status``)
503, or the server unreachable           `CentralUnavailable`
other 5xx                                `CentralError`
=======================================  ==================================================

Names and values are checked here first (`InvalidName`, `ValueEncodingError`: nothing is sent).
On its first call a client asks the server's ``/api/v1/health``, so a base URL that is not a
localstate API fails loudly instead of reading as "no value".
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from types import TracebackType
from typing import Any, Final

import httpx

from localstate._core.codec import encode
from localstate._core.model import FlushState, Record
from localstate._core.protocol import (
    FLEET_PATH,
    HEALTH_PATH,
    HISTORY_PATH,
    LIST_PATH,
    STATUS_PATH,
    body_of,
    error_for,
    item_path,
)
from localstate._core.tls import verification, verification_hint
from localstate.errors import (
    CentralUnavailable,
    InvalidInput,
    LocalStateError,
)

__all__ = ["AsyncStateClient", "StateClient"]

_JSON: Final = {"Content-Type": "application/json"}


# -- what both clients share: requests, answers, errors ---------------------------------


def _put_body(value: Any, expected_version: int | None) -> str:
    data = encode(value, sys.maxsize)  # the server holds the size limit; the rules are here
    if expected_version is None:
        return f'{{"value":{data}}}'
    if isinstance(expected_version, bool) or not isinstance(expected_version, int):
        raise InvalidInput(f"expected_version must be an int, not {expected_version!r}")
    return f'{{"value":{data},"expected_version":{expected_version}}}'


def _delete_params(expected_version: int | None) -> dict[str, int]:
    if expected_version is None:
        return {}
    if isinstance(expected_version, bool) or not isinstance(expected_version, int):
        raise InvalidInput(f"expected_version must be an int, not {expected_version!r}")
    return {"expected_version": expected_version}


def _list_params(owner_prefix: str, page_size: int, cursor: str | None) -> dict[str, Any]:
    params: dict[str, Any] = {"owner_prefix": owner_prefix, "limit": page_size}
    if cursor is not None:
        params["cursor"] = cursor
    return params


def _history_params(owner: str, before: int | None, limit: int, kinds: Sequence[str]
                    ) -> dict[str, Any]:
    params: dict[str, Any] = {"owner": owner, "limit": limit}
    if before is not None:
        params["before"] = before
    if kinds:
        params["kind"] = list(kinds)
    return params


def _record(item: Mapping[str, Any]) -> Record:
    state = FlushState(item["flush_state"])
    stamp = str(item["updated_at"])
    return Record(
        owner=item["owner"], key=item["key"], value=item["value"], version=item["version"],
        updated_at=datetime.fromisoformat(stamp.replace("Z", "+00:00")),
        updated_by=item["updated_by"], flush_state=state,
        # the API shows the central version only as "flushed": then it is this one
        central_version=item["version"] if state is FlushState.FLUSHED else 0,
    )


def _unreachable(base_url: httpx.URL, exc: httpx.TransportError) -> CentralUnavailable:
    return CentralUnavailable(
        f"the localstate API at {base_url} did not answer ({type(exc).__name__}: {exc})"
        + (verification_hint(exc) or "; is `localstate serve` running there?")
    )


def _check_health(response: httpx.Response, base_url: httpx.URL) -> None:
    body = body_of(response)
    if response.status_code not in (200, 503) or "auth_required" not in body:
        raise LocalStateError(
            f"{base_url} is not a localstate API: GET {HEALTH_PATH} answered "
            f"{response.status_code}; give the URL `localstate serve` prints "
            "(e.g. http://host:8686)"
        )


def _headers(token: str | None) -> dict[str, str]:
    return {} if token is None else {"Authorization": f"Bearer {token}"}


def _answer(response: httpx.Response, *, absent_ok: bool) -> dict[str, Any] | None:
    """The JSON body of a 2xx answer; None for a 404 when absence is an answer."""
    if response.status_code == 404 and absent_ok:
        return None
    if response.is_error:
        raise error_for(response)
    return body_of(response)


# -- the blocking client ----------------------------------------------------------------


class StateClient:
    """A blocking client of the localstate REST API (thread-safe, as httpx.Client is)."""

    def __init__(self, base_url: str, *, token: str | None = None, timeout: float = 30.0,
                 transport: httpx.BaseTransport | None = None,
                 ca_bundle: str | Path | None = None) -> None:
        """`ca_bundle`: a PEM file of the CAs trusted for an https:// `base_url` (None: the
        system's); the certificate is always verified."""
        self._http = httpx.Client(base_url=base_url, headers=_headers(token), timeout=timeout,
                                  transport=transport, verify=verification(ca_bundle))
        self._checked = False

    def _request(self, method: str, path: str, *, absent_ok: bool = False,
                 **kwargs: Any) -> dict[str, Any] | None:
        try:
            if not self._checked:
                _check_health(self._http.get(HEALTH_PATH), self._http.base_url)
                self._checked = True
            response = self._http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise _unreachable(self._http.base_url, exc) from exc
        return _answer(response, absent_ok=absent_ok)

    def get(self, owner: str, key: str, default: Any = None) -> Any:
        body = self._request("GET", item_path(owner, key), absent_ok=True)
        return default if body is None else body["value"]

    def record(self, owner: str, key: str) -> Record | None:
        body = self._request("GET", item_path(owner, key), absent_ok=True)
        return None if body is None else _record(body)

    def set(self, owner: str, key: str, value: Any, *, expected_version: int | None = None
            ) -> Record:
        """Write (in the central DB when this returns); with `expected_version`, only over it
        (0: only if absent), else `VersionConflict`."""
        path = item_path(owner, key)
        body = self._request("PUT", path, content=_put_body(value, expected_version),
                             headers=_JSON)
        assert body is not None
        return _record(body)

    def delete(self, owner: str, key: str, *, expected_version: int | None = None) -> bool:
        """Delete; False when there was no value."""
        path = item_path(owner, key)
        return self._request("DELETE", path, absent_ok=True,
                             params=_delete_params(expected_version)) is not None

    def list(self, owner_prefix: str = "", *, page_size: int = 100) -> Iterator[Record]:
        """Every state variable whose owner starts with `owner_prefix`, page by page."""
        cursor: str | None = None
        while True:
            body = self._request("GET", LIST_PATH,
                                 params=_list_params(owner_prefix, page_size, cursor))
            assert body is not None
            yield from (_record(item) for item in body["items"])
            cursor = body.get("next_cursor")
            if cursor is None:
                return

    def status(self) -> dict[str, Any]:
        """The serving store's status (cache, flush lag, errors)."""
        body = self._request("GET", STATUS_PATH)
        assert body is not None
        return body

    def fleet(self) -> dict[str, Any]:
        """Every triggerer's lag, backlog and state, from the fleet table."""
        body = self._request("GET", FLEET_PATH)
        assert body is not None
        return body

    def history(self, owner: str, *, before: int | None = None, limit: int = 100,
                kinds: Sequence[str] = ()) -> dict[str, Any]:
        """A page of `owner`'s history, newest first (``items``, ``summary`` on the first
        page, ``next_before``: pass it as `before` for the next page)."""
        body = self._request("GET", HISTORY_PATH,
                             params=_history_params(owner, before, limit, kinds))
        assert body is not None
        return body

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> StateClient:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


# -- the async client -------------------------------------------------------------------


class AsyncStateClient:
    """The same calls as `StateClient`, awaited (on httpx.AsyncClient)."""

    def __init__(self, base_url: str, *, token: str | None = None, timeout: float = 30.0,
                 transport: httpx.AsyncBaseTransport | None = None,
                 ca_bundle: str | Path | None = None) -> None:
        self._http = httpx.AsyncClient(base_url=base_url, headers=_headers(token),
                                       timeout=timeout, transport=transport,
                                       verify=verification(ca_bundle))
        self._checked = False

    async def _request(self, method: str, path: str, *, absent_ok: bool = False,
                       **kwargs: Any) -> dict[str, Any] | None:
        try:
            if not self._checked:
                _check_health(await self._http.get(HEALTH_PATH), self._http.base_url)
                self._checked = True
            response = await self._http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise _unreachable(self._http.base_url, exc) from exc
        return _answer(response, absent_ok=absent_ok)

    async def get(self, owner: str, key: str, default: Any = None) -> Any:
        body = await self._request("GET", item_path(owner, key), absent_ok=True)
        return default if body is None else body["value"]

    async def record(self, owner: str, key: str) -> Record | None:
        body = await self._request("GET", item_path(owner, key), absent_ok=True)
        return None if body is None else _record(body)

    async def set(self, owner: str, key: str, value: Any, *,
                  expected_version: int | None = None) -> Record:
        path = item_path(owner, key)
        body = await self._request("PUT", path, content=_put_body(value, expected_version),
                                   headers=_JSON)
        assert body is not None
        return _record(body)

    async def delete(self, owner: str, key: str, *, expected_version: int | None = None
                     ) -> bool:
        path = item_path(owner, key)
        return await self._request("DELETE", path, absent_ok=True,
                                   params=_delete_params(expected_version)) is not None

    async def list(self, owner_prefix: str = "", *, page_size: int = 100
                   ) -> AsyncIterator[Record]:
        cursor: str | None = None
        while True:
            body = await self._request("GET", LIST_PATH,
                                       params=_list_params(owner_prefix, page_size, cursor))
            assert body is not None
            for item in body["items"]:
                yield _record(item)
            cursor = body.get("next_cursor")
            if cursor is None:
                return

    async def status(self) -> dict[str, Any]:
        body = await self._request("GET", STATUS_PATH)
        assert body is not None
        return body

    async def fleet(self) -> dict[str, Any]:
        """Every triggerer's lag, backlog and state, from the fleet table."""
        body = await self._request("GET", FLEET_PATH)
        assert body is not None
        return body

    async def history(self, owner: str, *, before: int | None = None, limit: int = 100,
                      kinds: Sequence[str] = ()) -> dict[str, Any]:
        """A page of `owner`'s history (see `StateClient.history`)."""
        body = await self._request("GET", HISTORY_PATH,
                                   params=_history_params(owner, before, limit, kinds))
        assert body is not None
        return body

    async def close(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncStateClient:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.close()
