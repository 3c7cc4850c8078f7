"""`LocalStatePlugin`: localstate inside Airflow 3.3's API server and web UI.

Registered through the ``airflow.plugins`` entry point (pyproject.toml), so every Airflow
process finds it (``airflow plugins`` lists it). It adds:

* ``fastapi_apps``: localstate's REST API and state page, mounted in the API server at
  ``/localstate`` (``GET /localstate/api/v1/health``, ``/localstate/api/v1/state``, ...,
  the page at ``/localstate/``), over Airflow's metadata DB, with the cache off. See
  `localstate.airflow.serving` for what it serves and `localstate.airflow.auth` for who may
  read and write (Airflow's users by role, machines by localstate token);
* ``external_views``: the state page as a page of Airflow's own UI, under *Browse* in its
  navigation (Airflow shows it in an iframe at ``/plugin/localstate``).

The tables migrate with ``airflow db migrate``: the provider info declares
`localstate.airflow.db_manager.LocalStateDBManager` (see there).

Importing this module opens nothing: the mounted app opens its store at its first request.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from airflow.configuration import conf
from airflow.plugins_manager import AirflowPlugin

from localstate.airflow.mount import LocalStateMount

__all__ = ["MOUNT_PREFIX", "LocalStatePlugin"]

#: where the app is mounted in the API server (under ``[api] base_url``'s path, if any)
MOUNT_PREFIX = "/localstate"


def _page_href() -> str:
    """The state page's address as Airflow's UI loads it (honours ``[api] base_url``)."""
    root = urlsplit(conf.get("api", "base_url", fallback="") or "/").path.rstrip("/")
    return f"{root}{MOUNT_PREFIX}/"


class LocalStatePlugin(AirflowPlugin):
    name = "localstate"
    fastapi_apps: list[Any] = [  # noqa: RUF012 - Airflow reads these class attributes
        {"app": LocalStateMount(), "url_prefix": MOUNT_PREFIX, "name": "localstate"},
    ]
    external_views: list[Any] = [  # noqa: RUF012
        {
            "name": "State variables",
            "href": _page_href(),
            "destination": "nav",
            "category": "browse",
            "url_route": "localstate",
        },
    ]
