"""A triggerer frozen inside its flush transaction stalls neither a takeover nor its peers.

Two writer processes (claim_writer.py: each a `StateStore` with its own cache file) share one
central DB, PostgreSQL or MariaDB, with ``central_transaction_timeout`` = `BOUND`:

* the *zombie* claims `MOVED` owners, writes and flushes them, writes them again, then stops
  itself (SIGSTOP) inside its next flush, just before COMMIT: its rows written and locked, the
  owners' claim rows share-locked, as a process frozen by a GC pause, a paused VM or a frozen
  container is;
* the *survivor* flushes `OWN` owners of its own every `FLUSH_INTERVAL` (a background task
  sets them every 0.1 s) and, once the zombie is frozen, claims all `MOVED` owners at once (a
  takeover of hundreds of triggers: a claim storm);
* after `STOP_S` (``LOCALSTATE_FROZEN_STOP_S``, 80 for the full run) the zombie is woken: its
  transaction was ended by the server meanwhile, its flush fails, and its next flushes are
  refused for the claims (`OwnerLost`).

Both with ``sink = sql`` (the writers talk to the central DB) and ``sink = api`` (through a
`localstate serve` over it, bounded the same way). Through the API the zombie holds no
transaction: it stops once its flush request's headers are sent and its body is not, and the
server, which reads a whole request before it opens a transaction, holds nothing for it.

Checked: every claim commits, none fails (no pool timeout, no lock timeout reaching the
caller), each within ``BOUND + 5 s`` of the freeze; the survivor's own owners are never more
than three flush intervals without a central write; no write of the zombie is central after
the takeover; every owner ends at its last acknowledged value. The fault summary reports the
longest claim wait and the longest central silence of the survivor, per sink.

A second schedule stops a writer (SIGSTOP) once the central DB has committed its flush and
before it reads the answer, and wakes it after its ``flush_timeout``: the flush is reported
committed, its rows are clean and nothing is written again.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import signal
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from api_server import RW_TOKEN, ServeProcess
from fault_tally import FaultTally
from test_claim_failover import Triggerer, start

from localstate._sync.central.central_store import CentralStore
from localstate._testing.mysql_server import MysqlServer
from localstate._testing.postgres_server import PostgresServer

BOUND = 2.0
MOVED = 300
OWN = 30
FLUSH_INTERVAL = 1.0
STOP_S = float(os.environ.get("LOCALSTATE_FROZEN_STOP_S", "12"))
#: flush_timeout of the writer stopped between its COMMIT and its timer's check
FLUSH_TIMEOUT = 2.0
#: how long that writer stays stopped (``LOCALSTATE_COMMITTED_STOP_S``; beyond ``central_timeout``,
#: 30 s, the API sink's HTTP timeouts expire during the stop too)
COMMITTED_STOP_S = float(os.environ.get("LOCALSTATE_COMMITTED_STOP_S", FLUSH_TIMEOUT + 1))


@pytest.fixture(params=["sql", "api"])
def sink(request: pytest.FixtureRequest) -> str:
    """How the writers reach the central DB: directly, or through a `localstate serve`."""
    return str(request.param)


@asynccontextmanager
async def central_for(sink: str, url: str, monkeypatch: pytest.MonkeyPatch
                      ) -> AsyncIterator[dict[str, Any]]:
    """The writers' options to reach the central DB `url` through `sink`: for ``api``, a
    `localstate serve` over it, its transactions bounded by `BOUND` too."""
    if sink == "sql":
        yield {}
        return
    monkeypatch.setenv("AIRFLOW__LOCALSTATE__CENTRAL_TRANSACTION_TIMEOUT", str(BOUND))
    server = ServeProcess(url, store_id="frozen-flush-server")
    await asyncio.to_thread(server.start)
    try:
        yield {"central_url": None, "sink": "api", "api_url": server.url,
               "api_token": RW_TOKEN}
    finally:
        await asyncio.to_thread(server.stop)


def fresh_database(db_server: PostgresServer | MysqlServer, prefix: str) -> str:
    if isinstance(db_server, MysqlServer):
        db_server.ensure_running()
    return db_server.create_database(
        f"{prefix}_{os.getpid()}_{int(time.time() * 1000) % 10**8}")


async def read_central(url: str, keys: list[tuple[str, str]]) -> dict[tuple[str, str], Any]:
    central = await CentralStore.open(url, upgrade_schema=False)
    try:
        return dict(await central.read_many(keys))
    finally:
        await central.close()


def stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0] == "T"


async def wait_until_stopped(t: Triggerer) -> None:
    for _ in range(600):
        if stopped(t.proc.pid):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{t.name} never stopped itself in its flush")


async def watch_ticks(url: str, owners: list[str], until: asyncio.Event,
                      changes: list[float], regressions: list[str]) -> None:
    """Note each moment the survivor's own owners' central values move on, and any value that
    went backwards."""
    central = await CentralStore.open(url, upgrade_schema=False)
    try:
        last: Any = None
        while not until.is_set():
            rows = await central.read_many([(o, "tick") for o in owners])
            now = tuple(int(rows[o, "tick"].data or 0) if (o, "tick") in rows else 0
                        for o in owners)
            if now != last:
                changes.append(time.monotonic())
                if last is not None:
                    regressions += [f"{o}: {a} -> {b}" for o, a, b in zip(
                        owners, last, now, strict=True) if b < a]
                last = now
            await asyncio.sleep(0.05)
    finally:
        await central.close()


async def test_a_writer_frozen_in_its_flush_stalls_no_takeover_and_no_peer(
    db_server: PostgresServer | MysqlServer, sink: str, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch, fault_tally: FaultTally,
) -> None:
    url = fresh_database(db_server, "frozen")
    async with central_for(sink, url, monkeypatch) as reach:
        await frozen_flush_schedule(db_server, sink, url, reach, tmp_path, fault_tally)


async def frozen_flush_schedule(db_server: PostgresServer | MysqlServer, sink: str, url: str,
                                reach: dict[str, Any], tmp_path: Path,
                                fault_tally: FaultTally) -> None:
    moved = [f"moved:{i:03d}" for i in range(MOVED)]
    own = [f"own:{i:02d}" for i in range(OWN)]
    options: dict[str, Any] = {"central_transaction_timeout": BOUND, **reach}
    writers_url = options.pop("central_url", url)
    zombie, zombie_reader = await start("zombie", writers_url, tmp_path, **options)
    record = tmp_path / "ticked"
    survivor, survivor_reader = await start(
        "survivor", writers_url, tmp_path, **options, tick_owners=own, tick_interval=0.1,
        tick_record=str(record), flush_interval=FLUSH_INTERVAL)
    procs = [zombie, survivor]
    try:
        first = json.loads(await zombie.call(claim_many=moved))
        assert all(isinstance(epoch, int) for _o, _s, epoch in first), first
        for value in (1, 2):
            answers = await asyncio.gather(*(
                zombie.send(write=o, key="watermark", value=value) for o in moved))
            assert all(a.startswith("ok") for a in answers), answers[:3]
            if value == 1:
                assert (await zombie.call(flush=True)).split()[0] == "0"
        done = asyncio.Event()
        changes: list[float] = []
        regressions: list[str] = []
        watcher = asyncio.create_task(watch_ticks(url, own, done, changes, regressions))
        frozen_flush = zombie.send(freeze_in_flush=True)
        await wait_until_stopped(zombie)
        handover = time.monotonic()
        # the takeover at once: every claim meets the frozen transaction's locks
        claims = json.loads(await asyncio.wait_for(survivor.send(claim_many=moved), 120))
        claimed = time.monotonic()
        failed = [c for c in claims if not isinstance(c[2], int)]
        assert not failed, f"{len(failed)} claims failed: {failed[:5]}"
        longest_claim = max(seconds for _o, seconds, _e in claims)
        # where the takeover's time goes: the wait for the frozen transaction's locks (the
        # first claim done), then the storm's claims one after another through the claim slots
        first_claim = min(seconds for _o, seconds, _e in claims)
        if sink == "sql":
            assert longest_claim >= BOUND / 2, "no claim met the frozen writer's locks"
        # through the API the frozen writer holds no lock: the server waits for its body
        # before it opens a transaction
        assert claimed - handover <= BOUND + 5, (
            f"{claimed - handover:.2f} s after the freeze; first claim done after "
            f"{first_claim:.2f} s, the last after {longest_claim:.2f} s")
        answers = await asyncio.gather(*(
            survivor.send(write=o, key="watermark", value=100) for o in moved))
        assert all(a.startswith("ok") for a in answers), answers[:3]
        assert (await survivor.call(flush=True)).split() == ["0", "0"]

        await asyncio.sleep(max(0.0, STOP_S - (time.monotonic() - handover)))
        done.set()
        await watcher
        silences = [b - a for a, b in itertools.pairwise(changes)]
        longest_silence = max(silences)
        assert len(changes) > STOP_S / FLUSH_INTERVAL / 2, changes
        assert longest_silence <= 3 * FLUSH_INTERVAL, (longest_silence, silences)
        assert not regressions, regressions[:5]

        zombie.proc.send_signal(signal.SIGCONT)
        outcome = await asyncio.wait_for(frozen_flush, 120)
        # the server ended the frozen transaction: the flush failed, or its rows were refused
        assert outcome.startswith("error") or outcome.split()[0] == str(MOVED), outcome
        after = await zombie.call(flush=True)
        zombie_lost = [await zombie.send(write=o, key="watermark", value=999) for o in moved]
        assert all(a == "lost" for a in zombie_lost), zombie_lost[:3]

        central = await CentralStore.open(url, upgrade_schema=False)
        try:
            rows = await central.read_many([(o, "watermark") for o in moved])
        finally:
            await central.close()
        zombie_writes = [k for k, r in rows.items() if json.loads(r.data or "null") != 100]
        assert not zombie_writes, (after, zombie_writes[:5])

        for t in procs:
            t.send(quit=True)
        for t, reader in ((zombie, zombie_reader), (survivor, survivor_reader)):
            assert await asyncio.wait_for(t.proc.wait(), 60) == 0, t.name
            await reader
        # the survivor's last acknowledged round is central for every one of its owners
        acknowledged = int(record.read_text())
        central = await CentralStore.open(url, upgrade_schema=False)
        try:
            ticks = await central.read_many([(o, "tick") for o in own])
        finally:
            await central.close()
        lost = [o for o in own if int(ticks[o, "tick"].data or 0) < acknowledged]
        assert not lost, (acknowledged, lost[:5])
    finally:
        for t in procs:
            if t.proc.returncode is None:
                t.proc.send_signal(signal.SIGCONT)
                t.proc.kill()
                await t.proc.wait()
    backend = "MariaDB" if isinstance(db_server, MysqlServer) else "PostgreSQL"
    via = f" (sink = {sink})"
    fault_tally.add(f"writers frozen inside a flush{via}")
    fault_tally.add(f"owners taken over from a frozen writer{via}", MOVED)
    fault_tally.found("claims failed behind a frozen writer", len(failed))
    fault_tally.found("zombie writes accepted after a claim", len(zombie_writes))
    fault_tally.found("survivor's central values gone backwards", len(regressions))
    fault_tally.lost("survivor's acknowledged writes (local) beside a frozen writer", len(lost))
    fault_tally.longest(f"survivor's longest claim wait behind a frozen writer{via}",
                        longest_claim)
    fault_tally.longest(f"survivor's longest central silence while a peer was frozen{via}",
                        longest_silence)
    print(f"\nfrozen flush ({backend}, sink = {sink}, bound {BOUND} s, stop {STOP_S} s): "
          f"{MOVED} claims "
          f"done {claimed - handover:.2f} s after the freeze (first {first_claim:.2f} s, "
          f"longest {longest_claim:.2f} s: the rest at "
          f"{(MOVED - 1) / max(longest_claim - first_claim, 1e-3):.0f} claims/s); "
          f"survivor's longest central silence {longest_silence:.2f} s; the woken writer's "
          f"frozen flush: {outcome!r}")


async def test_a_flush_committed_before_a_stop_is_reported_committed_whatever_its_timer_said(
    db_server: PostgresServer | MysqlServer, sink: str, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch, fault_tally: FaultTally,
) -> None:
    """A writer stopped (SIGSTOP) once the central DB committed its flush, before it read the
    answer, and woken after its ``flush_timeout`` passed: the flush is reported committed (no
    error, nothing lost, no conflict), its rows are clean, and nothing is written again."""
    url = fresh_database(db_server, "committed")
    owners = [f"moved:{i:02d}" for i in range(OWN)]
    keys = [(o, "watermark") for o in owners]
    async with central_for(sink, url, monkeypatch) as reach:
        writer, reader = await start("stopped", reach.pop("central_url", url), tmp_path,
                                     flush_timeout=FLUSH_TIMEOUT, **reach)
        try:
            claims = json.loads(await writer.call(claim_many=owners))
            assert all(isinstance(epoch, int) for _o, _s, epoch in claims), claims
            for value in (1, 2):
                answers = await asyncio.gather(*(
                    writer.send(write=o, key="watermark", value=value) for o in owners))
                assert all(a.startswith("ok") for a in answers), answers[:3]
                if value == 1:
                    assert (await writer.call(flush=True)).split() == ["0", "0"]
            flush = writer.send(freeze_after_commit=True)
            await wait_until_stopped(writer)
            stopped_at = time.monotonic()
            # stopped after the commit: the central DB holds the flush already
            committed = await read_central(url, keys)
            assert all(json.loads(committed[k].data or "null") == 2 for k in keys), committed
            await asyncio.sleep(max(0.0, COMMITTED_STOP_S - (time.monotonic() - stopped_at)))
            writer.proc.send_signal(signal.SIGCONT)
            outcome = await asyncio.wait_for(flush, 60)
            assert outcome == "0 0", outcome  # reported committed, not failed
            assert await writer.call(dirty=True) == "0 0"  # rows clean, no central error
            assert (await writer.call(flush=True)).split() == ["0", "0"]
            after = await read_central(url, keys)
            rewritten = [k for k in keys if after[k].version != committed[k].version]
            assert not rewritten, rewritten[:5]  # not sent again
            writer.send(quit=True)
            assert await asyncio.wait_for(writer.proc.wait(), 60) == 0
            await reader
        finally:
            if writer.proc.returncode is None:
                writer.proc.send_signal(signal.SIGCONT)
                writer.proc.kill()
                await writer.proc.wait()
    fault_tally.add("flushes stopped between their COMMIT and their timer's check")
    fault_tally.found("committed flushes reported failed after a stop", 0)
