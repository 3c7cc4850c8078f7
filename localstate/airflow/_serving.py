"""What the app mounted in Airflow's API server serves: localstate's API and UI over Airflow's
metadata DB.

`open_serving()` builds it, once, in the API server process:

* the central DB is Airflow's metadata DB (``[database] sql_alchemy_conn``, whatever sync
  driver Airflow uses there, turned into the dialect's async driver by `central_url_of`);
* the server is its settings and one `CentralStore` on that DB, with no local store: every
  REST write is one statement on the central DB, and a flush posted by a triggerer is one
  transaction; nothing waits in this process to be flushed;
* those flushes also write Airflow's ``asset_state_store`` for asset owners (the
  ``asset_mirror`` setting, ``auto``: on, since this DB is Airflow's);
* callers are authorized by `AirflowAuthorizer`: Airflow's users, and the machine tokens of
  the ``api_tokens`` setting;
* ``POST /api/v1/read`` also reads Airflow's own ``asset_state_store`` for asset owners
  (what ``sink = airflow`` reads its misses through, one request per batch), when Airflow
  keeps asset state there: its ``[state_store] backend`` is the metadata DB's (the default).

Every other setting resolves as usual (``[localstate]`` in airflow.cfg,
``AIRFLOW__LOCALSTATE__*``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI
from sqlalchemy.engine import make_url

from localstate._core.config import Settings, default_triggerer_id
from localstate._sync.central.asset_mirror import AssetMirror
from localstate._sync.central.central_store import CentralStore
from localstate._sync.central.engine import async_url
from localstate._sync.central.history import HistoryPolicy
from localstate.airflow._auth import AirflowAuthorizer
from localstate.api._app import create_app

__all__ = ["central_url_of", "keeps_asset_state_in_db", "open_app", "open_serving"]


def central_url_of(sql_alchemy_conn: str) -> str:
    """Airflow's metadata DB URL (``postgresql+psycopg://…``, ``mysql+mysqldb://…``,
    ``sqlite:///…``) as a central URL with the dialect's async driver (`async_url`)."""
    parsed = make_url(sql_alchemy_conn)
    plain = parsed.set(drivername=parsed.get_backend_name())
    return async_url(plain.render_as_string(hide_password=False))


def keeps_asset_state_in_db() -> bool:
    """Whether Airflow keeps asset state in its metadata DB's ``asset_state_store`` (its
    ``[state_store] backend`` is the default one, or derives from it)."""
    from airflow.state import resolve_state_backend
    from airflow.state.metastore import MetastoreBackend

    return issubclass(resolve_state_backend(), MetastoreBackend)


async def open_serving() -> tuple[FastAPI, Callable[[], Awaitable[None]]]:
    """The app over Airflow's metadata DB, and the coroutine function that closes it."""
    from airflow.configuration import conf

    return await open_app(central_url_of(conf.get("database", "sql_alchemy_conn")),
                          asset_states=keeps_asset_state_in_db())


async def open_app(central_url: str, *, asset_states: bool, **more: Any
                   ) -> tuple[FastAPI, Callable[[], Awaitable[None]]]:
    """The app `open_serving` serves, over the Airflow metadata DB at `central_url` (`more`:
    other settings, over those resolved from the configuration)."""
    settings = Settings.resolve({
        "central_url": central_url,
        "triggerer_id": f"api-server@{default_triggerer_id()}",
        **more,
    })
    async with contextlib.AsyncExitStack() as stack:
        central = await CentralStore.open(
            settings.resolved_central_url, upgrade_schema=settings.upgrade_schema,
            transaction_timeout=settings.central_transaction_timeout)
        stack.push_async_callback(central.close)
        if settings.asset_mirror != "off":
            central.asset_mirror = AssetMirror(settings.asset_mirror)
        central.use_history(HistoryPolicy.of(settings))
        app = create_app(settings, central=central,
                         auth=AirflowAuthorizer(settings.api_tokens), asset_states=asset_states)
        return app, stack.pop_all().aclose
    raise AssertionError("unreachable")  # pragma: no cover - the with block returns
