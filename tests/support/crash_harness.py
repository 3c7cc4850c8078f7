"""The crash harness: a writer process killed with SIGKILL at random moments, then checked.

Parameterized and importable, for the fault tests and for a benchmark alike::

    async with WriterZygote() as zygote:
        checker = CrashChecker(options)                # what each restart must find
        for _ in range(rounds):
            run = await zygote.run_and_kill(options, run_for=0.3)
            await checker.check(run, where="round 1")   # raises AssertionError on a loss
        checker.acks_checked, checker.lost, ...

`WriterOptions` says how the writer process (`crash_writer.py`, ``store`` mode) runs: its
central DB, cache file, durability mode, flush interval, number of owners, keys and writer
coroutines. `WriterZygote` starts one fork server per test, so a round costs no interpreter
start-up; each round's writer is still a process of its own. `CrashChecker` reopens the cache
as a restarted triggerer would and checks every acknowledgement the killed process reported.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import random
import signal
import sqlite3
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from crash_writer import state_keys

from localstate import StateStore
from localstate._cache.cache_file import APPLICATION_ID, SCHEMA_VERSION
from localstate._cache.entry import StateKey
from localstate._core.codec import decode
from localstate._sync.central.central_store import CentralStore

__all__ = [
    "CRASH_WRITER",
    "Ack",
    "CrashChecker",
    "Run",
    "WriterOptions",
    "WriterZygote",
    "cache_integrity",
    "crash_seed",
]

CRASH_WRITER = Path(__file__).with_name("crash_writer.py")
_START_TIMEOUT = 60.0


def crash_seed() -> int:
    """A fresh seed, or ``LOCALSTATE_CRASH_SEED`` to replay a failed run."""
    fixed = os.environ.get("LOCALSTATE_CRASH_SEED")
    return int(fixed) if fixed else random.SystemRandom().randrange(2**32)


@dataclass(frozen=True)
class WriterOptions:
    """How the writer process runs (the ``store`` mode arguments of crash_writer.py)."""

    central_url: str
    cache_path: Path
    triggerer_id: str = "crash-triggerer"
    durability: str = "local"
    flush_interval: float = 0.1
    local_sync: str = "full"
    memory_window: float = 0.05
    owners: int = 50
    keys: int = 4
    writers: int = 25
    pace: float = 0.0

    @property
    def state_keys(self) -> list[StateKey]:
        return state_keys(self.owners, self.keys)

    def replace(self, **changes: Any) -> WriterOptions:
        return dataclasses.replace(self, **changes)

    def as_json(self) -> str:
        return json.dumps({**dataclasses.asdict(self), "cache_path": str(self.cache_path)})


@dataclass(frozen=True)
class Ack:
    value: int
    version: int
    at: float  # time.monotonic() in the writer (the clock is system-wide)


@dataclass
class Run:
    """What one killed writer acknowledged, per key in order, and when it was killed."""

    options: WriterOptions
    acks: dict[StateKey, list[Ack]] = field(default_factory=dict)
    killed_at: float = 0.0

    @property
    def count(self) -> int:
        return sum(len(a) for a in self.acks.values())

    def add_ack_line(self, line: bytes) -> None:
        """Record one ``<owner> <key> <value> <version> <time>`` line of the writer."""
        owner, key, value, version, at = line.decode().split()
        self.acks.setdefault((owner, key), []).append(Ack(int(value), int(version), float(at)))


class WriterZygote:
    """The fork server of crash_writer.py: one store process per `run_and_kill`."""

    def __init__(self, env: dict[str, str] | None = None) -> None:
        self._env = env  # added to this environment (the power-loss tests' LD_PRELOAD shim)
        self._proc: asyncio.subprocess.Process | None = None
        self._stderr: list[bytes] = []
        self._stderr_task: asyncio.Task[None] | None = None
        self._child: int | None = None  # a writer not yet seen to exit

    async def __aenter__(self) -> WriterZygote:
        self._proc = await asyncio.create_subprocess_exec(
            sys.executable, str(CRASH_WRITER), "zygote",
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=None if self._env is None else {**os.environ, **self._env},
        )
        assert self._proc.stderr is not None
        self._stderr_task = asyncio.create_task(self._drain(self._proc.stderr))
        return self

    async def _drain(self, stream: asyncio.StreamReader) -> None:
        while chunk := await stream.read(65536):
            self._stderr.append(chunk)

    @property
    def stderr(self) -> str:
        return b"".join(self._stderr).decode(errors="replace")

    async def __aexit__(self, *exc_info: object) -> None:
        proc = self._proc
        if proc is None:
            return
        assert proc.stdin is not None
        if self._child is not None:  # a round that failed half-way: its writer must not linger
            with contextlib.suppress(ProcessLookupError):
                os.kill(self._child, signal.SIGKILL)
        proc.stdin.close()  # end of input: the zygote returns
        try:
            await asyncio.wait_for(proc.wait(), 30)
        except asyncio.TimeoutError:
            proc.kill()
            await proc.wait()
        if self._stderr_task is not None:
            await self._stderr_task

    async def run_and_kill(self, options: WriterOptions, run_for: float,
                           until: Callable[[], bool] | None = None) -> Run:
        """Start a writer, let it write for `run_for` s after it is ready, SIGKILL it.

        With `until`, the writer goes on past `run_for` (up to `_START_TIMEOUT` s more) until
        `until()` is true (the power-loss tests wait for a checkpoint)."""
        proc = self._proc
        assert proc is not None, "use the zygote in `async with`"
        assert proc.stdin is not None
        assert proc.stdout is not None
        stdout = proc.stdout
        proc.stdin.write(options.as_json().encode() + b"\n")
        await proc.stdin.drain()
        ready = await asyncio.wait_for(stdout.readline(), _START_TIMEOUT)
        if not ready.startswith(b"READY "):
            raise AssertionError(f"the writer did not start: {ready!r}\n{self.stderr}")
        pid = self._child = int(ready.split()[1])
        run = Run(options)
        reader = asyncio.create_task(self._read_acks(stdout, run))
        try:
            await asyncio.sleep(run_for)
            waited = 0.0
            while until is not None and not until() and waited < _START_TIMEOUT:
                await asyncio.sleep(0.05)
                waited += 0.05
            run.killed_at = time.monotonic()
            os.kill(pid, signal.SIGKILL)
            # the lines still in the pipe: written, so acknowledged, before the kill
            exited, status = await asyncio.wait_for(reader, _START_TIMEOUT)
        finally:
            if not reader.done():
                reader.cancel()
        assert exited == pid, (exited, pid)
        self._child = None
        killed = os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
        assert killed, f"the writer died on its own (wait status {status}):\n{self.stderr}"
        return run

    @staticmethod
    async def _read_acks(stdout: asyncio.StreamReader, run: Run) -> tuple[int, int]:
        while line := await stdout.readline():
            # one os.write per line: a line is never cut by the kill
            assert line.endswith(b"\n"), line
            parts = line.split()
            if parts[0] == b"EXIT":
                return int(parts[1]), int(parts[2])
            run.add_ack_line(line)
        raise AssertionError("the zygote closed its output before reporting the writer's exit")


def cache_integrity(path: Path) -> None:
    """The cache file passes SQLite's integrity check and is still a localstate cache."""
    with contextlib.closing(sqlite3.connect(path)) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)], path
        assert conn.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID, path
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION, path


async def central_state(url: str, keys: list[StateKey]) -> dict[StateKey, tuple[int, int]]:
    """(value, version) of each key the central DB holds, read by a client of its own."""
    central = await CentralStore.open(url)
    try:
        rows = await central.read_many(keys)
    finally:
        await central.close()
    return {k: (int(decode(r.data)), r.version) for k, r in rows.items() if r.data is not None}


async def local_state(store: StateStore, keys: list[StateKey]) -> dict[StateKey, tuple[int, int]]:
    """(value, version) of every key the store holds."""
    # all at once: the misses then go to the central DB together, in one batched read
    records = await asyncio.gather(*(store.record(owner, key) for owner, key in keys))
    return {k: (int(r.value), r.version) for k, r in zip(keys, records, strict=True)
            if r is not None}


@dataclass
class CrashChecker:
    """What a restart after each kill must find, and across rounds.

    * ``local`` and ``central``: every acknowledged value (or a later one) is in the reopened
      cache at its version or later, and reaches the central DB (``central``: before the
      restart, since the call returned only once the DB held it);
    * ``memory``: only writes acknowledged within `memory_bound` s of the kill may be missing;
    * every mode: no value or version goes backwards across restarts, no value appears that
      was never written (at most the one write in flight), the restart's flush leaves the
      central DB equal to the cache, and the cache file passes ``PRAGMA integrity_check``.
    """

    #: `memory` writes may be lost only if acknowledged this close to the kill. The promise is
    #: the memory window (0.05 s) plus one commit; 1 s leaves room for a busy machine.
    memory_bound: float = 1.0
    #: count a `local`/`central` loss in `lost` without failing the check (a power loss under
    #: ``local_sync=normal``, which promises nothing about the last commits)
    tolerate_loss: bool = False
    acks_checked: int = 0  # acknowledged writes covered by a durability check
    lost: int = 0  # acknowledged writes missing where the mode promised them
    lost_in_window: int = 0  # memory writes missing, acknowledged within the window
    #: how long before its kill the oldest missing write was acknowledged (seconds)
    oldest_loss_s: float = 0.0
    conflicts: int = 0  # flush conflicts the restarts met (none expected: one writer)
    #: keys the central DB held ahead of the restarted cache by a write never acknowledged
    central_ahead: int = 0
    previous_local: dict[StateKey, tuple[int, int]] = field(default_factory=dict)
    previous_central: dict[StateKey, tuple[int, int]] = field(default_factory=dict)

    async def check(self, run: Run, where: str) -> None:
        o = run.options
        keys = o.state_keys
        durable = o.durability != "memory"
        central_before = await central_state(o.central_url, keys)
        self._not_backwards(self.previous_central, central_before, f"central; {where}")
        store = await StateStore.open(
            central_url=o.central_url, cache_path=o.cache_path, triggerer_id=o.triggerer_id,
            flush_interval=60.0,
        )
        try:
            found = await local_state(store, keys)
            self._not_backwards(self.previous_local, found, f"local; {where}")
            missing: list[str] = []
            for k in keys:
                acked = run.acks.get(k, [])
                value, version = found.get(k, (0, 0))
                before = self.previous_local.get(k, (0, 0))[0]
                assert value <= (acked[-1].value if acked else before) + 1, (
                    f"{k}: {value} was never written; {where}")
                if durable:
                    self.acks_checked += len(acked)
                    if acked and (value < acked[-1].value or version < acked[-1].version):
                        self.lost += acked[-1].value - value
                        gone = [a for a in acked if a.value > value] or acked[-1:]
                        self.oldest_loss_s = max(self.oldest_loss_s, run.killed_at - gone[0].at)
                        missing.append(f"{k}: acknowledged {acked[-1]}, found v{version}={value}")
                    if acked and o.durability == "central":
                        c_value, c_version = central_before.get(k, (0, 0))
                        if c_value < acked[-1].value or c_version < acked[-1].version:
                            self.lost += acked[-1].value - c_value
                            missing.append(f"{k}: acknowledged centrally {acked[-1]}, the "
                                           f"central DB held v{c_version}={c_value}")
                else:
                    older = [a for a in acked if a.at <= run.killed_at - self.memory_bound]
                    self.acks_checked += len(older)
                    if older and value < older[-1].value:
                        self.lost += older[-1].value - value
                        missing.append(f"{k}: {older[-1]} acknowledged {self.memory_bound} s "
                                       f"before the kill, found {value}")
                    gone = [a for a in acked if a.value > value]
                    if gone:
                        self.lost_in_window += len(gone)
                        self.oldest_loss_s = max(self.oldest_loss_s, run.killed_at - gone[0].at)
            assert not missing or self.tolerate_loss, (
                f"lost acknowledged writes; {where}:\n" + "\n".join(missing))
            # the restart's flush settles everything: the central DB then agrees with the file
            report = await store.flush()
            self.conflicts += report.conflicts
            assert store.stats().dirty_keys == 0, where
            found = await local_state(store, keys)
        finally:
            await store.close()
        central_after = await central_state(o.central_url, keys)
        differ: list[str] = []
        for k in sorted(set(central_after) | set(found)):
            c_state, l_state = central_after.get(k, (0, 0)), found.get(k, (0, 0))
            if c_state == l_state:
                continue
            acked = run.acks.get(k, [])
            if c_state > l_state and (self.tolerate_loss or not acked
                                      or c_state[0] > acked[-1].value):
                # A flush takes a version before its local commit is durable (by design, see
                # SyncWorker.flush); a power loss can then drop it locally. The central DB is
                # ahead by a write never acknowledged (or, where a loss is tolerated, by one
                # the cache lost), which the key's next write replaces.
                self.central_ahead += 1
                continue
            differ.append(f"{k}: central {c_state}, cache {l_state}")
        assert not differ, f"the central DB differs from the cache; {where}:\n" + "\n".join(
            differ[:20])
        self._not_backwards(central_before, central_after, f"restart flush; {where}")
        cache_integrity(o.cache_path)
        self.previous_local, self.previous_central = found, central_after

    @staticmethod
    def _not_backwards(before: dict[StateKey, tuple[int, int]],
                       after: dict[StateKey, tuple[int, int]], where: str) -> None:
        back = [f"{k}: v{v0}={x0} -> v{v1}={x1}"
                for k, (x0, v0) in before.items()
                for x1, v1 in [after.get(k, (0, 0))] if x1 < x0 or v1 < v0]
        assert not back, f"went backwards ({where}):\n" + "\n".join(back)
