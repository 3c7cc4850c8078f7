"""The settings a command runs with, and the central DB opened for the length of one command."""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from localstate.config import Settings
from localstate.errors import ConfigError

if TYPE_CHECKING:
    from localstate.sync.central_store import CentralStore

__all__ = ["central_url_for", "open_central", "settings_for"]


def settings_for(args: argparse.Namespace) -> Settings:
    """The resolved settings, with the command's ``--central-url`` (if it has one) on top."""
    url = getattr(args, "central_url", None)
    return Settings.resolve({"central_url": url} if url else None)


def central_url_for(settings: Settings) -> str:
    """The central DB a command opens: `central_url`; with none, the default SQLite file only
    under ``sink = sql``, whose triggerers flush there. Under another sink that file would be
    an empty DB standing in for the deployment's (`ConfigError` instead)."""
    if settings.central_url is None and settings.sink != "sql":
        raise ConfigError(
            f"sink = {settings.sink}: this machine names no central DB (central_url is not "
            "set), so this command has none to open; give --central-url (or set "
            "central_url)" + (", or use the commands that go through api_url (get, set, "
            "delete, ls, status)" if settings.sink == "api" else ""))
    return settings.resolved_central_url


@contextlib.asynccontextmanager
async def open_central(settings: Settings, *, read_only: bool = False
                       ) -> AsyncIterator[CentralStore]:
    """`read_only`: a command that only reads never migrates (an older schema raises
    `SchemaError`, saying to run ``localstate db upgrade``), whatever `upgrade_schema`."""
    from localstate.sync.central_store import CentralStore

    central = await CentralStore.open(central_url_for(settings),
                                      upgrade_schema=settings.upgrade_schema and not read_only,
                                      transaction_timeout=settings.central_transaction_timeout)
    try:
        yield central
    finally:
        await central.close()
