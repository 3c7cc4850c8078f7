"""Bearer tokens: who is calling, and which owners they may read or write.

Tokens come from the ``api_tokens`` setting (`localstate._core.setting_specs.ApiToken`): each has a
role, ``read`` or ``read-write``, and the owner prefixes it may touch. With no token configured the
API is open (and `localstate serve` binds loopback only). A request

* without a token, or with one that matches none, gets 401 (and ``WWW-Authenticate: Bearer``);
* reading or writing an owner outside its prefixes, or writing with a read token, gets 403,
  before anything is read or written.

Every write through the API, on any route, leaves one log line on the logger
``localstate.api.audit`` (`audit`), after it commits (a write refused before is not one):

    localstate.api.audit INFO write by 'triggerer-a' (bound) on POST /api/v1/flush:
        3 row(s) of owners ['dag:a', 'dag:b']

The caller is named by its principal (a token's name, never its secret; an Airflow user),
whether its token is bound to an identity, the route, the owners (the first ten, and how many
more) and the row count, then what else the route notes (the name the request gave itself when
it is not the one recorded, an epoch, an operation).

An entry with ``"per_triggerer": true`` holds a key, never accepted as a token itself: each
triggerer presents the credential derived from it and its triggerer_id
(`localstate._core.triggerer_credential`), a token bound to that id with the entry's role and
owners. Its flushes may carry claim epochs only of the claims it made: a row or event at an
owner's current epoch claimed by another triggerer, or above it, is refused with 403
(`localstate.api._sink_routes`), so one triggerer's credential cannot flush another's owners.

Tokens are compared in constant time: the candidate's SHA-256 digest against every configured
token's digest with `hmac.compare_digest`, all of them each time, so neither the length of a
token nor which one matched shows in the time taken. Tokens are never logged: messages name a
token by its label (``token 2``, or the JSON form's ``name``).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from starlette.requests import Request

from localstate._core.setting_specs import ApiToken
from localstate._core.triggerer_credential import PREFIX, credential_triggerer, derive
from localstate.api._errors import ApiError

__all__ = ["Authorizer", "Principal", "audit", "claimed_detail", "owner_scope", "recorded_as",
           "unauthorized"]

#: the audit lines' logger (named apart from this module's: operators route it on its own)
_audit_log = logging.getLogger("localstate.api.audit")
_SHOWN = 10


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
    claimant) whatever the request says (`recorded_as`). `bound`: the
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
    #: a read-write token over every owner (a read token never, whatever its owners), an
    #: Airflow user who may read Airflow's connections and configuration
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
                           f"{self.name} may not touch owner {owner!r}: it lacks the prefix "
                           f"{owner_scope(owner)!r}; it is limited to owners starting with "
                           f"{_listing(self.owners)}; add {owner_scope(owner)!r} to its "
                           "owners in api_tokens, or use a token that has it")

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


def owner_scope(owner: str) -> str:
    """The prefix a token needs for `owner`, as the docs' tokens are scoped: one DAG's
    (``dag:<dag_id>/``) for a task's owner, else the owner's kind (``asset_watcher:``,
    ``trigger:``), else the owner itself."""
    kind, colon, rest = owner.partition(":")
    if not colon:
        return owner
    if kind == "dag" and "/" in rest:
        return f"dag:{rest.split('/', 1)[0]}/"
    return f"{kind}:"


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
            for n, t in enumerate(tokens, 1) if not t.per_triggerer
        ]
        #: the per_triggerer entries: (key, label, role, owners)
        self._keys = [(t.secret, t.name or f"token {n}", t.can_write, _minimal(t.owners))
                      for n, t in enumerate(tokens, 1) if t.per_triggerer]

    @property
    def required(self) -> bool:
        return bool(self._known or self._keys)

    def _triggerer_principal(self, credentials: str) -> Principal | None:
        """The principal of a per-triggerer credential derived from one of the keys."""
        triggerer_id = credential_triggerer(credentials) if self._keys else None
        if triggerer_id is None:
            return None
        given = credentials.encode("ascii")
        found: Principal | None = None
        for key, label, can_write, owners in self._keys:  # every one: constant time
            if hmac.compare_digest(given, derive(key, triggerer_id).encode("ascii")):
                found = Principal(name=f"{label} {triggerer_id!r}", can_write=can_write,
                                  owners=owners, identity=triggerer_id, bound=True,
                                  admin=can_write and owners == ("",))
        return found

    def token_principal(self, authorization: str | None) -> Principal | None:
        """The principal of a configured bearer token in `authorization`; None when the header
        names none (no 401: the caller may know the request by other means)."""
        if not self.required or authorization is None:
            return None
        scheme, _, credentials = authorization.strip().partition(" ")
        credentials = credentials.strip()
        if scheme.lower() != "bearer" or not credentials:
            return None
        if credentials.startswith(PREFIX) and credentials.isascii():
            derived = self._triggerer_principal(credentials)
            if derived is not None:
                return derived
        candidate = hashlib.sha256(credentials.encode("utf-8", "surrogateescape")).digest()
        found: Principal | None = None
        for known in self._known:  # every one, matched or not: constant time
            if hmac.compare_digest(candidate, known.digest):
                found = known.principal
        return found

    async def principal(self, request: Request) -> Principal:
        """The caller of `request`: every route's dependency asks this (401/403 raised).

        Here the bearer token alone; a subclass may also know other callers (the Airflow
        plugin's `localstate.airflow._auth.AirflowAuthorizer`: Airflow's logged-in users).
        """
        return self.authenticate(request.headers.get("authorization"))

    def authenticate(self, authorization: str | None) -> Principal:
        """The principal of an ``Authorization`` header value (401 when it names none)."""
        if not self.required:
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


# -- who a write is recorded as, and its audit line ------------------------------------------


def recorded_as(caller: Principal, claimed: str) -> str:
    """The ``updated_by`` (or claimant) a write of `caller` records: its identity (an Airflow
    user's ``airflow:<user>``, a token's bound identity, else the token's name), whatever the
    request names; `claimed` (the request's name) only for the open API, which has no caller
    to name. The server, not the request, says who wrote."""
    return caller.identity if caller.identity is not None else claimed


def claimed_detail(caller: Principal, claimed: Iterable[str]) -> str:
    """The audit line's note of the names a request gave itself, when they are not the
    recorded one: kept for the operator (which triggerer behind a shared token), never
    recorded as who wrote."""
    other = sorted(set(claimed) - {caller.identity})
    if caller.identity is None or not other:
        return ""
    return "request named " + ", ".join(repr(n) for n in other[:3]) + (
        f" and {len(other) - 3} more" if len(other) > 3 else "")


def audit(caller: Principal, route: str, owners: Iterable[str], rows: int,
          *details: str) -> None:
    """Log one committed write: who, where, which owners, how many rows (and `details`)."""
    detail = "; ".join(d for d in details if d)
    distinct = sorted(set(owners))
    shown = repr(distinct[:_SHOWN]) + (f" and {len(distinct) - _SHOWN} more"
                                       if len(distinct) > _SHOWN else "")
    _audit_log.info("write by %r (%s) on %s: %d row(s) of owners %s%s", caller.name,
             "bound" if caller.bound else "unbound", route, rows, shown,
             f"; {detail}" if detail else "")
