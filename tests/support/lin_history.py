"""The history of operations on versioned registers that the linearizability checker reads.

Clients record each operation (`History.invoke`) and then its outcome: `ok`, `fail` (it
definitely did not take effect) or `info` (unknown: it may take effect at any later time, or
never). See `linearizability` for the model and the check.
"""

from __future__ import annotations

import math
import threading
import time
from collections import defaultdict
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["ABSENT", "History", "Kind", "Op", "Status"]

Kind = Literal["read", "write", "cas", "delete"]
Status = Literal["ok", "fail", "info"]


class _Absent:
    """The value of a key with none (never written, or deleted)."""

    def __repr__(self) -> str:
        return "ABSENT"


ABSENT: Any = _Absent()


@dataclass
class Op:
    """One operation: what was asked, when, and what came back.

    `value`: the value written (write, cas) or read (read, ok). `version`: the version a write
    returned or a read saw (0 for a read that found nothing). `expected`: a cas's expected
    version. `deleted`: whether a delete found a value.
    """

    id: int
    client: int
    key: Hashable
    kind: Kind
    invoke: float
    value: Any = None
    expected: int | None = None
    complete: float = math.inf
    status: Status | None = None
    version: int | None = None
    deleted: bool | None = None
    error: str | None = None
    #: for a failed op: whether it was refused for its expected version (a 409), so that the
    #: search must explain it, or for another reason (bad input, a closed store)
    conflict: bool = True

    def __str__(self) -> str:
        args = {"read": "", "write": f"{self.value!r}", "delete": "",
                "cas": f"{self.value!r} if v{self.expected}"}[self.kind]
        out = {"ok": f"ok {self._result()}", "fail": f"fail {self.error or ''}".strip(),
               "info": f"info {self.error or ''}".strip(), None: "pending"}[self.status]
        return (f"#{self.id} c{self.client} {self.kind}({args}) [{self.invoke:.4f}, "
                f"{self.complete:.4f}] -> {out}")

    def _result(self) -> str:
        if self.kind == "read":
            return "empty" if self.value is ABSENT else f"{self.value!r} v{self.version}"
        if self.kind == "delete":
            return "deleted" if self.deleted else "nothing to delete"
        return f"v{self.version}"


class History:
    """Operations recorded by concurrent clients (threads or tasks); thread-safe."""

    def __init__(self, clock: Any = time.monotonic) -> None:
        self.ops: list[Op] = []
        self._clock = clock
        self._lock = threading.Lock()

    def invoke(self, client: int, key: Hashable, kind: Kind, value: Any = None,
               expected: int | None = None) -> Op:
        with self._lock:
            op = Op(len(self.ops), client, key, kind, self._clock(), value, expected)
            self.ops.append(op)
        return op

    def ok(self, op: Op, *, version: int | None = None, value: Any = None,
           deleted: bool | None = None) -> None:
        """`op` took effect (writes: at `version`; reads: saw `value` at `version`)."""
        op.complete = self._clock()
        op.status = "ok"
        if op.kind == "read":
            op.value = value
            op.version = 0 if value is ABSENT else version
        elif op.kind == "delete":
            op.deleted = deleted
        else:
            op.version = version

    def fail(self, op: Op, error: str = "", *, conflict: bool = True) -> None:
        """`op` definitely did not take effect: refused for its expected version (`conflict`),
        or for another reason."""
        op.complete = self._clock()
        op.status = "fail"
        op.error = error
        op.conflict = conflict

    def info(self, op: Op, error: str = "") -> None:
        """`op`'s outcome is unknown: it may take effect at any later time, or never."""
        op.status = "info"
        op.error = error
        op.complete = math.inf

    def by_status(self) -> dict[str, int]:
        out: dict[str, int] = defaultdict(int)
        for op in self.ops:
            out[f"{op.kind} {op.status}"] += 1
        return dict(out)
