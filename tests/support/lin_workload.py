"""The workload of the linearizability scenarios (#18): clients, surfaces, and the verdict.

N clients (asyncio tasks) run random reads, compare-and-sets (on the version they last read),
plain writes and deletes over three keys of one owner, through a `Surface`: one or more
`StateStore`s (`StoreSurface`) or the REST API of `localstate serve` processes
(`RestSurface`). Every operation is recorded in a `History` with its outcome: ok, fail
(refused: `VersionConflict`, `WriteRejected`, a 409; or refused as bad input) or info (unknown:
`CentralUnavailable`, `CentralError`, a 503, a cut connection, a timeout). `verify` runs the
checker and reports into the fault tally.

Reads through a store: a store is local-first, so its `get` of a key another store wrote is
stale until its next load (documented). What the scenarios check through a store is that its
writes are linearizable, with reads of the committed record: `committed_read` is the one place
that says how a store surface reads: ``LOCALSTATE_LIN_STORE_READ=committed`` (the default)
reads through the store's `StateStore.read_committed` (the central DB's record, linearizable);
``central`` reads the central DB through the test's own `CentralStore`; ``store`` reads the
store's own view (`StateStore.record`: its memory, its pending writes included, not
linearizable across stores by design).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import httpx
from fault_tally import FaultTally
from linearizability import ABSENT, CheckResult, Counters, History, check, counters

from localstate import StateStore
from localstate._core.codec import decode
from localstate._sync.central.central_store import CentralStore
from localstate.client import AsyncStateClient
from localstate.errors import (
    CentralError,
    InvalidInput,
    StoreClosed,
    VersionConflict,
    WriteRejected,
)

__all__ = [
    "KEYS",
    "OWNER",
    "RestSurface",
    "ServeProcess",
    "StoreSurface",
    "Verdict",
    "committed_read",
    "run_workload",
    "seconds",
    "verify",
]

OWNER = "dag:lincheck"
KEYS = ("k0", "k1", "k2")
CLIENTS = 8
#: the share of steps in which a client also churns (`Surface.churn`: a store loads the owner)
CHURN = 0.03
#: after an unknown outcome (the DB is down) a client waits this long before its next call
BACKOFF = 0.05


def seconds(name: str, default: float) -> float:
    """A duration from the environment (``LOCALSTATE_LIN_SECONDS`` and friends)."""
    return float(os.environ.get(name, default))


class Surface(Protocol):
    """One way of reaching the state: each call is one operation of the model."""

    async def read(self, client: int, key: str) -> tuple[Any, int]: ...
    async def write(self, client: int, key: str, value: Any) -> int: ...
    async def cas(self, client: int, key: str, value: Any, expected: int) -> int: ...
    async def delete(self, client: int, key: str) -> bool: ...
    async def churn(self, client: int) -> None:
        """Something a real user does now and then that is no operation of the model."""


STORE_READ = os.environ.get("LOCALSTATE_LIN_STORE_READ", "committed")


async def committed_read(store: StateStore, central: CentralStore, key: str
                         ) -> tuple[Any, int]:
    """A read through a store surface, as (value, version); (ABSENT, 0) when it has none."""
    if STORE_READ in ("store", "committed"):
        record = await (store.record(OWNER, key) if STORE_READ == "store"
                        else store.read_committed(OWNER, key))
        return (ABSENT, 0) if record is None else (record.value, record.version)
    row = (await central.read_many([(OWNER, key)])).get((OWNER, key))
    if row is None or row.data is None:
        return ABSENT, 0
    return decode(row.data), row.version


@dataclass
class StoreSurface:
    """Client `c` writes through ``stores[c % len(stores)]`` with ``central`` durability."""

    stores: Sequence[StateStore]
    reader: CentralStore

    def _store(self, client: int) -> StateStore:
        return self.stores[client % len(self.stores)]

    async def read(self, client: int, key: str) -> tuple[Any, int]:
        return await committed_read(self._store(client), self.reader, key)

    async def write(self, client: int, key: str, value: Any) -> int:
        return await self._store(client).set(OWNER, key, value, durability="central")

    async def cas(self, client: int, key: str, value: Any, expected: int) -> int:
        return await self._store(client).compare_and_set(
            OWNER, key, value, expected_version=expected, durability="central")

    async def delete(self, client: int, key: str) -> bool:
        return await self._store(client).delete(OWNER, key, durability="central")

    async def churn(self, client: int) -> None:
        # a trigger moving here: the store refreshes the owner from the central DB
        await self._store(client).load(OWNER)


@dataclass
class RestSurface:
    """Each call goes to one of the servers, picked at random."""

    clients: Sequence[AsyncStateClient]
    rng: random.Random = field(default_factory=lambda: random.Random(18))

    def _client(self) -> AsyncStateClient:
        return self.rng.choice(self.clients)

    async def read(self, client: int, key: str) -> tuple[Any, int]:
        record = await self._client().record(OWNER, key)
        return (ABSENT, 0) if record is None else (record.value, record.version)

    async def write(self, client: int, key: str, value: Any) -> int:
        return (await self._client().set(OWNER, key, value)).version

    async def cas(self, client: int, key: str, value: Any, expected: int) -> int:
        return (await self._client().set(OWNER, key, value, expected_version=expected)).version

    async def delete(self, client: int, key: str) -> bool:
        return await self._client().delete(OWNER, key)

    async def churn(self, client: int) -> None:
        return None


async def _client_loop(history: History, surface: Surface, client: int, until: list[float],
                       seed: int) -> None:
    rng = random.Random(seed * 1000 + client)
    last: dict[str, int] = {}  # the version this client last read or wrote, per key
    n = 0
    while time.monotonic() < until[0]:
        if rng.random() < CHURN:
            with contextlib.suppress(CentralError):
                await surface.churn(client)
        key = rng.choice(KEYS)
        n += 1
        value = f"c{client}-{n}"
        r = rng.random()
        if r < 0.4:
            op = history.invoke(client, key, "read")
        elif r < 0.75:
            op = history.invoke(client, key, "cas", value, last.get(key, 0))
        elif r < 0.9:
            op = history.invoke(client, key, "write", value)
        else:
            op = history.invoke(client, key, "delete")
        try:
            if op.kind == "read":
                got, version = await surface.read(client, key)
                history.ok(op, value=got, version=version)
                last[key] = version
            elif op.kind == "cas":
                assert op.expected is not None
                version = await surface.cas(client, key, value, op.expected)
                history.ok(op, version=version)
                last[key] = version
            elif op.kind == "write":
                version = await surface.write(client, key, value)
                history.ok(op, version=version)
                last[key] = version
            else:
                history.ok(op, deleted=await surface.delete(client, key))
                last[key] = 0
        except (VersionConflict, WriteRejected) as exc:
            # (the version a conflict names is not taken as the next expected one: clients
            # only compare-and-set on versions they read or wrote, see `linearizability`)
            history.fail(op, type(exc).__name__)
        except (InvalidInput, StoreClosed) as exc:  # refused, nothing written
            history.fail(op, f"{type(exc).__name__}: {exc}", conflict=False)
        except (CentralError, httpx.HTTPError, TimeoutError, OSError) as exc:
            history.info(op, type(exc).__name__)  # may take effect later, or never
            await asyncio.sleep(BACKOFF)


async def run_workload(surface: Surface, duration: float, *, clients: int = CLIENTS,
                       seed: int = 18,
                       during: Callable[[], Awaitable[object]] | None = None,
                       until_during_ends: bool = False) -> History:
    """`clients` clients on `surface` for `duration` s; `during()` runs meanwhile (a fault).
    `until_during_ends`: the clients stop when `during()` returns (`duration` is then a cap)."""
    history = History()
    until = [time.monotonic() + duration]  # a list: ended early by `during`'s end
    tasks: list[asyncio.Task[object]] = [
        asyncio.create_task(_client_loop(history, surface, c, until, seed))
        for c in range(clients)]
    if during is not None:
        fault: asyncio.Task[object] = asyncio.create_task(during())  # type: ignore[arg-type]
        if until_during_ends:
            fault.add_done_callback(lambda _task: until.__setitem__(0, 0.0))
        tasks.append(fault)
    try:
        await asyncio.gather(*tasks)
    finally:
        for t in tasks:
            t.cancel()
    return history


@dataclass
class Verdict:
    result: CheckResult
    counts: Counters
    history: History

    @property
    def clean(self) -> bool:
        c = self.counts
        return (self.result.violations, c.lost_updates, c.version_regressions,
                c.stale_reads) == (0, 0, 0, 0)

    def summary(self, label: str) -> str:
        c = self.counts
        statuses = ", ".join(f"{k} {v}" for k, v in sorted(self.history.by_status().items()))
        return (f"{label}: {len(self.history.ops)} ops ({statuses}); "
                f"linearizability violations {self.result.violations} of "
                f"{len(self.result.keys)} keys, lost updates {c.lost_updates}, version "
                f"regressions {c.version_regressions}, stale reads {c.stale_reads}")

    def details(self) -> str:
        lines = [self.result.report(), *self.counts.examples]
        if self.result.violations:
            # a diagnosis: are the refused compare-and-sets what cannot be explained?
            without = check(self.history, refusals=False)
            lines.append(f"with the refusals (refused compare-and-sets, deletes that found "
                         f"nothing) left out: {without.violations} keys not linearizable" + (
                             " (so the violations are refusals made on a state the record "
                             "was not committed at)" if not without.violations else
                             ":\n" + without.report()))
        return "\n".join(lines)


def verify(history: History, fault_tally: FaultTally, label: str) -> Verdict:
    """Check `history`; report it into the fault summary and print a line on it."""
    verdict = Verdict(check(history), counters(history), history)
    c = verdict.counts
    fault_tally.add("linearizability: operations checked", verdict.result.ops)
    fault_tally.found("lost updates", c.lost_updates)
    fault_tally.found("version regressions", c.version_regressions)
    fault_tally.found("stale reads", c.stale_reads)
    fault_tally.found("linearizability violations", verdict.result.violations)
    print("\n" + verdict.summary(label))
    return verdict


# -- `localstate serve` in a process of its own ----------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class ServeProcess:
    """`localstate serve` on a loopback port (the tree's own code: PYTHONPATH is kept)."""

    def __init__(self, central_url: str, store_id: str, folder: Path, tokens: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "AIRFLOW__LOCALSTATE__API_TOKENS": tokens,
               "AIRFLOW__LOCALSTATE__CACHE_DIR": str(folder)}
        self.log = folder / f"{store_id}.log"
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "localstate.cli", "serve", "--port", str(self.port),
                 "--central-url", central_url, "--store-id", store_id, "--log-level",
                 "warning"], env=env, stdout=log, stderr=subprocess.STDOUT)

    async def started(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        async with httpx.AsyncClient() as client:
            while True:
                assert self.proc.poll() is None, self.log.read_text()
                try:
                    if (await client.get(f"{self.url}/api/v1/health")).status_code == 200:
                        return
                except httpx.TransportError:
                    pass
                assert time.monotonic() < deadline, f"serve did not start: {self.log.read_text()}"
                await asyncio.sleep(0.1)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
