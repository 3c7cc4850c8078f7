"""db upgrade: create or upgrade the central DB's tables."""

from __future__ import annotations

import argparse
import asyncio

from localstate.cli._central import central_url_for, settings_for
from localstate.errors import LocalStateError

__all__ = ["cmd_db_upgrade"]


def cmd_db_upgrade(args: argparse.Namespace) -> int:
    from localstate._sync.central.engine import make_engine
    from localstate._sync.central.schema import LATEST_VERSION, upgrade

    url = central_url_for(settings_for(args))

    async def go() -> list[str]:
        # no transaction bound: an upgrade run by hand may need to wait for locks, or rewrite
        # a large table, for longer than a flush ever should
        engine = make_engine(url, transaction_timeout=None)
        try:
            return [f"{m.version}: {m.description}" for m in await upgrade(engine)]
        finally:
            await engine.dispose()

    try:
        applied = asyncio.run(go())
    except LocalStateError:
        raise
    except Exception as exc:  # a driver error before the store's own wrapping
        raise LocalStateError(f"cannot upgrade {url}: {exc}") from exc
    for line in applied:
        print(f"applied migration {line}")
    print(f"central schema is at version {LATEST_VERSION}"
          + (" (already up to date)" if not applied else ""))
    return 0
