"""Bearer tokens: who is calling, and which owners they may read or write.

Tokens come from the ``api_tokens`` setting (`localstate.setting_specs.ApiToken`): each has a role,
``read`` or ``read-write``, and the owner prefixes it may touch. With no token configured the
API is open (and `localstate serve` binds loopback only). A request

* without a token, or with one that matches none, gets 401 (and ``WWW-Authenticate: Bearer``);
* reading or writing an owner outside its prefixes, or writing with a read token, gets 403,
  before anything is read or written.

Tokens are compared in constant time: the candidate's SHA-256 digest against every configured
token's digest with `hmac.compare_digest`, all of them each time, so neither the length of a
token nor which one matched shows in the time taken. Tokens are never logged: messages name a
token by its label (``token 2``, or the JSON form's ``name``).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from starlette.requests import Request

from localstate.api.errors import ApiError
from localstate.setting_specs import ApiToken

__all__ = ["Authorizer", "Principal", "unauthorized"]


def _minimal(prefixes: Iterable[str]) -> tuple[str, ...]:
    """Drop prefixes another one already covers ("a" covers "ab"); sorted."""
    out: list[str] = []
    for p in sorted(set(prefixes)):
        if not any(p.startswith(q) for q in out):
            out.append(p)
    return tuple(out)


@dataclass(frozen=True)
class Principal:
    """The caller: a token's label, role and owner prefixes ("" is every owner).

    `identity` names it in what it writes: the identity bound to its token, else the token's
    name, or ``airflow:<user>``; None only for the open API (no token configured), which has
    no caller to name. Its writes are recorded as `identity` (``updated_by``, a claim's
    claimant) whatever the request says (`localstate.api.audit.recorded_as`). `bound`: the
    identity is one triggerer's (an Airflow user, a token with an ``identity``), so its flush's
    fleet report is recorded under it too, and a tenant's token sees that fleet row; a token
    without one may be shared by several triggerers, each reporting under its own name.
    """

    name: str
    can_write: bool
    owners: tuple[str, ...]
    identity: str | None = None
    bound: bool = False
    #: sees the serving process's internals (the central DB's location, triggerers' hosts):
    #: a read-write token over every owner, an Airflow user who may read Airflow's config
    admin: bool = False

    def writer_tag(self, writer: str | None) -> str | None:
        """The writer id recorded for `writer` (a client's cache file id) sent by this caller:
        bound to the caller (a digest of both), so no caller can pass for another's file."""
        if writer is None or self.identity is None:
            return writer
        return hashlib.sha256(f"{self.identity}\0{writer}".encode(
            "utf-8", "surrogatepass")).hexdigest()[:32]

    def may_read(self, owner: str) -> bool:
        return any(owner.startswith(p) for p in self.owners)

    def require_read(self, owner: str) -> None:
        if not self.may_read(owner):
            raise ApiError(403, "forbidden",
                           f"{self.name} may not touch owner {owner!r}; it is limited to "
                           f"owners starting with {_listing(self.owners)}")

    def require_write(self, owner: str) -> None:
        if not self.can_write:
            raise ApiError(403, "forbidden", f"{self.name} is read-only: it may not write")
        self.require_read(owner)

    def list_prefixes(self, requested: str) -> tuple[str, ...]:
        """The prefixes to list for `requested` within this principal's reach (403: none)."""
        out: list[str] = []
        for p in self.owners:
            if requested.startswith(p):
                return (requested,)
            if p.startswith(requested):
                out.append(p)
        if not out:
            raise ApiError(403, "forbidden",
                           f"{self.name} may not list owners starting with {requested!r}; it is "
                           f"limited to owners starting with {_listing(self.owners)}")
        return _minimal(out)


def _listing(prefixes: Sequence[str]) -> str:
    return ", ".join(repr(p) for p in prefixes)


OPEN = Principal(name="anonymous (no api_tokens configured)", can_write=True, owners=("",),
                 admin=True)


@dataclass(frozen=True)
class _Known:
    digest: bytes
    principal: Principal


class Authorizer:
    def __init__(self, tokens: Sequence[ApiToken]) -> None:
        self._known = [
            _Known(
                hashlib.sha256(t.secret.encode()).digest(),
                Principal(name=t.name or f"token {n}", can_write=t.can_write,
                          owners=_minimal(t.owners),
                          identity=t.identity or t.name or f"token {n}",
                          bound=bool(t.identity),
                          admin=t.can_write and _minimal(t.owners) == ("",)),
            )
            for n, t in enumerate(tokens, 1)
        ]

    @property
    def required(self) -> bool:
        return bool(self._known)

    def token_principal(self, authorization: str | None) -> Principal | None:
        """The principal of a configured bearer token in `authorization`; None when the header
        names none (no 401: the caller may know the request by other means)."""
        if not self._known or authorization is None:
            return None
        scheme, _, credentials = authorization.strip().partition(" ")
        credentials = credentials.strip()
        if scheme.lower() != "bearer" or not credentials:
            return None
        candidate = hashlib.sha256(credentials.encode("utf-8", "surrogateescape")).digest()
        found: Principal | None = None
        for known in self._known:  # every one, matched or not: constant time
            if hmac.compare_digest(candidate, known.digest):
                found = known.principal
        return found

    async def principal(self, request: Request) -> Principal:
        """The caller of `request`: every route's dependency asks this (401/403 raised).

        Here the bearer token alone; a subclass may also know other callers (the Airflow
        plugin's `localstate.airflow.auth.AirflowAuthorizer`: Airflow's logged-in users).
        """
        return self.authenticate(request.headers.get("authorization"))

    def authenticate(self, authorization: str | None) -> Principal:
        """The principal of an ``Authorization`` header value (401 when it names none)."""
        if not self._known:
            return OPEN
        if authorization is None or not authorization.strip():
            raise unauthorized("this API needs a bearer token: send "
                               "'Authorization: Bearer <token>'")
        scheme, _, credentials = authorization.strip().partition(" ")
        if scheme.lower() != "bearer" or not credentials.strip():
            raise unauthorized("expected 'Authorization: Bearer <token>'")
        found = self.token_principal(authorization)
        if found is None:
            raise unauthorized("the bearer token is not valid")
        return found


def unauthorized(message: str) -> ApiError:
    """401 with ``WWW-Authenticate: Bearer``."""
    return ApiError(401, "unauthorized", message, headers={"WWW-Authenticate": "Bearer"})
