"""The state-variable model: names, records, durability modes and the "unset" sentinel.

A state variable is named by ``(owner, key)``. The owner says who it belongs to
(``asset_watcher:<name>``, ``trigger:<classpath>:<hash>``, ``dag:<dag_id>/<task_id>``...), the key
names one value of that owner (``watermark``, ``cursor``...). Every write makes a new ``version``
(one more than the last), stamped with ``updated_at`` and ``updated_by`` (the writer's id).
"""

from __future__ import annotations

import enum
import re
from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Final, Literal, NoReturn

from localstate.errors import InvalidInput, InvalidName

__all__ = [
    "ASSET_OWNER_PREFIX",
    "DURABILITIES",
    "MAX_NAME_LENGTH",
    "MAX_VERSION",
    "NAME_RULE",
    "UNSET",
    "Durability",
    "FlushState",
    "Record",
    "Unset",
    "asset_name",
    "check_durability",
    "check_key",
    "check_name",
    "check_names",
    "epoch_to_datetime",
    "refuse_unhashable_names",
]

MAX_NAME_LENGTH: Final = 250
#: the largest version a key can have: versions are 64-bit signed integers (BIGINT columns)
MAX_VERSION: Final = 2**63 - 1

#: an owner naming an Airflow asset (an asset watcher's): this prefix, then the asset's name
ASSET_OWNER_PREFIX: Final = "asset_watcher:"


def asset_name(owner: str) -> str | None:
    """The asset an owner names (``asset_watcher:<name>``), else None."""
    if owner.startswith(ASSET_OWNER_PREFIX) and len(owner) > len(ASSET_OWNER_PREFIX):
        return owner[len(ASSET_OWNER_PREFIX):]
    return None


Durability = Literal["memory", "local", "central"]
DURABILITIES: Final[frozenset[str]] = frozenset({"memory", "local", "central"})

# C0 and C1 control characters and lone surrogates (which cannot be encoded as UTF-8).
_BAD_NAME_CHARS: Final = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")
#: what `check_name` takes, in words (the REST reference and the API's parameters say it)
NAME_RULE: Final = (
    f"1 to {MAX_NAME_LENGTH} characters, with no control character (U+0000 to U+001F, such as "
    "newline, tab or NUL, and U+007F to U+009F) and no lone surrogate")


class Unset(enum.Enum):
    """The type of `UNSET`: "no value given", distinct from `None` (a value JSON can hold)."""

    UNSET = "UNSET"

    def __repr__(self) -> str:
        return "UNSET"

    def __bool__(self) -> bool:
        return False


UNSET: Final = Unset.UNSET


class FlushState(str, enum.Enum):
    """Where a record stands against the central DB."""

    #: written locally, not yet in the central DB
    DIRTY = "dirty"
    #: the central DB holds this version
    FLUSHED = "flushed"
    #: the last flush found another writer's record; see the conflict policy
    CONFLICT = "conflict"


@dataclass(frozen=True, slots=True)
class Record:
    """One state variable as the store holds it."""

    owner: str
    key: str
    value: Any
    version: int
    updated_at: datetime
    updated_by: str
    flush_state: FlushState
    #: the version the central DB is known to hold (0: none known yet)
    central_version: int


def check_name(kind: str, name: object) -> str:
    """Return `name` if it is a valid owner or key, else raise `InvalidName` saying why."""
    if not isinstance(name, str):
        raise InvalidName(f"{kind} must be a str, not {type(name).__name__}")
    if not name:
        raise InvalidName(f"{kind} must not be empty")
    if len(name) > MAX_NAME_LENGTH:
        raise InvalidName(
            f"{kind} is {len(name)} characters long; the limit is {MAX_NAME_LENGTH}: "
            f"{name[:40]!r}..."
        )
    bad = _BAD_NAME_CHARS.search(name)
    if bad is not None:
        raise InvalidName(
            f"{kind} {name!r} holds the character {bad.group()!r} at position {bad.start()}: "
            "control characters and lone surrogates are not allowed in names"
        )
    return name


def check_names(kind: str, names: Collection[str]) -> None:
    """`check_name` for many strings at once: one search over them all (a batch of
    thousands costs one regex pass); the first bad one raises as `check_name` does."""
    if not names:
        return
    if (min(map(len, names)) == 0 or max(map(len, names)) > MAX_NAME_LENGTH
            or _BAD_NAME_CHARS.search("/".join(names)) is not None):
        for name in names:
            check_name(kind, name)


def check_durability(durability: object) -> Durability:
    """Return `durability` if it names a mode, else raise `InvalidInput` listing the modes."""
    if not isinstance(durability, str) or durability not in DURABILITIES:  # [] is unhashable
        raise InvalidInput(
            f"durability must be one of {sorted(DURABILITIES)}, not {durability!r}"
        )
    return durability  # type: ignore[return-value]


def refuse_unhashable_names(owner: object, key: object) -> NoReturn:
    """Raise the `InvalidName` for names a dict lookup refused (unhashable, so not str)."""
    check_name("owner", owner)
    check_name("key", key)
    raise InvalidName(f"owner and key must be str, not {type(owner).__name__} and "
                      f"{type(key).__name__}")


def check_key(k: tuple[object, object]) -> None:
    """Raise `InvalidName` unless `k` is an (owner, key) pair of valid names."""
    try:
        hash(k)
    except TypeError:  # an unhashable owner or key (a list, say)
        refuse_unhashable_names(*k)
    check_name("owner", k[0])
    check_name("key", k[1])


def epoch_to_datetime(ts: float) -> datetime:
    """A POSIX timestamp as an aware UTC datetime."""
    return datetime.fromtimestamp(ts, tz=timezone.utc)
