"""`LocalStatePlugin`: localstate inside Airflow 3.3's API server and web UI.

Registered through the ``airflow.plugins`` entry point (pyproject.toml), so every Airflow
process finds it (``airflow plugins`` lists it). It adds:

* ``fastapi_apps``: localstate's REST API and state page, mounted in the API server at
  ``/localstate`` (``GET /localstate/api/v1/health``, ``/localstate/api/v1/state``, ...,
  the page at ``/localstate/``), over Airflow's metadata DB, with the cache off. See
  `localstate.airflow._serving` for what it serves and `localstate.airflow._auth` for who may
  read and write (Airflow's users by role, machines by localstate token);
* ``fastapi_root_middlewares``: the state URLs routed on their raw path, so that a name with
  a newline gets localstate's 422, not Airflow's 404 (`localstate.api._app.RawStatePath`);
* ``external_views``: the state page as a page of Airflow's own UI, under *Browse* in its
  navigation (Airflow shows it in an iframe at ``/plugin/localstate``).

The tables migrate with ``airflow db migrate``: the provider info declares
`localstate.airflow.db_manager.LocalStateDBManager` (see there).

Importing this module opens nothing and imports no web framework: the mounted app is built
when the API server first reads ``fastapi_apps``, and opens its store at its first request.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from airflow.configuration import conf
from airflow.plugins_manager import AirflowPlugin

__all__ = ["MOUNT_PREFIX", "LocalStatePlugin"]

#: where the app is mounted in the API server (under ``[api] base_url``'s path, if any)
MOUNT_PREFIX = "/localstate"


def _page_href() -> str:
    """The state page's address as Airflow's UI loads it (honours ``[api] base_url``)."""
    root = urlsplit(conf.get("api", "base_url", fallback="") or "/").path.rstrip("/")
    return f"{root}{MOUNT_PREFIX}/"


class _FastApiApps:
    """``fastapi_apps``, built at first read. Every Airflow process loads its plugins (task
    runners and triggerers too), and only the API server reads this: importing FastAPI and
    localstate's API here cost seconds per process on a loaded machine."""

    def __init__(self) -> None:
        self._apps: list[dict[str, Any]] | None = None

    def __get__(self, instance: object, owner: type | None = None) -> list[dict[str, Any]]:
        if self._apps is None:
            from localstate.airflow._mount import LocalStateMount

            self._apps = [{"app": LocalStateMount(), "url_prefix": MOUNT_PREFIX,
                           "name": "localstate"}]
        return self._apps


class _FastApiRootMiddlewares:
    """``fastapi_root_middlewares``, built at first read: the state URLs routed on their raw
    path in Airflow's app too (`localstate.airflow._mount.root_middlewares`)."""

    def __init__(self) -> None:
        self._middlewares: list[dict[str, Any]] | None = None

    def __get__(self, instance: object, owner: type | None = None) -> list[dict[str, Any]]:
        if self._middlewares is None:
            from localstate.airflow._mount import root_middlewares

            self._middlewares = root_middlewares(MOUNT_PREFIX)
        return self._middlewares


class LocalStatePlugin(AirflowPlugin):
    name = "localstate"
    fastapi_apps = _FastApiApps()
    fastapi_root_middlewares = _FastApiRootMiddlewares()
    external_views: list[Any] = [  # noqa: RUF012 - Airflow reads these class attributes
        {
            "name": "State variables",
            "href": _page_href(),
            "destination": "nav",
            "category": "browse",
            "url_route": "localstate",
        },
    ]
