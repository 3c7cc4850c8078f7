"""Crash tests: a real writer process (tests/crash_writer.py) killed with SIGKILL mid-flight.

After every kill the cache is reopened the way a restarted triggerer would reopen it, and every
write the killed process acknowledged must be there:

* ``local`` durability: an acknowledged value is never lost, whatever the kill interrupted (a
  group commit, a flush to the central DB, the mark-clean after one, the open itself);
* ``memory`` durability: only writes acknowledged within the last moments before the kill
  (the memory window plus a commit) may be lost;
* a cache's very first open, killed between any two of its SQL statements, leaves a file that
  opens.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import sqlite3
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from localstate import StateStore
from localstate.codec import decode
from localstate.entry import Entry, StateKey
from localstate.local_cache import APPLICATION_ID, SCHEMA_VERSION, LocalCache
from sync.central_store import CentralStore

CRASH_WRITER = Path(__file__).with_name("crash_writer.py")
OWNER_PREFIX = "asset_watcher:crash-"
OWNERS, KEYS, WRITERS = 50, 4, 25
ALL_KEYS: list[StateKey] = [
    (f"{OWNER_PREFIX}{o:02d}", f"k{k}") for o in range(OWNERS) for k in range(KEYS)
]
TRIGGERER_ID = "crash-triggerer"
ROUNDS = 20
# `memory` writes may be lost only if acknowledged this close to the kill. The promise is the
# memory window (0.05 s) plus one commit; 1 s leaves room for a slow disk or a busy machine.
MEMORY_LOSS_BOUND = 1.0


@dataclass(frozen=True)
class Ack:
    value: int
    version: int
    at: float  # time.monotonic() in the writer (the clock is system-wide)


@dataclass
class Run:
    acks: dict[StateKey, list[Ack]]
    killed_at: float
    stderr: str

    @property
    def count(self) -> int:
        return sum(len(a) for a in self.acks.values())


def crash_seed() -> int:
    fixed = os.environ.get("LOCALSTATE_CRASH_SEED")
    return int(fixed) if fixed else random.SystemRandom().randrange(2**32)


async def run_and_kill(
    *, central_url: str, cache_path: Path, run_for: float, durability: str = "local",
    flush_interval: float = 0.1, local_sync: str = "full", pace: float = 0.0,
) -> Run:
    """Start the writer, let it write for `run_for` seconds after READY, then SIGKILL it."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(CRASH_WRITER), "store",
        "--central-url", central_url, "--cache-path", str(cache_path),
        "--triggerer-id", TRIGGERER_ID, "--durability", durability,
        "--flush-interval", repr(flush_interval), "--local-sync", local_sync,
        "--owners", str(OWNERS), "--keys", str(KEYS), "--writers", str(WRITERS),
        "--pace", repr(pace),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None
    assert proc.stderr is not None
    stdout, stderr_stream = proc.stdout, proc.stderr
    stderr_task = asyncio.create_task(stderr_stream.read())
    acks: dict[StateKey, list[Ack]] = {}

    async def read_acks() -> None:
        while line := await stdout.readline():
            # one os.write per line: a line is never cut by the kill
            assert line.endswith(b"\n"), line
            owner, key, value, version, at = line.decode().split()
            acks.setdefault((owner, key), []).append(Ack(int(value), int(version), float(at)))

    try:
        ready = await asyncio.wait_for(stdout.readline(), 60)
        if not ready.startswith(b"READY "):
            proc.kill()
            await proc.wait()
            pytest.fail(f"the writer did not start: {ready!r}\n{(await stderr_task).decode()}")
        reader = asyncio.create_task(read_acks())
        await asyncio.sleep(run_for)
        killed_at = time.monotonic()
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
        await reader  # the lines still in the pipe: written, so acknowledged, before the kill
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    stderr = (await stderr_task).decode()
    assert proc.returncode == -signal.SIGKILL, f"the writer died on its own:\n{stderr}"
    return Run(acks, killed_at, stderr)


async def reopen(central_url: str, cache_path: Path) -> StateStore:
    """Open the killed writer's cache as its restart would (same id, same files)."""
    return await StateStore.open(
        central_url=central_url, cache_path=cache_path, triggerer_id=TRIGGERER_ID,
        flush_interval=60.0,
    )


async def read_state(store: StateStore) -> dict[StateKey, tuple[int, int]]:
    """(value, version) of every key the store holds."""
    state: dict[StateKey, tuple[int, int]] = {}
    for owner, key in ALL_KEYS:
        record = await store.record(owner, key)
        if record is not None:
            state[owner, key] = (int(record.value), record.version)
    return state


async def test_sigkill_never_loses_an_acknowledged_local_write(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    seed = crash_seed()
    rng = random.Random(seed)
    central_url = f"sqlite:///{tmp_path / 'central.db'}"
    cache_path = tmp_path / "cache" / f"{TRIGGERER_ID}.db"
    previous: dict[StateKey, tuple[int, int]] = {}
    acks_checked = conflicts = 0
    for round_no in range(1, ROUNDS + 1):
        run_for = round(rng.uniform(0.05, 0.6), 3)
        flush_interval = rng.choice([0.01, 0.1, 60.0])
        local_sync = rng.choice(["full", "normal"])
        where = (
            f"round {round_no} of seed {seed} (run_for={run_for}, "
            f"flush_interval={flush_interval}, local_sync={local_sync})"
        )
        run = await run_and_kill(
            central_url=central_url, cache_path=cache_path, run_for=run_for,
            flush_interval=flush_interval, local_sync=local_sync,
        )
        # the file always opens, and holds every acknowledged write
        store = await reopen(central_url, cache_path)
        try:
            state = await read_state(store)
            for k in ALL_KEYS:
                value, version = state.get(k, (0, 0))
                before_value, before_version = previous.get(k, (0, 0))
                acked = run.acks.get(k)
                last_value, last_version = (
                    (acked[-1].value, acked[-1].version) if acked else (before_value, 0)
                )
                assert value >= last_value, (
                    f"{k}: acknowledged {last_value}, found {value}; {where}"
                )
                assert version >= last_version, (
                    f"{k}: acknowledged v{last_version}, found v{version}; {where}"
                )
                # never backwards across rounds; never a value nobody wrote (at most the one
                # write in flight, unacknowledged, when the kill came)
                assert value >= before_value, f"{k}: {before_value} -> {value}; {where}"
                assert version >= before_version, f"{k}: v{before_version} -> v{version}; {where}"
                assert value <= last_value + 1, f"{k}: {value} after ack {last_value}; {where}"
                acks_checked += len(acked or ())
            # the restart's flush settles everything: the central DB then agrees with the file
            report = await store.flush()
            conflicts += report.conflicts
            assert store.stats().dirty_keys == 0, where
            state = await read_state(store)
            central = await CentralStore.open(central_url)
            try:
                rows = await central.read_many(list(state))
            finally:
                await central.close()
            for k, (value, version) in state.items():
                row = rows.get(k)
                assert row is not None, f"{k} missing centrally; {where}"
                assert row.data is not None
                assert (decode(row.data), row.version) == (value, version), f"{k}; {where}"
        finally:
            await store.close()
        previous = state
    # the writer really wrote: every key, many times over
    assert set(previous) == set(ALL_KEYS), f"seed {seed}"
    assert acks_checked >= 5 * len(ALL_KEYS), f"seed {seed}"
    with capsys.disabled():
        print(
            f"\ncrash test: {ROUNDS} rounds (seed {seed}), {acks_checked} acknowledged local "
            f"writes checked, lost=0, {conflicts} flush conflicts settled after restarts"
        )


async def test_sigkill_loses_only_the_last_moments_of_memory_writes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    central_url = f"sqlite:///{tmp_path / 'central.db'}"
    cache_path = tmp_path / f"{TRIGGERER_ID}.db"
    run_for = MEMORY_LOSS_BOUND + 1.5  # so that most acknowledgements predate the bound
    run = await run_and_kill(
        central_url=central_url, cache_path=cache_path, run_for=run_for, durability="memory",
        flush_interval=60.0, pace=0.001,
    )
    store = await reopen(central_url, cache_path)
    try:
        state = await read_state(store)
    finally:
        await store.close()
    lost = 0
    for k in ALL_KEYS:
        acked = run.acks.get(k, [])
        older = [a.value for a in acked if a.at <= run.killed_at - MEMORY_LOSS_BOUND]
        assert older, f"{k} had no write acknowledged {MEMORY_LOSS_BOUND} s before the kill"
        value = state.get(k, (0, 0))[0]
        assert value >= max(older), (
            f"{k}: {max(older)} was acknowledged over {MEMORY_LOSS_BOUND} s before the kill, "
            f"found {value}"
        )
        assert value <= acked[-1].value + 1
        lost += max(0, acked[-1].value - value)
    with capsys.disabled():
        print(
            f"\ncrash test (memory): {run.count} acknowledged writes, {lost} lost, all within "
            f"{MEMORY_LOSS_BOUND} s of the kill"
        )


async def test_first_open_killed_at_any_statement_leaves_a_cache_that_opens(
    tmp_path: Path,
) -> None:
    max_statements = 40
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(CRASH_WRITER), "first-open", "--folder", str(tmp_path),
        "--max-statements", str(max_statements),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0, err.decode()
    outcomes = dict(line.split() for line in out.decode().splitlines())
    assert list(outcomes) == [str(n) for n in range(1, max_statements + 1)], out
    killed = [int(n) for n, o in outcomes.items() if o == "killed"]
    finished = [int(n) for n, o in outcomes.items() if o == "finished"]
    assert sorted(killed + finished) == list(range(1, max_statements + 1)), (out, err)
    # every statement of open, commit and close was a crash point; the last runs got through
    assert killed == list(range(1, len(killed) + 1))
    assert len(killed) >= 12, out
    assert finished, "max_statements is too small to get past every crash point"
    for n in range(1, max_statements + 1):
        path = tmp_path / f"cache-{n}.db"
        cache = await LocalCache.open(path, owner_id="after-crash")
        try:
            loaded = await cache.load()
            if n in finished:
                assert set(loaded) == {("owner", "key")}, n
            else:
                assert set(loaded) <= {("owner", "key")}, n
            await cache.commit(("owner", "next"), Entry("2", 2, 1, time.time(), "x", 0))
        finally:
            await cache.close()
        with contextlib.closing(sqlite3.connect(path)) as conn:
            assert conn.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID, n
            assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION, n
            assert conn.execute("SELECT value FROM state WHERE key = 'next'").fetchone() == (
                "2",
            ), n
