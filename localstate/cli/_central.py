"""The settings a command runs with, and the central DB opened for the length of one command."""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from localstate._core.config import Settings
from localstate.errors import ConfigError, SchemaError

if TYPE_CHECKING:
    from localstate._sync.central.central_store import CentralStore

__all__ = ["central_url_for", "open_central", "schema_version", "settings_for"]


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


async def schema_version(url: str) -> int:
    """The central DB's localstate schema version (0: none of its tables there)."""
    from localstate._sync.central.engine import make_engine, read_connection
    from localstate._sync.central.schema import current_version

    engine = make_engine(url)
    try:
        async with read_connection(engine) as conn:
            return await current_version(conn)
    finally:
        await engine.dispose()


@contextlib.asynccontextmanager
async def open_central(settings: Settings, *, read_only: bool = False
                       ) -> AsyncIterator[CentralStore]:
    """`read_only`: a command that only reads never migrates an existing schema, whatever
    `upgrade_schema`: processes of the release that wrote it may still be running (an older
    schema raises `SchemaError`, saying to run ``localstate db upgrade``). A database with
    none of localstate's tables gets them, as on any first use (under `upgrade_schema`)."""
    from localstate._sync.central.central_store import CentralStore
    from localstate._sync.central.history import HistoryPolicy

    url = central_url_for(settings)
    timeout = settings.central_transaction_timeout
    try:
        central = await CentralStore.open(
            url, upgrade_schema=settings.upgrade_schema and not read_only,
            transaction_timeout=timeout)
    except SchemaError:
        if not (read_only and settings.upgrade_schema and await schema_version(url) == 0):
            raise
        central = await CentralStore.open(url, upgrade_schema=True, transaction_timeout=timeout)
    central.use_history(HistoryPolicy.of(settings))
    try:
        yield central
    finally:
        await central.close()
