"""The simple counters of a history: lost updates, version regressions, stale reads.

They name in words what the linearizability search (`linearizability.check`) finds as a whole.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field

from lin_history import ABSENT, History, Op

__all__ = ["Counters", "counters"]


@dataclass
class Counters:
    #: acknowledged writes replaced by a write not based on them (two acknowledged writes at
    #: one version, or a compare-and-set whose expected version is below an acknowledged one
    #: it then replaced)
    lost_updates: int = 0
    #: an answer (a read's version, a write's version) below one an operation that completed
    #: before it began had answered
    version_regressions: int = 0
    #: reads (a subset of the regressions) that saw a version below one acknowledged before
    #: they began
    stale_reads: int = 0
    examples: list[str] = field(default_factory=list)


def counters(history: History | Iterable[Op]) -> Counters:
    ops = history.ops if isinstance(history, History) else list(history)
    out = Counters()
    by_key: dict[Hashable, list[Op]] = defaultdict(list)
    for o in ops:
        if o.status == "ok":
            by_key[o.key].append(o)
    for key_ops in by_key.values():
        writes = [o for o in key_ops if o.kind in ("write", "cas") and o.version is not None]
        lost: set[int] = set()
        at: dict[int, list[Op]] = defaultdict(list)
        for w in writes:
            at[w.version].append(w)  # type: ignore[index]
        for same in at.values():
            if len(same) > 1:
                lost.update(o.id for o in same[1:])
                _example(out, f"acknowledged at one version: {'; '.join(map(str, same))}")
        versions = sorted(at)
        # a compare-and-set on a present version replaced exactly that version (one based on
        # 0, "no value", follows a tombstone whose version no answer names)
        for c in (o for o in writes if o.kind == "cas" and o.expected):
            assert c.expected is not None
            assert c.version is not None
            skipped = [v for v in versions if c.expected < v < c.version]
            for v in skipped:
                lost.update(o.id for o in at[v])
                _example(out, f"{c} replaced {at[v][0]}")
        out.lost_updates += len(lost)
        # regressions: an op's version below the highest version of ops completed before it
        seen = sorted((o for o in key_ops if _observed(o) is not None),
                      key=lambda o: o.complete)
        order = sorted(seen, key=lambda o: o.invoke)
        high: int = 0
        i = 0
        high_op: Op | None = None
        for o in order:
            while i < len(seen) and seen[i].complete < o.invoke:
                before = _observed(seen[i])
                assert before is not None
                if before > high:
                    high, high_op = before, seen[i]
                i += 1
            mine = _observed(o)
            assert mine is not None
            if mine < high or (o.kind != "read" and mine == high):  # a write moves forward
                out.version_regressions += 1
                if o.kind == "read":
                    out.stale_reads += 1
                _example(out, f"{o} after {high_op}")
    return out


def _observed(o: Op) -> int | None:
    """The version `o` answered with, when it names one."""
    if o.kind == "read":
        return o.version if o.value is not ABSENT else None
    if o.kind in ("write", "cas"):
        return o.version
    return None


def _example(out: Counters, text: str) -> None:
    if len(out.examples) < 10:
        out.examples.append(text)
