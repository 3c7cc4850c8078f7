"""`get_provider_info`: the ``apache_airflow_provider`` entry point of the localstate package.

Airflow's ProvidersManager calls it to list the provider (``airflow providers list``) and merges
its ``config`` into Airflow's conf defaults, so ``airflow config list`` shows ``[localstate]``
and ``conf.get("localstate", ...)`` knows every option. The options are generated from the
settings specs in `localstate._core.setting_specs`: one source of truth for names, defaults and
help. Its ``db-managers`` make ``airflow db migrate`` migrate localstate's tables
(`localstate.airflow.db_manager`). Its ``connection-types`` declare the ``localstate``
connection (`localstate.airflow.hook.LocalStateHook`) with the Connections form's fields, so
Airflow lists the type and draws the form without importing the hook.
Imports nothing from Airflow.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import Any

from localstate._core.api_connection import CONN_TYPE
from localstate._core.setting_specs import setting_specs

__all__ = ["get_provider_info"]


def _option(default: Any, description: str, secret: bool) -> dict[str, Any]:
    if isinstance(default, bool):
        kind, text = "boolean", str(default)
    elif isinstance(default, int):
        kind, text = "integer", str(default)
    elif isinstance(default, float):
        kind, text = "float", repr(default)
    elif default is None or default == ():
        kind, text = "string", None
    else:
        kind, text = "string", str(default)
    option: dict[str, Any] = {
        "description": description + "\n",
        "version_added": None,
        "type": kind,
        "example": None,
        "default": text,
    }
    if secret:
        option["sensitive"] = True
    return option


#: the Connections form of a ``localstate`` connection: the API's URL, a token and the extra
#: (``ca_bundle``: the CA of an https:// URL signed by a private CA)
_CONNECTION_TYPE: dict[str, Any] = {
    "connection-type": CONN_TYPE,
    "hook-class-name": "localstate.airflow.hook.LocalStateHook",
    "hook-name": "localstate",
    "ui-field-behaviour": {
        # extra stays: its ca_bundle (the CA of an https:// API URL), see api_connection
        "hidden-fields": ["schema", "port", "login"],
        "relabeling": {"host": "API URL", "password": "Token"},
        "placeholders": {
            "host": "http://airflow-api-server:8080/localstate",
            "password": "a token from [localstate] api_tokens",
            "extra": '{"ca_bundle": "/etc/airflow-ca/ca.crt"}',
        },
    },
}


def get_provider_info() -> dict[str, Any]:
    try:
        versions = [version("localstate")]
    except PackageNotFoundError:  # run from a source tree that was not installed
        versions = []
    return {
        "package-name": "localstate",
        "name": "localstate",
        "description": "Local-first, batched state for Airflow triggers: watermarks served "
                       "from a local SQLite cache, flushed to Airflow's asset state store or "
                       "a central table.\n",
        "versions": versions,
        # `airflow db migrate` creates and upgrades localstate's tables (see db_manager.py)
        "db-managers": ["localstate.airflow.db_manager.LocalStateDBManager"],
        "connection-types": [_CONNECTION_TYPE],
        "config": {
            "localstate": {
                "description": "localstate: local-first state for triggers "
                               "(see the localstate README).\n",
                "options": {
                    name: _option(default, text, secret)
                    for name, (default, text, secret) in setting_specs().items()
                },
            },
        },
    }
