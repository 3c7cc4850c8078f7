"""Futures that several waiters share."""

from __future__ import annotations

import asyncio
from typing import Any

__all__ = ["mark_retrieved"]


def mark_retrieved(fut: asyncio.Future[Any]) -> None:
    """Done-callback for a future given an exception that every waiter may have abandoned
    (cancelled): retrieving it keeps asyncio from logging "exception was never retrieved"."""
    if not fut.cancelled():
        fut.exception()
