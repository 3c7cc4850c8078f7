"""Conflict policies: what a flush does when the central record is another writer's, or not the
one the write was based on.

* ``reject`` (default): the central record wins; the local one is replaced by it.
* ``last_writer_wins``: the local write replaces the central record.
* ``max``: keep the greater value, by the order of `localstate._core.orders` the spec names:
  ``max`` guesses (numbers by value, ISO-8601 timestamps by time, other strings as text, with a
  warning once per owner); ``max:int``, ``max:timestamp`` and ``max:text`` declare it, and a
  value that does not fit a declared order is refused at ``set`` time (`PolicyMap.check_value`).
  ``max:<field>`` and ``max:<field>:<order>`` compare that field of two objects.

Whatever the policy, a writer's own sequential write (based on the central record it wrote
itself) always lands: policies settle writes against *another writer's* record, or against a
base that is not current. Under ``max`` another writer's current record is also never lowered,
even by a write based on it: a watermark only moves forward when the trigger changes hands.

Spec grammar: ``max:<rest>``. When the last ``:``-separated segment of ``<rest>`` is an order
name (``int``, ``timestamp``, ``text``, or ``auto`` for plain max's guess) it is the order and
what precedes it the field; otherwise all of ``<rest>`` is the field (which may hold colons). So
a field literally named ``int`` is written ``max:int:auto`` (guessed order) or ``max:int:int``.

A policy is chosen per owner: one name for every owner, or a mapping from owner glob patterns to
names, tried in order (``{"asset_watcher:*": "max", "*": "reject"}``).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from localstate._core.codec import decode
from localstate._core.orders import AUTO, ORDERS, Unfit, auto_key, declared_key, shown
from localstate._core.rows import CentralRow, DirtyRow
from localstate.errors import ConfigError, InvalidInput

__all__ = ["ConflictPolicy", "PolicyMap"]

log = logging.getLogger("localstate.conflicts")

_NAMES: Final = ("reject", "last_writer_wins", "max")
_EXPECTED: Final = (
    "expected reject, last_writer_wins, max, max:<order>, max:<field> or max:<field>:<order> "
    f"(orders: {', '.join(o for o in ORDERS if o != AUTO)}, or {AUTO} for max's guess)"
)
#: owners a policy remembers having warned about (bounded: the warnings are once per owner)
_MAX_WARNED: Final = 10_000


class _Missing:
    """Sorts below everything: an object without the compared field never wins (``max:f``)."""

    def __lt__(self, other: object) -> bool:
        return not isinstance(other, _Missing)

    def __gt__(self, other: object) -> bool:
        return False

    def __ge__(self, other: object) -> bool:
        return isinstance(other, _Missing)

    def __le__(self, other: object) -> bool:
        return True


@dataclass(frozen=True)
class ConflictPolicy:
    name: str
    #: for max:<field>, the object field compared
    field: str | None = None
    #: for max, the order compared by: "auto" (guessed per value) or a declared one
    order: str = AUTO
    #: owners already warned about under the guessed order (each warned once)
    _warned: set[str] = dataclasses.field(default_factory=set, init=False, compare=False,
                                          repr=False)

    @classmethod
    def parse(cls, spec: str) -> ConflictPolicy:
        name, colon, rest = spec.partition(":")
        if name in _NAMES and not colon:
            return cls(name)
        if name == "max" and rest:
            head, sep, last = rest.rpartition(":")
            fld, order = ((head if sep else None), last) if last in ORDERS else (rest, AUTO)
            if fld != "":
                return cls(name, fld, order)
        raise ConfigError(f"conflict policy {spec!r}: {_EXPECTED}")

    @property
    def spec(self) -> str:
        """The spec this policy parses from (`parse(p.spec) == p`)."""
        parts = [self.name]
        if self.field is not None:
            parts.append(self.field)
        if self.order != AUTO or (self.field is not None
                                  and self.field.rpartition(":")[2] in ORDERS):
            parts.append(self.order)
        return ":".join(parts)

    @property
    def is_max(self) -> bool:
        return self.name == "max"

    @property
    def declares_order(self) -> bool:
        """max with a declared order: values are checked at `set` time."""
        return self.order != AUTO

    def local_wins(self, local: DirtyRow, central: CentralRow) -> bool:
        """Whether the local write should replace `central` (which it was not based on)."""
        if self.name == "reject":
            return False
        if self.name == "last_writer_wins":
            return True
        return self.exceeds(local.owner, local.data, central.data, strictly=True)

    def exceeds(self, owner: str, local: str | None, central: str | None, *,
                strictly: bool) -> bool:
        """Under max: is `owner`'s local value greater than (or, not strictly, equal to)
        central's?

        A deletion on either side lets the local write through: deleting a watermark is an
        explicit reset, and a deleted central record has no value to protect.
        """
        if local is None or central is None:
            return True
        a = self._comparable(owner, local)
        b = self._comparable(owner, central)
        unfit = a if isinstance(a, Unfit) else b if isinstance(b, Unfit) else None
        if unfit is not None:
            # only a record written before the order was declared (values are checked at set
            # time): a value that fits the order wins over one that does not
            keep_local = not isinstance(a, Unfit)
            log.warning("max policy %s of owner %r: the %s value %s does not fit its order; "
                        "the %s value is kept", self.spec, owner,
                        "local" if unfit is a else "central", shown(unfit.value),
                        "local" if keep_local else "central")
            return keep_local
        try:
            return bool(a > b) if strictly else bool(a >= b)
        except TypeError:
            log.warning(
                "max policy of owner %r cannot compare %r with %r; keeping the central value "
                "(declare the order: max:int, max:timestamp, max:text, or max:<field>:<order>)",
                owner, a, b,
            )
            return False

    def check(self, owner: str, value: Any, data: str) -> None:
        """Raise `InvalidInput` when `value` (encoded: `data`) does not fit the declared
        order. The value is tried as given, then as it decodes (a datetime is its ISO text)."""
        try:
            declared_key(self.order, self.field, value)
        except Unfit:
            try:
                declared_key(self.order, self.field, decode(data))
            except Unfit as exc:
                raise InvalidInput(
                    f"conflict policy {self.spec} of owner {owner!r} compares {exc.expected}; "
                    f"the value {shown(value)} is not one, nothing was written"
                ) from None

    def _comparable(self, owner: str, data: str) -> Any:
        value = decode(data)
        if self.order != AUTO:
            try:
                return declared_key(self.order, self.field, value)
            except Unfit as exc:
                return exc
        if self.field is not None:
            value = value.get(self.field, _Missing) if isinstance(value, dict) else _Missing
            if value is _Missing:
                return _Missing()
        key, as_text = auto_key(value)
        if as_text and owner not in self._warned and len(self._warned) < _MAX_WARNED:
            self._warned.add(owner)
            log.warning(
                "max policy %s of owner %r compares the string %s as text (\"10\" sorts before "
                "\"9\"): declare the order, max:int for integers held in strings, or max:text "
                "to compare text", self.spec, owner, shown(value),
            )
        return key


#: owners whose policy `PolicyMap` remembers (a cache: cleared when full, so a triggerer
#: whose owners come and go for weeks keeps no trail of them)
_CACHED_OWNERS: Final = 10_000


class PolicyMap:
    """The policy of each owner, from a name or an ordered glob-to-name mapping."""

    def __init__(self, spec: str | Mapping[str, str] = "reject") -> None:
        #: the spec this map was made from (the `conflict_policy` setting's form): what a
        #: client sends an API server, which makes the same map from it
        self.spec: str | dict[str, str] = spec if isinstance(spec, str) else dict(spec)
        if isinstance(spec, str):
            self._rules: list[tuple[str, ConflictPolicy]] = [("*", ConflictPolicy.parse(spec))]
        else:
            self._rules = [(pattern, ConflictPolicy.parse(name)) for pattern, name in spec.items()]
        self._default = ConflictPolicy("reject")
        self._cache: dict[str, ConflictPolicy] = {}
        #: whether some owner's policy declares an order: only then `check_value` is called
        self.checks_values = any(p.declares_order for _, p in self._rules)

    def for_owner(self, owner: str) -> ConflictPolicy:
        policy = self._cache.get(owner)
        if policy is None:
            policy = next(
                (p for pattern, p in self._rules if fnmatch.fnmatchcase(owner, pattern)),
                self._default,
            )
            if len(self._cache) >= _CACHED_OWNERS:  # owners come and go: start afresh
                self._cache.clear()
            self._cache[owner] = policy
        return policy

    def check_value(self, owner: str, value: Any, data: str) -> None:
        """Raise `InvalidInput` when `owner`'s policy declares an order `value` (encoded:
        `data`) does not fit. Call it only when `checks_values`, before writing anything."""
        try:
            policy = self._cache[owner]  # the common case, inlined: `set` calls this
        except (KeyError, TypeError):
            if not isinstance(owner, str):
                return  # not a name: the store's name checks refuse it
            policy = self.for_owner(owner)
        if policy.order != AUTO:
            policy.check(owner, value, data)

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
