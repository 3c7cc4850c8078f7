"""history: an owner's history (watermarks its flushes committed, events with their outcome
and the triggerer that flushed them, claims and releases) and its counts at a glance, from the
central DB or the API (`open_backend`)."""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from localstate.cli._central import settings_for
from localstate.cli._printing import human_time, json_text, print_json
from localstate.cli._state_backend import open_backend

__all__ = ["cmd_history"]


def cmd_history(args: argparse.Namespace) -> int:
    from localstate._core.model import check_name

    owner = check_name("owner", args.owner)
    settings = settings_for(args)
    kinds = tuple(args.kind or ())

    async def go() -> dict[str, Any]:
        async with open_backend(settings, read_only=True) as backend:
            return await backend.history(owner, args.limit, kinds)

    page = asyncio.run(go())
    items = list(reversed(page["items"]))  # the newest `limit`, oldest first
    if args.json:
        print_json({**page, "items": items})
        return 0
    _print_summary(owner, page["summary"])
    if not items:
        print("no history recorded")
        return 0
    rows = [_cells(item) for item in items]
    header = ("at", "kind", "key", "what", "epoch", "triggerer")
    widths = [max(len(header[i]), *(len(r[i]) for r in rows)) for i in range(len(header) - 1)]
    for cells in (header, *rows):
        print("  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=False))
              + "  " + cells[-1])
    return 0


def _ago(seconds: float | None) -> str:
    return "never" if seconds is None else f"{seconds:,.1f} s ago"


def _print_summary(owner: str, s: dict[str, Any]) -> None:
    counts = ", ".join(f"{n} {outcome}" for outcome, n in s["events_last_hour"].items())
    print(f"owner               {owner}")
    print(f"events last hour    {counts}")
    print(f"last event          {_ago(s['since_event_s'])}")
    print(f"last watermark      {_ago(s['since_watermark_s'])}")
    lag = s["lag_s"]
    print(f"watermark lag       {'-' if lag is None else f'{lag:,.1f} s'}")
    print(f"claim epoch         {'-' if s['epoch'] is None else s['epoch']}")
    print(f"rows held           {s['rows']}")
    print()


def _cells(item: dict[str, Any]) -> tuple[str, ...]:
    kind = item["kind"]
    if kind == "watermark":
        what = f"v{item['version']} = {json_text(item['value'])}"
    elif kind == "event":
        what = item["outcome"] + (f" (asset event {item['asset_event']})"
                                  if item.get("asset_event") is not None else "")
    else:
        what = "claimed" if kind == "claim" else "released"
    epoch = "" if item.get("epoch") is None else str(item["epoch"])
    return (human_time(item["at"]), kind, item.get("key") or "", what, epoch,
            item.get("triggerer") or "")
