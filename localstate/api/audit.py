"""`audit`: the one log line every write through the API leaves (whatever its route).

    localstate.api.audit INFO write by 'triggerer-a' (bound) on POST /api/v1/flush:
        3 row(s) of owners ['dag:a', 'dag:b']

The caller is named by its principal (a token's name, never its secret; an Airflow user),
whether its token is bound to an identity, the route, the owners (the first ten,
and how many more) and the row count, then what else the route notes (the name the request
gave itself when it is not the one recorded, an epoch, an operation). Written after the
write commits; a write refused before it is not one.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from localstate.api.auth import Principal

__all__ = ["audit", "claimed_detail", "recorded_as"]

log = logging.getLogger(__name__)
_SHOWN = 10


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
    log.info("write by %r (%s) on %s: %d row(s) of owners %s%s", caller.name,
             "bound" if caller.bound else "unbound", route, rows, shown,
             f"; {detail}" if detail else "")
