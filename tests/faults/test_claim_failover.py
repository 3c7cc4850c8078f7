"""Claim failover: three triggerer processes hand owners over, with SIGSTOP zombies.

Three processes (claim_writer.py: each a `StateStore` with its own cache file) share one
PostgreSQL, on which `central_history` records every write the DB took and every claim, in
one order. Over many seeded schedules (each on owners of its own, under ``reject``, ``max`` or
``last_writer_wins``), an owner is claimed by one process and handed over two or three times.
Each handover: the holder is sent a write and a flush and stopped (SIGSTOP) at a random moment,
possibly inside its flush's transaction; another process claims the owner; the holder is woken
(SIGCONT) and, a zombie now, writes and flushes on, larger values than anyone's (``max`` alone
would take them), interleaved with the new holder's own writes and flushes.

Checked:

* against the recorded history: after each claim of an owner, every write the central DB took
  of it is the claimant's (no zombie write accepted after a handover), and no watermark
  (``max``) or version went backwards;
* each zombie got `OwnerLost` (its flush saw its writes refused, and its next set raised);
* the new holder never met a conflict (its writes are never replaced), and at the end each
  key holds the last holder's last write.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import random
import signal
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import central_history
from crash_harness import crash_seed
from fault_tally import FaultTally

from localstate._testing.postgres_server import PostgresServer

WRITER = Path(__file__).parents[1] / "support" / "claim_writer.py"
POLICIES = ("reject", "max", "last_writer_wins")
#: each schedule's owner starts with its policy's name
POLICY = {f"{p}:*": p for p in POLICIES}
SCHEDULES = 210
KEYS = ("watermark", "cursor")
#: values a zombie writes: above every value a holder writes in these schedules
ZOMBIE_BASE = 10**6


class Triggerer:
    """One writer process and its pending answers."""

    def __init__(self, name: str, proc: asyncio.subprocess.Process) -> None:
        self.name = name
        self.proc = proc
        self.ids = itertools.count()
        self.pending: dict[int, asyncio.Future[str]] = {}

    async def read(self) -> None:
        assert self.proc.stdout is not None
        while line := await self.proc.stdout.readline():
            _done, n, answer = line.decode().rstrip("\n").split(" ", 2)
            self.pending.pop(int(n)).set_result(answer)

    def send(self, **command: Any) -> asyncio.Future[str]:
        assert self.proc.stdin is not None
        n = next(self.ids)
        fut: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self.pending[n] = fut
        self.proc.stdin.write(json.dumps({"id": n, **command}).encode() + b"\n")
        return fut

    async def call(self, **command: Any) -> str:
        return await asyncio.wait_for(self.send(**command), 60)


async def start(name: str, central_url: str, tmp: Path,
                **more: Any) -> tuple[Triggerer, asyncio.Task[None]]:
    """A claim_writer.py process; `more`: its further options (see its docstring)."""
    options = {"central_url": central_url, "cache_path": str(tmp / f"{name}.db"),
               "triggerer_id": name, "conflict_policy": POLICY, **more}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(WRITER), json.dumps(options), stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE)
    assert proc.stdout is not None
    ready = await asyncio.wait_for(proc.stdout.readline(), 60)
    assert ready == b"READY\n", ready
    t = Triggerer(name, proc)
    return t, asyncio.create_task(t.read())


class Schedule:
    """One owner handed over between the processes (see the module docstring)."""

    def __init__(self, n: int, ps: list[Triggerer], rng: random.Random,
                 done: dict[str, int]) -> None:
        self.policy = POLICIES[n % len(POLICIES)]
        self.owner = f"{self.policy}:s{n}"
        self.ps = ps
        self.rng = rng
        self.done = done
        self.counter = itertools.count(1)
        #: the last value the current holder wrote of each key
        self.last: dict[str, Any] = {}

    def value(self, holder: Triggerer, epoch: int, zombie: bool = False) -> Any:
        n = next(self.counter)
        if self.policy == "max":
            return ZOMBIE_BASE + n if zombie else n
        return [holder.name, epoch, n]

    async def write(self, p: Triggerer, key: str, value: Any) -> str:
        return await p.call(write=self.owner, key=key, value=value)

    async def hold(self, p: Triggerer, epoch: int, writes: int) -> None:
        """The current holder writes and flushes; its flushes meet no conflict."""
        for _ in range(writes):
            key = self.rng.choice(KEYS)
            value = self.value(p, epoch)
            answer = await self.write(p, key, value)
            assert answer.startswith("ok"), (self.owner, p.name, answer)
            self.last[key] = value
        lost, conflicts = map(int, (await p.call(flush=True)).split())
        assert (lost, conflicts) == (0, 0), (self.owner, p.name, lost, conflicts)

    async def zombie(self, z: Triggerer, epoch: int) -> None:
        """A woken zombie writes on; within two flushes it learns it lost the owner."""
        for _ in range(3):
            answer = await self.write(z, self.rng.choice(KEYS), self.value(z, epoch, True))
            if answer == "lost":
                self.done["zombie sets refused (OwnerLost)"] += 1
                return
            lost, _conflicts = map(int, (await z.call(flush=True)).split())
            self.done["zombie writes refused"] += lost
        raise AssertionError(f"{self.owner}: zombie {z.name} never got OwnerLost")

    async def run(self) -> None:
        rng = self.rng
        holder = rng.choice(self.ps)
        epoch = int(await holder.call(claim=self.owner))
        await self.hold(holder, epoch, rng.randint(1, 3))
        for _ in range(rng.choice((2, 3))):
            nxt = rng.choice([p for p in self.ps if p is not holder])
            # the holder, mid-write or mid-flush, stops
            in_flight = [holder.send(write=self.owner, key=key, value=self.value(holder, epoch))
                         for key in KEYS]
            in_flight.append(holder.send(flush=True))
            await asyncio.sleep(rng.uniform(0, 0.004))
            holder.proc.send_signal(signal.SIGSTOP)
            claimed = nxt.send(claim=self.owner)  # waits on a flush the holder left open
            await asyncio.sleep(rng.uniform(0, 0.01))
            holder.proc.send_signal(signal.SIGCONT)
            new_epoch = int(await asyncio.wait_for(claimed, 60))
            assert new_epoch > epoch
            for fut in in_flight:
                await asyncio.wait_for(fut, 60)  # before the claim, or refused: either way
            self.done["handovers"] += 1
            self.last.clear()  # what the new holder loads counts from here
            await asyncio.gather(self.zombie(holder, epoch),
                                 self.hold(nxt, new_epoch, rng.randint(1, 3)))
            holder, epoch = nxt, new_epoch
        await self.hold(holder, epoch, 2)
        self.holder = holder


def check_history(history: list[central_history.HistoryRow],
                  claims: list[central_history.ClaimEvent]) -> list[str]:
    """After each claim of an owner, every write of it is the claimant's."""
    events: dict[str, list[tuple[int, str, str]]] = defaultdict(list)
    for c in claims:
        events[c.owner].append((c.id, "claim", c.claimant))
    for r in history:
        events[r.owner].append((r.id, "write", r.updated_by))
    problems: list[str] = []
    for owner, seq in events.items():
        holder: str | None = None
        for id_, kind, who in sorted(seq):
            if kind == "claim":
                holder = who
            elif holder is not None and who != holder:
                problems.append(f"{owner}: history id {id_} written by {who} after {holder} "
                                "claimed it")
    return problems


async def test_zombies_never_replace_the_current_owners_writes(
    pg_server: PostgresServer, tmp_path: Path, fault_tally: FaultTally,
) -> None:
    seed = crash_seed()
    rng = random.Random(seed)
    url = pg_server.create_database(f"claims_{os.getpid()}_{seed}")
    await central_history.install(url)
    await central_history.install_claims(url)
    started = await asyncio.gather(*(start(f"triggerer-{i}", url, tmp_path) for i in range(3)))
    ps = [t for t, _reader in started]
    done: dict[str, int] = defaultdict(int)
    schedules: list[Schedule] = []
    try:
        for n in range(SCHEDULES):
            schedule = Schedule(n, ps, random.Random(rng.getrandbits(64)), done)
            await schedule.run()
            schedules.append(schedule)
        for t in ps:
            t.send(quit=True)
        for t, reader in started:
            assert await asyncio.wait_for(t.proc.wait(), 60) == 0, t.name
            await reader
    finally:
        for t in ps:
            if t.proc.returncode is None:
                t.proc.send_signal(signal.SIGCONT)
                t.proc.kill()
                await t.proc.wait()
    where = f"seed {seed}, {dict(done)}"
    history = await central_history.read(url)
    claims = await central_history.read_claims(url)
    problems = check_history(history, claims)
    assert not problems, f"{where}:\n" + "\n".join(problems[:20])
    max_rows = [r for r in history if r.owner.startswith("max:")]
    regressions = central_history.regressions(max_rows, values=True) + (
        central_history.regressions([r for r in history if r not in max_rows], values=False))
    assert not regressions, f"{where}:\n" + "\n".join(regressions[:20])
    final = {(r.owner, r.key): r.decoded for rows in central_history.by_key(history).values()
             for r in rows[-1:]}
    for s in schedules:
        for key, value in s.last.items():
            assert final[s.owner, key] == value, (where, s.owner, key, final[s.owner, key])
    assert len(claims) == SCHEDULES + done["handovers"]
    assert done["zombie writes refused"] > 0
    fault_tally.add("claim handovers run", done["handovers"])
    fault_tally.add("zombie writes refused", done["zombie writes refused"])
    fault_tally.add("zombie sets refused (OwnerLost)", done["zombie sets refused (OwnerLost)"])
    fault_tally.found("zombie writes accepted after a claim", len(problems))
    print(f"\nclaim failover ({where}): {len(history)} central writes, {len(claims)} claims")
