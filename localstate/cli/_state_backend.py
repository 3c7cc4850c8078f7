"""Where the state commands read and write: the configured sink decides.

* ``sink = sql``: the central DB at ``central_url`` (with none, the default SQLite file in
  ``$AIRFLOW_HOME``, which is where such a deployment's triggerers flush).
* ``sink = api``: the localstate API at ``api_url`` with ``api_token``, as the deployment's
  triggerers reach it. No database is opened, none is created.
* ``sink = airflow``: the central DB only when ``central_url`` (or ``--central-url``) names
  it; never a default file that would be empty.

`StateBackend` is what get, set, delete, ls and ``status --fleet`` use; `open_backend` opens
the configured one for the length of one command; `describe_backend` says which it is without
opening anything (``localstate config``).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Protocol

from localstate._core.config import Settings
from localstate.cli._central import open_central
from localstate.cli._exit_codes import NotFound
from localstate.errors import ConfigError

if TYPE_CHECKING:
    from localstate._core.model import Record
    from localstate._core.rows import CentralRow
    from localstate._sync.central.central_store import CentralStore
    from localstate.client import AsyncStateClient

__all__ = ["StateBackend", "describe_backend", "open_backend"]

_PAGE = 500


class StateBackend(Protocol):
    #: where reads and writes go, as the commands print it
    where: str

    async def read(self, owner: str, key: str) -> CentralRow | None: ...

    async def write(self, owner: str, key: str, data: str | None, *,
                    expected_version: int | None, updated_by: str) -> CentralRow | None:
        """Write (data None: delete); the record written, None where the backend does not
        say (a delete through the API answers 204). `NotFound`: nothing to delete."""
        ...

    def rows(self, owner_prefix: str, limit: int | None) -> AsyncIterator[CentralRow]: ...

    async def fleet(self) -> dict[str, Any]:
        """The fleet view: ``triggerers`` (as `lag_and_backlog` gives them), the totals."""
        ...

    async def history(self, owner: str, limit: int, kinds: tuple[str, ...]) -> dict[str, Any]:
        """`owner`'s newest `limit` history rows (newest first) and its summary, as the API
        answers them (``items``, ``summary``; times as POSIX seconds)."""
        ...


def describe_backend(settings: Settings) -> tuple[str, str]:
    """(kind, where) of the state commands under `settings`: ("api", url) or ("central DB",
    url); `ConfigError` when the settings name none (sink = airflow without central_url)."""
    if settings.sink == "api":
        if settings.api_url is None:
            raise ConfigError("sink = api but api_url is not set: set [localstate] api_url "
                              "(and api_token) to the API the triggerers flush through")
        return "api", settings.api_url
    if settings.sink == "airflow" and settings.central_url is None:
        raise ConfigError(
            "sink = airflow keeps state in Airflow's asset state store, which these commands "
            "do not read; give --central-url (or set central_url) to read localstate's "
            "central DB instead, or set sink = api with api_url to go through the API")
    return "central DB", settings.resolved_central_url


@contextlib.asynccontextmanager
async def open_backend(settings: Settings, *, read_only: bool = False
                       ) -> AsyncIterator[StateBackend]:
    """`read_only`: the command only reads, so a central DB is never migrated (see
    `open_central`)."""
    kind, url = describe_backend(settings)
    if kind == "api":
        from localstate.client import AsyncStateClient

        async with AsyncStateClient(url, token=settings.api_token,
                                    ca_bundle=settings.api_ca_bundle,
                                    timeout=settings.central_timeout) as client:
            yield _ApiBackend(client, url)
        return
    async with open_central(settings, read_only=read_only) as central:
        yield _CentralBackend(central)


class _CentralBackend:
    def __init__(self, central: CentralStore) -> None:
        self.central = central
        self.where = f"central DB {central.url}"

    async def read(self, owner: str, key: str) -> CentralRow | None:
        return (await self.central.read_many([(owner, key)])).get((owner, key))

    async def write(self, owner: str, key: str, data: str | None, *,
                    expected_version: int | None, updated_by: str) -> CentralRow | None:
        c = self.central
        if expected_version is not None:
            return await c.write_if_version(owner, key, data, expected_version,
                                            updated_by=updated_by)
        if data is None:
            current = await self.read(owner, key)
            if current is None or current.data is None:
                raise NotFound(f"owner {owner!r} key {key!r} has no value to delete")
        return await c.write_direct(owner, key, data, updated_at=time.time(),
                                    updated_by=updated_by)

    async def rows(self, owner_prefix: str, limit: int | None) -> AsyncIterator[CentralRow]:
        after: tuple[str, str] | None = None
        shown = 0
        while limit is None or shown < limit:
            want = _PAGE if limit is None else min(_PAGE, limit - shown)
            page = await self.central.list_rows(owner_prefix=owner_prefix, after=after,
                                                limit=want)
            for row in page:
                yield row
            shown += len(page)
            if len(page) < want:
                return
            after = (page[-1].owner, page[-1].key)

    async def fleet(self) -> dict[str, Any]:
        from localstate._sync.central.fleet import fleet_summary

        return fleet_summary(await self.central.read_fleet(), time.time())

    async def history(self, owner: str, limit: int, kinds: tuple[str, ...]) -> dict[str, Any]:
        import orjson

        rows = await self.central.read_history(owner, limit=limit, kinds=kinds)
        s = await self.central.history_summary(owner)
        items = [{**r.as_json(), "value": None if r.value is None else orjson.loads(r.value)}
                 for r in rows]
        summary = {"events_last_hour": s.events_last_hour, "last_event_at": s.last_event_at,
                   "last_watermark_at": s.last_watermark_at, "last_claim_at": s.last_claim_at,
                   "epoch": s.epoch, "rows": s.rows, "since_event_s": s.since_event,
                   "since_watermark_s": s.since_watermark, "lag_s": s.lag}
        return {"owner": owner, "summary": summary, "items": items}


def _epoch(value: Any) -> float | None:
    if value is None:
        return None
    stamp = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=timezone.utc)
    return stamp.timestamp()


def _row(record: Record) -> CentralRow:
    import orjson

    from localstate._core.rows import CentralRow

    return CentralRow(record.owner, record.key, orjson.dumps(record.value).decode(),
                      record.version, record.updated_at.timestamp(), record.updated_by)


class _ApiBackend:
    def __init__(self, client: AsyncStateClient, url: str) -> None:
        self.client = client
        self.where = f"API {url}"

    async def read(self, owner: str, key: str) -> CentralRow | None:
        record = await self.client.record(owner, key)
        return None if record is None else _row(record)

    async def write(self, owner: str, key: str, data: str | None, *,
                    expected_version: int | None, updated_by: str) -> CentralRow | None:
        # the API records its caller's token as the writer; `updated_by` is the CLI's own
        if data is None:
            if not await self.client.delete(owner, key, expected_version=expected_version):
                raise NotFound(f"owner {owner!r} key {key!r} has no value to delete")
            return None
        import orjson

        record = await self.client.set(owner, key, orjson.loads(data),
                                       expected_version=expected_version)
        return _row(record)

    async def rows(self, owner_prefix: str, limit: int | None) -> AsyncIterator[CentralRow]:
        shown = 0
        page = _PAGE if limit is None else min(_PAGE, limit)
        async for record in self.client.list(owner_prefix, page_size=page):
            if limit is not None and shown >= limit:
                return
            yield _row(record)
            shown += 1

    async def fleet(self) -> dict[str, Any]:
        body = await self.client.fleet()
        members = [{**m, "last_flush_at": _epoch(m["last_flush_at"]),
                    "oldest_unflushed_at": _epoch(m.get("oldest_unflushed_at"))}
                   for m in body["triggerers"]]
        return {**body, "triggerers": members}

    async def history(self, owner: str, limit: int, kinds: tuple[str, ...]) -> dict[str, Any]:
        items: list[dict[str, Any]] = []
        summary: dict[str, Any] | None = None
        before: int | None = None
        while len(items) < limit:
            page = await self.client.history(owner, before=before, limit=min(_PAGE, limit -
                                                                                len(items)),
                                             kinds=kinds)
            if summary is None:
                summary = page["summary"]
            items.extend({**i, "at": _epoch(i["at"])} for i in page["items"])
            before = page["next_before"]
            if before is None:
                break
        assert summary is not None
        times = ("last_event_at", "last_watermark_at", "last_claim_at")
        return {"owner": owner, "summary": {**summary, **{t: _epoch(summary[t]) for t in times}},
                "items": items}
