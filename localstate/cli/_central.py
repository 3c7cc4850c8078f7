"""The settings a command runs with, and the central DB opened for the length of one command."""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from localstate.config import Settings

if TYPE_CHECKING:
    from localstate.sync.central_store import CentralStore

__all__ = ["open_central", "settings_for"]


def settings_for(args: argparse.Namespace) -> Settings:
    """The resolved settings, with the command's ``--central-url`` (if it has one) on top."""
    url = getattr(args, "central_url", None)
    return Settings.resolve({"central_url": url} if url else None)


@contextlib.asynccontextmanager
async def open_central(settings: Settings) -> AsyncIterator[CentralStore]:
    from localstate.sync.central_store import CentralStore

    central = await CentralStore.open(settings.resolved_central_url,
                                      upgrade_schema=settings.upgrade_schema,
                                      transaction_timeout=settings.central_transaction_timeout)
    try:
        yield central
    finally:
        await central.close()
