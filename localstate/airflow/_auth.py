"""`AirflowAuthorizer`: who may read and write state through the app mounted in Airflow.

Two kinds of caller, told apart by the credential they present:

* **Machines** (a triggerer with ``sink = api``, a script): a localstate bearer token from the
  API server's ``api_tokens`` setting, with its role and owner prefixes, exactly as with
  `localstate serve` (`localstate.api._auth.Authorizer`). Checked first: a token is a
  localstate credential and never reaches Airflow.
* **People**: Airflow's own login, resolved by Airflow's auth manager through
  ``airflow.api_fastapi.core_api.security`` (``get_user``: the ``Authorization: Bearer <JWT>``
  header, else the ``_token`` session cookie Airflow's UI sets, which the state page in
  Airflow's UI sends with its calls).

  - Reading needs ``is_authorized_view(TRIGGERS)`` (Airflow's own ``requires_access_view``):
    the state of triggers is what the Triggers view shows, so whoever may see those may see
    this. SimpleAuthManager grants it to every role from VIEWER up.
  - Writing also needs ``is_authorized_variable(method="PUT")``: changing a watermark by hand
    is the same kind of act as editing an Airflow Variable (operational data that running code
    reads), an operator's job. SimpleAuthManager grants it from OP up, FAB's default roles to
    Op and Admin; a VIEWER or USER reads, and gets 403 on a write.
  - Seeing the serving process's internals (the central DB's host, port, user and database
    name in ``/status``, the triggerers' hosts and pids) needs what reading Airflow's
    connections and configuration needs: SimpleAuthManager's OP and ADMIN, FAB's Op and
    Admin. A VIEWER or USER sees ``(hidden: ...)`` there.

No credential at all, or one that is neither a localstate token nor a valid Airflow JWT or
session: 401, and nothing is read or written.
"""

from __future__ import annotations

from fastapi import HTTPException
from fastapi.security import HTTPAuthorizationCredentials
from starlette.requests import Request

from localstate.api._auth import Authorizer, Principal, unauthorized
from localstate.api._errors import ApiError

__all__ = ["AirflowAuthorizer"]


def _bearer(authorization: str | None) -> HTTPAuthorizationCredentials | None:
    if authorization is None:
        return None
    scheme, _, credentials = authorization.strip().partition(" ")
    if scheme.lower() != "bearer" or not credentials.strip():
        return None
    return HTTPAuthorizationCredentials(scheme="Bearer", credentials=credentials.strip())


class AirflowAuthorizer(Authorizer):
    """localstate tokens for machines, Airflow's auth manager for people (see the module)."""

    @property
    def required(self) -> bool:
        return True

    async def principal(self, request: Request) -> Principal:
        header = request.headers.get("authorization")
        machine = self.token_principal(header)
        if machine is not None:
            return machine
        # imported here: this module is imported by the app only inside Airflow's API server
        from airflow.api_fastapi.app import get_auth_manager
        from airflow.api_fastapi.auth.managers.models.resource_details import AccessView
        from airflow.api_fastapi.core_api import security

        try:
            user = await security.get_user(request, None, _bearer(header))
        except HTTPException as exc:
            # Airflow says 403 for a JWT that does not verify: to this API any credential it
            # cannot tell is a 401, as with a wrong localstate token
            raise unauthorized(
                "log in to Airflow (its session cookie), or send 'Authorization: Bearer "
                f"<token>' with an Airflow JWT or a localstate token ({exc.detail})") from None
        name = f"Airflow user {user.get_name()!r}"
        try:
            security.requires_access_view(AccessView.TRIGGERS)(request, user)
        except HTTPException:
            raise ApiError(403, "forbidden",
                           f"{name} may not view triggers, so not their state") from None
        manager = get_auth_manager()
        can_write = manager.is_authorized_variable(method="PUT", user=user)
        # who may read Airflow's connections (databases' hosts, ports and logins) and its
        # configuration (which holds the metadata DB's URL) may see where the central DB is
        # and the triggerers' hosts. The configuration alone is not enough: SimpleAuthManager
        # lets every VIEWER read it (what it shows is up to [api] expose_config)
        admin = (manager.is_authorized_connection(method="GET", user=user)
                 and manager.is_authorized_configuration(method="GET", user=user))
        return Principal(name=name if can_write else f"{name} (may not edit variables)",
                         can_write=can_write, owners=("",),
                         identity=f"airflow:{user.get_name()}", bound=True, admin=admin)
