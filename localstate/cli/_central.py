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
async def open_central(settings: Settings, *, read_only: bool = False
                       ) -> AsyncIterator[CentralStore]:
    """`read_only`: a command that only reads never migrates (an older schema raises
    `SchemaError`, saying to run ``localstate db upgrade``), whatever `upgrade_schema`."""
    from localstate.sync.central_store import CentralStore

    central = await CentralStore.open(settings.resolved_central_url,
                                      upgrade_schema=settings.upgrade_schema and not read_only)
    try:
        yield central
    finally:
        await central.close()
