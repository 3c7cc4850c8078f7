"""``GET /api/v1/history``: an owner's history (`localstate._sync.central.history`), newest first,
paged by row id, with its counts at a glance on the first page. Any token that may read the
owner may read its history (a Viewer in Airflow); nothing changes it through the API."""

# No `from __future__ import annotations` here: FastAPI reads the route signatures at run
# time.
from typing import Annotated

import orjson
from fastapi import APIRouter, Query

from localstate._core.model import check_name, epoch_to_datetime
from localstate._core.protocol import HISTORY_PATH
from localstate._core.rows import HistoryKind
from localstate._sync.central.history import HistoryRow, OwnerSummary
from localstate.api._context import Caller, Central
from localstate.api._routes import MAX_PAGE
from localstate.api._schemas import HistoryItem, HistoryPage, HistorySummary, error_responses

__all__ = ["history_item", "history_summary", "router"]

router = APIRouter()


def history_item(row: HistoryRow) -> HistoryItem:
    return HistoryItem(
        id=row.id, kind=row.kind, at=epoch_to_datetime(row.at), key=row.key,  # type: ignore[arg-type]
        value=None if row.value is None else orjson.loads(row.value), version=row.version,
        outcome=row.outcome, asset_event=row.asset_event,  # type: ignore[arg-type]
        epoch=row.epoch, triggerer=row.triggerer, writer=row.writer)


def history_summary(s: OwnerSummary) -> HistorySummary:
    def at(ts: float | None) -> object:
        return None if ts is None else epoch_to_datetime(ts)

    return HistorySummary(
        events_last_hour=s.events_last_hour, last_event_at=at(s.last_event_at),  # type: ignore[arg-type]
        last_watermark_at=at(s.last_watermark_at),  # type: ignore[arg-type]
        last_claim_at=at(s.last_claim_at), epoch=s.epoch, rows=s.rows,  # type: ignore[arg-type]
        since_event_s=s.since_event, since_watermark_s=s.since_watermark, lag_s=s.lag)


@router.get(HISTORY_PATH, response_model=HistoryPage,
            responses=error_responses(401, 403, 422, 502, 503),
            summary="An owner's history: watermarks, events with their outcome, claims, "
            "releases")
async def read_history(
    caller: Caller,
    c: Central,
    owner: Annotated[str, Query(max_length=250, description="the owner")],
    before: Annotated[int | None, Query(ge=1, description="next_before of the page before")
                      ] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE, description="rows per page")] = 100,
    kind: Annotated[list[HistoryKind] | None, Query(
        description="only these kinds (repeatable)")] = None,
) -> HistoryPage:
    check_name("owner", owner)
    caller.require_read(owner)
    rows = await c.read_history(owner, before=before, limit=limit + 1, kinds=kind or ())
    more = len(rows) > limit
    rows = rows[:limit]
    summary = None if before is not None else history_summary(await c.history_summary(owner))
    return HistoryPage(owner=owner, summary=summary, items=[history_item(r) for r in rows],
                       next_before=rows[-1].id if more else None)
