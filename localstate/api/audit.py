"""`audit`: the one log line every write through the API leaves (whatever its route).

    localstate.api.audit INFO write by 'triggerer-a' (bound) on POST /api/v1/flush:
        3 row(s) of owners ['dag:a', 'dag:b']

The caller is named by its principal (a token's name, never its secret; an Airflow user),
whether its rows were recorded as its bound identity, the route, the owners (the first ten,
and how many more) and the row count. Written after the write commits; a write refused
before it is not one.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from localstate.api.auth import Principal

__all__ = ["audit", "recorded_as"]

log = logging.getLogger(__name__)
_SHOWN = 10


def recorded_as(caller: Principal, claimed: str) -> str:
    """The ``updated_by`` a write of `caller` records: its identity when bound to it (an
    Airflow user, a token with an identity), else `claimed` (what the request names)."""
    return caller.identity if caller.bound and caller.identity is not None else claimed


def audit(caller: Principal, route: str, owners: Iterable[str], rows: int,
          detail: str = "") -> None:
    """Log one committed write: who, where, which owners, how many rows (and `detail`)."""
    distinct = sorted(set(owners))
    shown = repr(distinct[:_SHOWN]) + (f" and {len(distinct) - _SHOWN} more"
                                       if len(distinct) > _SHOWN else "")
    log.info("write by %r (%s) on %s: %d row(s) of owners %s%s", caller.name,
             "bound" if caller.bound else "unbound", route, rows, shown,
             f"; {detail}" if detail else "")
