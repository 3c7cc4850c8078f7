"""The ``localstate`` Airflow connection: where the localstate API is, and the token it takes.

A connection of type ``localstate`` names the API served by the plugin in Airflow's API server
(or by ``localstate serve``):

* ``host``: the API's base URL, e.g. ``http://airflow-api-server:8080/localstate``. A host
  without a scheme is completed from the other fields: ``http://<host>[:<port>][/<schema>]``,
  which is what the URI form ``localstate://:TOKEN@airflow-api-server:8080/localstate`` gives;
* ``password``: the bearer token (empty: no token, for an API without ``api_tokens``);
* its extra (optional): ``scheme`` (``https`` makes the URI form's host ``https://...``, as
  ``localstate://:TOKEN@airflow-api-server:8080/localstate?scheme=https`` gives) and
  ``ca_bundle`` (the PEM file of the CAs trusted for it, as the ``api_ca_bundle`` setting).

`endpoint` turns a connection's fields into that URL and token; `LocalStateHook`
(`localstate.airflow.hook`) and the settings' fallback (`airflow_connection_endpoint`, for
``sink = api`` with no ``api_url``) both use it. Never imports Airflow: the fallback reads the
connection only in a process where Airflow's Task SDK is already loaded (a task, a triggerer).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from localstate.errors import ConfigError

__all__ = ["CONN_TYPE", "DEFAULT_CONN_ID", "Endpoint", "airflow_connection_endpoint",
           "endpoint"]

#: the connection type the provider declares, and the connection the hook uses by default
CONN_TYPE: Final = "localstate"
DEFAULT_CONN_ID: Final = "localstate_default"
_EXAMPLE: Final = "http://airflow-api-server:8080/localstate"


@dataclass(frozen=True)
class Endpoint:
    """The API's base URL and the bearer token sent to it (None: none)."""

    url: str
    token: str | None
    #: the PEM file of the CAs trusted for an https:// url (None: the system's)
    ca_bundle: str | None = None

    def __repr__(self) -> str:  # never the token
        return (f"Endpoint(url={self.url!r}, token={'<hidden>' if self.token else None}, "
                f"ca_bundle={self.ca_bundle!r})")


def endpoint(conn_id: str, host: str | None, *, port: int | None = None,
             schema: str | None = None, password: str | None = None,
             extra: Mapping[str, Any] | None = None) -> Endpoint:
    """The endpoint a connection's fields name (`ConfigError` naming `conn_id` when it has no
    host, or an extra it does not take)."""
    host = (host or "").strip()
    if not host:
        raise ConfigError(
            f"the Airflow connection {conn_id!r} has no host: set its host to the localstate "
            f"API's URL (the plugin in Airflow's API server, e.g. {_EXAMPLE})")
    extra = extra or {}
    unknown = set(extra) - {"scheme", "ca_bundle"}
    scheme = extra.get("scheme", "http")
    ca_bundle = extra.get("ca_bundle")
    if unknown or scheme not in ("http", "https") or not isinstance(ca_bundle, str | None):
        raise ConfigError(
            f"the Airflow connection {conn_id!r} has the extra {dict(extra)!r}; it takes "
            "'scheme' (http or https) and 'ca_bundle' (the path of a PEM file of CAs)")
    if "://" in host:
        url = host
    else:
        url = f"{scheme}://{host}" + (f":{port}" if port else "") + (
            f"/{schema.strip('/')}" if schema and schema.strip("/") else "")
    return Endpoint(url.rstrip("/"), password or None, ca_bundle or None)


def airflow_connection_endpoint(conn_id: str = DEFAULT_CONN_ID) -> Endpoint | None:
    """The endpoint of Airflow connection `conn_id`, when this process has Airflow's Task SDK
    loaded and the connection exists; None otherwise (Airflow is never imported here)."""
    sdk = sys.modules.get("airflow.sdk")
    if sdk is None:
        return None
    try:
        conn: Any = sdk.BaseHook.get_connection(conn_id)
    except Exception as exc:
        # AirflowNotFoundException (no such connection) is the ordinary case; anything else
        # (the supervisor unreachable) is too, for a fallback: the caller says what to set
        if type(exc).__name__ == "AirflowNotFoundException":
            return None
        raise ConfigError(
            f"reading the Airflow connection {conn_id!r} failed ({type(exc).__name__}: {exc}); "
            "set [localstate] api_url and api_token instead, or fix the connection") from exc
    return endpoint(conn_id, conn.host, port=conn.port, schema=conn.schema,
                    password=conn.password, extra=conn.extra_dejson)
