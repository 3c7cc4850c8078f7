"""Conflict policies: what a flush does when the central record is not the one it was based on.

* ``reject`` (default): the central record wins; the local one is replaced by it.
* ``last_writer_wins``: the local write replaces the central record.
* ``max``: keep the greater value: numbers by value, ISO-8601 timestamps by time, other strings
  by text. ``max:<field>`` compares that field of two objects. Under ``max`` the central value is
  also never lowered by a write that *is* based on it: a watermark only moves forward, whoever
  flushes, however late.

A policy is chosen per owner: one name for every owner, or a mapping from owner glob patterns to
names, tried in order (``{"asset_watcher:*": "max", "*": "reject"}``).
"""

from __future__ import annotations

import fnmatch
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Final

from localstate.codec import decode
from localstate.errors import ConfigError
from localstate.sync.rows import CentralRow, DirtyRow

__all__ = ["ConflictPolicy", "PolicyMap"]

log = logging.getLogger(__name__)

_NAMES: Final = ("reject", "last_writer_wins", "max")
_MISSING: Final[Any] = object()


@dataclass(frozen=True)
class ConflictPolicy:
    name: str
    #: for max:<field>, the object field compared
    field: str | None = None

    @classmethod
    def parse(cls, spec: str) -> ConflictPolicy:
        name, _, fld = spec.partition(":")
        if name not in _NAMES or (fld and name != "max"):
            raise ConfigError(
                f"conflict policy {spec!r} is not one of reject, last_writer_wins, max, "
                "max:<field>"
            )
        return cls(name, fld or None)

    @property
    def spec(self) -> str:
        return f"{self.name}:{self.field}" if self.field else self.name

    @property
    def is_max(self) -> bool:
        return self.name == "max"

    def local_wins(self, local: DirtyRow, central: CentralRow) -> bool:
        """Whether the local write should replace `central` (which it was not based on)."""
        if self.name == "reject":
            return False
        if self.name == "last_writer_wins":
            return True
        return self.exceeds(local.data, central.data, strictly=True)

    def exceeds(self, local: str | None, central: str | None, *, strictly: bool) -> bool:
        """Under max: is the local value greater than (or, not strictly, equal to) central's?

        A deletion on either side lets the local write through: deleting a watermark is an
        explicit reset, and a deleted central record has no value to protect.
        """
        if local is None or central is None:
            return True
        a = self._comparable(decode(local))
        b = self._comparable(decode(central))
        try:
            return bool(a > b) if strictly else bool(a >= b)
        except TypeError:
            log.warning(
                "max policy cannot compare %r with %r; keeping the central value", a, b
            )
            return False

    def _comparable(self, value: Any) -> Any:
        if self.field is not None:
            value = value.get(self.field, _MISSING) if isinstance(value, dict) else _MISSING
            if value is _MISSING:
                return _Missing()
        if isinstance(value, bool):
            return int(value)
        if isinstance(value, str):
            return _timestamp(value) or value
        return value


class _Missing:
    """Sorts below everything: an object without the compared field never wins."""

    def __lt__(self, other: object) -> bool:
        return not isinstance(other, _Missing)

    def __gt__(self, other: object) -> bool:
        return False

    def __ge__(self, other: object) -> bool:
        return isinstance(other, _Missing)

    def __le__(self, other: object) -> bool:
        return True


def _timestamp(text: str) -> datetime | None:
    if len(text) < 10 or not text[:4].isdigit() or text[4] != "-":
        return None
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)


class PolicyMap:
    """The policy of each owner, from a name or an ordered glob-to-name mapping."""

    def __init__(self, spec: str | Mapping[str, str] = "reject") -> None:
        if isinstance(spec, str):
            self._rules: list[tuple[str, ConflictPolicy]] = [("*", ConflictPolicy.parse(spec))]
        else:
            self._rules = [(pattern, ConflictPolicy.parse(name)) for pattern, name in spec.items()]
        self._default = ConflictPolicy("reject")
        self._cache: dict[str, ConflictPolicy] = {}

    def for_owner(self, owner: str) -> ConflictPolicy:
        policy = self._cache.get(owner)
        if policy is None:
            policy = next(
                (p for pattern, p in self._rules if fnmatch.fnmatchcase(owner, pattern)),
                self._default,
            )
            if len(self._cache) < 100_000:
                self._cache[owner] = policy
        return policy

    @property
    def uniform(self) -> ConflictPolicy | None:
        """The one policy every owner gets, when the map has no owner-specific rules."""
        if not self._rules:
            return self._default
        pattern, policy = self._rules[0]
        return policy if pattern == "*" else None

    @property
    def any_max(self) -> bool:
        return any(p.is_max for _, p in self._rules)

    def describe(self) -> str:
        return ", ".join(f"{pattern}={p.spec}" for pattern, p in self._rules)
