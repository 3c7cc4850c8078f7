"""Failover race: two and three triggerer processes take turns owning the same owners.

Each process (failover_writer.py) has its own cache file; all share one central DB, on which
`central_history` records every write the DB took. On a randomized schedule the parent moves
owners between the processes (a release, then an own, sometimes racing each other), and pauses
a process with SIGSTOP mid-write: its owners move on, and when SIGCONT wakes it, it still
believes it owns them, writes on and flushes late, a zombie. Owners ``asset_watcher:*`` run
under the ``max`` policy, ``trigger:*`` under ``reject``. The checks, against the central DB's
own history:

* ``max``: no watermark ever moved backwards in the central DB, and at the end each holds the
  greatest value any process acknowledged (so no acknowledged watermark was lost);
* ``reject``: every conflict a process reported is real (its value never landed; the central
  record it lost to was another writer's), every refusal the history shows was reported (the
  last value a process wrote under an ownership landed or was reported as refused; a process
  whose own rows were interleaved by another writer's reported a conflict between them), and
  the `on_conflict` callbacks agree with `stats().conflicts`.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import signal
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import central_history
import pytest
from central_history import HistoryRow
from crash_harness import crash_seed
from fault_tally import FaultTally

from localstate._cache.entry import StateKey
from localstate._sync.flush.settle import ConflictInfo

WRITER = Path(__file__).parents[1] / "support" / "failover_writer.py"
MAX_OWNERS = [f"asset_watcher:fo-{i}" for i in range(4)]
REJECT_OWNERS = [f"trigger:fo-{i}" for i in range(4)]
POLICY = {"asset_watcher:*": "max", "*": "reject"}
STEPS = 18


def value_of(data: str | None) -> Any:
    """A value as the central DB and ConflictInfo carry it (JSON text), decoded."""
    return None if data is None else json.loads(data)


@dataclass
class Participant:
    """One writer process, and everything it reported."""

    name: str
    proc: asyncio.subprocess.Process
    acks: dict[StateKey, list[Any]] = field(default_factory=lambda: defaultdict(list))
    conflicts: list[ConflictInfo] = field(default_factory=list)
    released: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    closed: tuple[int, int] | None = None
    running: set[str] = field(default_factory=set)  # owners it has a write loop for
    paused: bool = False
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)

    async def send(self, **command: Any) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(command).encode() + b"\n")
        await self.proc.stdin.drain()

    async def read(self) -> None:
        assert self.proc.stdout is not None
        while line := await self.proc.stdout.readline():
            kind, *f = line.decode().rstrip("\n").split("\t")
            if kind == "ACK":
                self.acks[f[0], f[1]].append(json.loads(f[2]))
            elif kind == "CONFLICT":
                self.conflicts.append(ConflictInfo(**json.loads(f[0])))
            elif kind == "RELEASED":
                self.released[f[0]] += 1
            elif kind == "CLOSED":
                self.closed = (int(f[0]), int(f[1]))
            async with self.changed:
                self.changed.notify_all()

    async def wait_released(self, owner: str, count: int) -> None:
        async with self.changed:
            await asyncio.wait_for(
                self.changed.wait_for(lambda: self.released[owner] >= count), 60)

    async def own(self, owner: str, epoch: int) -> None:
        self.running.add(owner)
        await self.send(own=owner, epoch=epoch)

    async def release(self, owner: str, *, wait: bool) -> None:
        self.running.discard(owner)
        target = self.released[owner] + 1
        await self.send(release=owner)
        if wait:
            await self.wait_released(owner, target)


async def start(name: str, central_url: str, tmp: Path) -> tuple[Participant, asyncio.Task[None]]:
    options = {"central_url": central_url, "cache_path": str(tmp / f"{name}.db"),
               "triggerer_id": name, "conflict_policy": POLICY, "flush_interval": 0.1,
               "pace": 0.005}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(WRITER), json.dumps(options), stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE)
    assert proc.stdout is not None
    ready = await asyncio.wait_for(proc.stdout.readline(), 60)
    assert ready == b"READY\n", ready
    p = Participant(name, proc)
    return p, asyncio.create_task(p.read())


async def run_schedule(ps: list[Participant], rng: random.Random) -> dict[str, int]:
    """Move owners between the processes; pause and wake zombies. Returns what it did."""
    owner_of: dict[str, Participant] = {}
    epochs: dict[str, int] = defaultdict(int)
    done: dict[str, int] = defaultdict(int)

    async def give(owner: str, to: Participant) -> None:
        epochs[owner] += 1
        owner_of[owner] = to
        await to.own(owner, epochs[owner])

    for i, owner in enumerate(MAX_OWNERS + REJECT_OWNERS):
        await give(owner, ps[i % len(ps)])
    zombie: tuple[Participant, float] | None = None
    loop = asyncio.get_running_loop()
    for _ in range(STEPS):
        await asyncio.sleep(rng.uniform(0.05, 0.25))
        if zombie is not None and loop.time() >= zombie[1]:
            z = zombie[0]
            z.proc.send_signal(signal.SIGCONT)
            z.paused = False
            zombie = None
            await asyncio.sleep(rng.uniform(0.0, 0.2))  # it writes on, believing it owns
            for owner in sorted(z.running - {o for o, p in owner_of.items() if p is z}):
                await z.release(owner, wait=False)
            done["zombies woken"] += 1
        awake = [p for p in ps if not p.paused]
        if zombie is None and len(awake) >= 2 and rng.random() < 0.3:
            z = rng.choice(awake)
            z.proc.send_signal(signal.SIGSTOP)
            z.paused = True
            zombie = (z, loop.time() + rng.uniform(0.3, 1.0))
            others = [p for p in awake if p is not z]
            for owner in [o for o, p in owner_of.items() if p is z]:
                await give(owner, rng.choice(others))
            done["zombies paused"] += 1
            continue
        owner = rng.choice(sorted(owner_of))
        frm = owner_of[owner]
        candidates = [p for p in awake if p is not frm and owner not in p.running]
        if frm.paused or not candidates:
            continue
        # a graceful handover waits for the release; a racy one does not
        await frm.release(owner, wait=rng.random() < 0.5)
        await give(owner, rng.choice(candidates))
        done["handovers"] += 1
    if zombie is not None:  # it wakes at the end: its late flush comes with the quit
        zombie[0].proc.send_signal(signal.SIGCONT)
        zombie[0].paused = False
        done["zombies woken"] += 1
    return done


def check_max(history: list[HistoryRow], ps: list[Participant], where: str) -> None:
    rows = [r for r in history if r.owner in MAX_OWNERS]
    regressions = central_history.regressions(rows, values=True)
    assert not regressions, f"a watermark moved backwards; {where}:\n" + "\n".join(regressions)
    final = {k: r[-1].decoded for k, r in central_history.by_key(rows).items()}
    acked: dict[StateKey, int] = defaultdict(int)
    for p in ps:
        for k, values in p.acks.items():
            if k[0] in MAX_OWNERS:
                acked[k] = max(acked[k], *values)
    assert final == dict(acked), f"the central DB lost an acknowledged watermark; {where}"


def check_conflicts_real(history: list[HistoryRow], ps: list[Participant]) -> list[str]:
    """Each reported conflict is real: a refused value never landed, a winning one did, and
    the record it was settled against is another writer's."""
    keyed = central_history.by_key(history)
    problems: list[str] = []
    for p in ps:
        for c in p.conflicts:
            rows = keyed.get((c.owner, c.key), [])
            landed = [r.decoded for r in rows if r.updated_by == p.name]
            if (value_of(c.local_data) in landed) != (c.winner == "local"):
                problems.append(f"{p.name}: {c} but landed={value_of(c.local_data) in landed}")
            if c.winner == "central":
                other = [r for r in rows if r.version == c.central_version]
                if not other or other[-1].updated_by == p.name:
                    problems.append(f"{p.name}: {c} lost to {other}, not another writer's")
    return problems


def check_reject(history: list[HistoryRow], ps: list[Participant]) -> list[str]:
    """Every refusal the history shows under reject was reported by the refused process."""
    keyed = central_history.by_key([r for r in history if r.owner in REJECT_OWNERS])
    problems = central_history.regressions(
        [r for rows in keyed.values() for r in rows], values=False)
    for p in ps:
        reported: dict[StateKey, list[Any]] = defaultdict(list)
        for c in p.conflicts:
            if c.owner in REJECT_OWNERS:
                assert (c.policy, c.winner) == ("reject", "central"), c
                reported[c.owner, c.key].append(value_of(c.local_data))
        for k, values in p.acks.items():
            if k[0] not in REJECT_OWNERS:
                continue
            rows = keyed.get(k, [])
            landed = [r.decoded for r in rows if r.updated_by == p.name]
            # its last write (nothing later can absorb it) landed, or was reported refused
            if (values[-1] in landed) == (values[-1] in reported[k]):
                problems.append(f"{p.name} {k}: last write {values[-1]}: landed="
                                f"{values[-1] in landed}, reported={values[-1] in reported[k]}")
            # its own rows of one ownership interleaved by another writer's: its write in
            # between was refused (it had to adopt the other record to write on), and reported
            mine = [i for i, r in enumerate(rows) if r.updated_by == p.name]
            for a, b in itertools.pairwise(mine):
                first, second = rows[a].decoded, rows[b].decoded
                if b > a + 1 and first[0] == second[0] and not any(
                        first < v < second for v in reported[k]):
                    problems.append(f"{p.name} {k}: rows {first} and {second} were interleaved "
                                    f"by {[r.updated_by for r in rows[a + 1:b]]}; no conflict "
                                    "reported between them")
    return problems


@pytest.mark.parametrize("processes", [2, 3])
async def test_owners_moving_between_processes_and_zombies_lose_nothing(
    processes: int, central_url: str, tmp_path: Path, fault_tally: FaultTally,
) -> None:
    seed = crash_seed()
    rng = random.Random(seed)
    await central_history.install(central_url)
    started = await asyncio.gather(*(start(f"triggerer-{i}", central_url, tmp_path)
                                     for i in range(processes)))
    ps = [p for p, _reader in started]
    print(f"LOCALSTATE_CRASH_SEED={seed}")
    try:
        try:
            done = await run_schedule(ps, rng)
        except TimeoutError:
            for p in ps:  # each writer's tasks and threads to its stderr, then fail
                p.proc.send_signal(signal.SIGCONT)
                p.proc.send_signal(signal.SIGUSR1)
                p.proc.send_signal(signal.SIGUSR2)
            await asyncio.sleep(2)
            raise
        for p in ps:
            await p.send(quit=True)
        for p, reader in started:
            assert await asyncio.wait_for(p.proc.wait(), 60) == 0, f"{p.name} failed"
            await reader
    finally:
        for p in ps:
            if p.proc.returncode is None:
                p.proc.send_signal(signal.SIGCONT)
                p.proc.kill()
                await p.proc.wait()
    history = await central_history.read(central_url)
    where = f"seed {seed}, {done}"
    for p in ps:
        assert p.closed == (len(p.conflicts), 0), f"{p.name}: {p.closed}; {where}"
    check_max(history, ps, where)
    problems = check_conflicts_real(history, ps) + check_reject(history, ps)
    assert not problems, f"{where}:\n" + "\n".join(problems)
    conflicts = sum(len(p.conflicts) for p in ps)
    acks = sum(len(v) for p in ps for v in p.acks.values())
    fault_tally.add("conflicts reported", conflicts)
    fault_tally.add("acknowledged writes checked", acks)
    fault_tally.add("failover handovers", done["handovers"])
    fault_tally.add("zombies woken", done["zombies woken"])
    print(f"\nfailover race, {processes} processes ({where}): {acks} acknowledged, "
          f"{len(history)} central writes, {conflicts} conflicts reported")
