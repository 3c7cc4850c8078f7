"""Retention rules: ages (``7d``) and owner-glob=age pairs (the ``retention`` setting).

Parsed here, without the database code, so the settings can check them cheaply; applied by
`localstate._sync.central.retention.prune`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from localstate.errors import InvalidInput

__all__ = ["DAY", "RetentionRule", "parse_age", "parse_retention"]

#: seconds in a day
DAY: Final = 86_400.0
_UNITS: Final = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": DAY, "w": 7 * DAY}
_AGE: Final = re.compile(r"(\d+(?:\.\d+)?)\s*([smhdw])")


def parse_age(text: str, *, what: str = "age") -> float | None:
    """Seconds of an age such as ``7d``, ``36h``, ``90m``, ``30s``, ``2w``; None for
    ``never``. Raises `InvalidInput` naming `what` otherwise."""
    if not isinstance(text, str):
        raise InvalidInput(f"{what} must be text such as 7d, not {text!r}")
    cleaned = text.strip().lower()
    if cleaned == "never":
        return None
    match = _AGE.fullmatch(cleaned)
    if match is None:
        raise InvalidInput(
            f"{what} {text!r} is not an age: a number and a unit (s, m, h, d, w), e.g. 7d, "
            "or never")
    seconds = float(match.group(1)) * _UNITS[match.group(2)]
    if seconds <= 0:
        raise InvalidInput(f"{what} {text!r} must be above zero")
    return seconds


@dataclass(frozen=True)
class RetentionRule:
    """Owners matching `pattern` (a glob) lose rows older than `older_than` seconds (None:
    never)."""

    pattern: str
    older_than: float | None


def parse_retention(spec: str | Iterable[RetentionRule] | None) -> tuple[RetentionRule, ...]:
    """``owner-glob=age`` pairs separated by commas (``trigger:*=7d, asset_watcher:*=never``);
    the first match wins. Raises `InvalidInput` naming the bad pair."""
    if spec is None:
        return ()
    if not isinstance(spec, str):
        rules = tuple(spec)
        if not all(isinstance(r, RetentionRule) for r in rules):
            raise InvalidInput(f"retention must be owner-glob=age pairs, not {spec!r}")
        return rules
    parsed: list[RetentionRule] = []
    for part in spec.split(","):
        if not part.strip():
            continue
        pattern, sep, age = part.partition("=")
        if not sep or not pattern.strip():
            raise InvalidInput(
                f"retention entry {part.strip()!r} is not owner-glob=age "
                "(e.g. trigger:*=7d, asset_watcher:*=never)")
        parsed.append(RetentionRule(pattern.strip(), parse_age(
            age, what=f"the retention age of {pattern.strip()!r}")))
    return tuple(parsed)


