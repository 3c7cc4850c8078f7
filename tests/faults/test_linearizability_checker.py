"""The linearizability checker on small hand-made histories, and on generated ones.

Each hand-made history states the times of its calls; a valid one must be accepted and each
broken one rejected, with the counter that names its fault.
"""

from __future__ import annotations

import math
import random
from typing import Any

import pytest
from linearizability import ABSENT, Op, check, check_key, counters

K = "k"


class H:
    """A hand-made history of one key: ``h.write(0, 1, "a", v=1)`` is a write of "a" called
    at 0, answered at 1 with version 1."""

    def __init__(self) -> None:
        self.ops: list[Op] = []

    def _add(self, kind: Any, start: float, end: float | None, **kw: Any) -> H:
        status = kw.pop("status", "ok" if end is not None else "info")
        op = Op(len(self.ops), len(self.ops), K, kind, start,
                complete=math.inf if end is None else end, status=status, **kw)
        self.ops.append(op)
        return self

    def write(self, start: float, end: float | None, value: Any, v: int | None = None,
              status: str | None = None) -> H:
        return self._add("write", start, end, value=value, version=v,
                         **({"status": status} if status else {}))

    def cas(self, start: float, end: float | None, value: Any, expected: int,
            v: int | None = None, status: str | None = None) -> H:
        return self._add("cas", start, end, value=value, expected=expected, version=v,
                         **({"status": status} if status else {}))

    def read(self, start: float, end: float, value: Any, v: int = 0) -> H:
        return self._add("read", start, end, value=value, version=v)

    def delete(self, start: float, end: float | None, deleted: bool | None = None) -> H:
        return self._add("delete", start, end, deleted=deleted)


def verdict(h: H) -> bool:
    result = check(h.ops)
    return result.violations == 0


def test_a_valid_concurrent_history_is_accepted() -> None:
    h = (H().write(0, 2, "a", 1).write(1, 3, "b", 2)
         .read(1.5, 2.5, "a", 1)  # between the two writes
         .cas(4, 6, "c", 2, 3).cas(4.5, 5.5, "d", 2, status="fail")  # one winner
         .read(7, 8, "c", 3))
    assert verdict(h)
    c = counters(h.ops)
    assert (c.lost_updates, c.version_regressions, c.stale_reads) == (0, 0, 0)


def test_a_read_may_see_a_concurrent_write_either_way() -> None:
    for seen in (("a", 1), ("b", 2)):
        h = H().write(0, 1, "a", 1).write(2, 5, "b", 2).read(3, 4, *seen).read(6, 7, "b", 2)
        assert verdict(h), seen


def test_a_lost_update_is_found() -> None:
    # two compare-and-sets on version 1, acknowledged one after the other
    h = H().write(0, 1, "a", 1).cas(2, 3, "b", 1, 2).cas(4, 5, "c", 1, 2)
    assert not verdict(h)
    assert counters(h.ops).lost_updates == 1
    # a compare-and-set based on version 1 that replaced an acknowledged version 2
    h = H().write(0, 1, "a", 1).write(2, 3, "b", 2).cas(4, 5, "c", 1, 3)
    assert not verdict(h)
    assert counters(h.ops).lost_updates == 1


def test_a_stale_read_is_found() -> None:
    h = H().write(0, 1, "a", 1).write(2, 3, "b", 2).read(4, 5, "a", 1)
    assert not verdict(h)
    c = counters(h.ops)
    assert (c.stale_reads, c.version_regressions) == (1, 1)


def test_a_version_regression_is_found() -> None:
    h = H().write(0, 1, "a", 1).write(2, 3, "b", 2).write(4, 5, "c", 2)
    assert not verdict(h)
    assert counters(h.ops).version_regressions == 1
    h = H().write(0, 1, "a", 5).read(2, 3, "a", 5).write(4, 5, "b", 3)
    assert not verdict(h)
    assert counters(h.ops).version_regressions == 1


def test_a_compare_and_set_refused_at_the_expected_version_is_found() -> None:
    h = H().write(0, 1, "a", 1).cas(2, 3, "b", 1, status="fail")
    assert not verdict(h)
    # refused while another write moved the version on: fine
    h = H().write(0, 1, "a", 1).write(2, 4, "x", 2).cas(3, 5, "b", 1, status="fail")
    assert verdict(h)


def test_a_read_of_a_refused_write_is_found() -> None:
    h = H().write(0, 1, "a", 1).write(1, 3, "p", status="fail").read(2, 2.5, "p", 2)
    assert not verdict(h)


def test_unknown_outcomes_may_or_may_not_take_effect_later() -> None:
    # a write that timed out, seen by a read long after
    h = H().write(0, 1, "a", 1).write(2, None, "x").read(9, 10, "x", 2)
    assert verdict(h)
    # or never seen: it did not happen (or happened and was overwritten: the same to reads)
    h = H().write(0, 1, "a", 1).write(2, None, "x").read(9, 10, "a", 1)
    assert verdict(h)
    # an unknown compare-and-set explains a later refusal at the version before it
    h = H().write(0, 1, "a", 1).cas(2, None, "x", 1).read(3, 4, "x", 2)
    h.cas(5, 6, "y", 1, status="fail")
    assert verdict(h)
    # an unknown write never seen may still explain a later refusal (it moved the version)
    h = H().write(0, 1, "a", 1).read(1, 2, "a", 1).write(2, None, "x")
    h.cas(3, 4, "y", 1, status="fail").read(5, 6, "a", 1)
    assert not verdict(h)  # the last read: "x" was not applied, or "a" would be gone
    h = H().write(0, 1, "a", 1).read(1, 2, "a", 1).write(2, None, "x")
    h.cas(3, 4, "y", 1, status="fail").write(5, 6, "z", 3)
    assert verdict(h)
    # but not a read that went back to the value before it
    h = H().write(0, 1, "a", 1).write(2, None, "x").read(3, 4, "x", 2).read(5, 6, "a", 1)
    assert not verdict(h)
    # an unknown delete, observed
    h = H().write(0, 1, "a", 1).delete(2, None).read(3, 4, ABSENT)
    assert verdict(h)


def test_deletes_empty_the_register_and_versions_go_on_above_the_tombstone() -> None:
    h = (H().write(0, 1, "a", 1).delete(2, 3, deleted=True).read(4, 5, ABSENT)
         .delete(6, 7, deleted=False).write(8, 9, "b", 3).cas(10, 11, "c", 3, 4)
         .cas(12, 13, "d", 0, status="fail"))
    assert verdict(h)
    # a delete that found nothing while the key had a value
    h = H().write(0, 1, "a", 1).delete(2, 3, deleted=False)
    assert not verdict(h)
    # a compare-and-set on 0 (absent) after a delete
    h = H().write(0, 1, "a", 1).delete(2, 3, deleted=True).cas(4, 5, "b", 0, 3)
    assert verdict(h)
    h = H().write(0, 1, "a", 1).cas(4, 5, "b", 0, 2)
    assert not verdict(h)


def generated(seed: int, n: int, clients: int = 8) -> list[Op]:
    """A history of a real register: each op takes effect at a random instant of its call."""
    rng = random.Random(seed)
    value: Any = ABSENT
    version = 0
    busy_until = [0.0] * clients
    plans = []
    for i in range(n):
        c = rng.randrange(clients)
        start = busy_until[c] + rng.random() * 0.01
        point = start + rng.random() * 0.02
        end = point + rng.random() * 0.02
        busy_until[c] = end
        plans.append((point, i, c, start, end))
    ops: list[Op] = []
    last_seen: dict[int, int] = {}
    for _point, i, c, start, end in sorted(plans):
        kind = rng.choice(["read", "read", "write", "cas", "cas", "delete"])
        op = Op(i, c, K, kind, start, complete=end, status="ok")  # type: ignore[arg-type]
        if kind == "read":
            op.value, op.version = value, (0 if value is ABSENT else version)
            last_seen[c] = op.version
        elif kind == "write":
            version += 1
            value = op.value = f"w{i}"
            op.version = version
        elif kind == "cas":
            op.expected = last_seen.get(c, 0)
            op.value = f"w{i}"
            if (op.expected == 0 and value is ABSENT) or (
                    value is not ABSENT and version == op.expected):
                version += 1
                value, op.version = op.value, version
            else:
                op.status = "fail"
        else:
            op.deleted = value is not ABSENT
            if op.deleted:
                version += 1
                value = ABSENT
        ops.append(op)
    return sorted(ops, key=lambda o: o.id)


@pytest.mark.parametrize("seed", range(3))
def test_generated_histories_of_a_real_register_are_accepted(seed: int) -> None:
    ops = generated(seed, 3000)
    result = check(ops)
    assert result.violations == 0, result.report()
    c = counters(ops)
    assert (c.lost_updates, c.version_regressions, c.stale_reads) == (0, 0, 0), c.examples


@pytest.mark.parametrize("seed", range(3))
def test_generated_histories_with_unknown_outcomes_are_accepted(seed: int) -> None:
    """Some writes answered with an unknown outcome (they took effect all the same), and some
    calls that never took effect answered unknown too."""
    ops = generated(seed, 3000)
    rng = random.Random(seed)
    for o in ops:
        if o.kind in ("write", "cas", "delete") and o.status == "ok" and rng.random() < 0.03:
            o.status, o.complete, o.version = "info", math.inf, None
    n = len(ops)
    for i in range(60):  # calls that never reached the register
        start = rng.random() * max(o.invoke for o in ops)
        ops.append(Op(n + i, 100 + i, K, "write", start, value=f"lost-{i}", status="info"))
    result = check(ops)
    assert result.violations == 0, result.report()
    # a search that gives up says so, and counts as a violation
    stopped = check_key(K, ops, max_configurations=10)
    assert (stopped.linearizable, stopped.undecided) == (False, True)


@pytest.mark.parametrize("seed", range(3))
def test_a_generated_history_with_one_answer_changed_is_rejected(seed: int) -> None:
    ops = generated(seed, 2000)
    rng = random.Random(seed)
    # a read that saw a value answers one from well before: a stale read
    reads = [o for o in ops if o.kind == "read" and o.version and o.version > 3]
    victim = rng.choice(reads[len(reads) // 2:])
    older = [o for o in ops if o.kind in ("write", "cas") and o.status == "ok"
             and o.version is not None and o.version < victim.version - 2  # type: ignore[operator]
             and o.complete < victim.invoke]
    source = older[-1]
    victim.value, victim.version = source.value, source.version
    assert check(ops).violations == 1
    assert counters(ops).stale_reads >= 1
