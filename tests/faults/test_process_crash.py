"""Process crashes: a real writer process (crash_writer.py) killed with SIGKILL mid-flight.

Each round starts a writer running a hot watermark loop over 200 keys of 50 owners, kills it at
a random moment, reopens its cache the way a restarted triggerer would, and checks every write
the killed process acknowledged (`crash_harness.CrashChecker`):

* ``local`` and ``central`` durability: an acknowledged value is never lost, whatever the kill
  interrupted (a group commit, a flush to the central DB, the mark-clean after one, the open
  itself), and it reaches the central DB (``central``: it was there before the restart);
* ``memory`` durability: only writes acknowledged within the last moments before the kill (the
  memory window plus a commit) may be lost;
* every mode: values and versions never go backwards (in the cache, and in the central DB's own
  history of every write it took), and the cache file always opens and passes
  ``PRAGMA integrity_check``;
* a cache's very first open, killed between any two of its SQL statements, leaves a file that
  opens.

Every round draws its moment and settings from one seed, printed on failure:
``LOCALSTATE_CRASH_SEED=<seed>`` replays a run.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import sqlite3
import sys
import time
from pathlib import Path

import central_history
import pytest
from crash_harness import CRASH_WRITER, CrashChecker, WriterOptions, WriterZygote, crash_seed
from fault_tally import FaultTally
from flush_before_commit_writer import OWNER as INFLIGHT_OWNER
from flush_before_commit_writer import killed_after_the_flush

from localstate import StateStore
from localstate._cache.cache_file import APPLICATION_ID, SCHEMA_VERSION
from localstate._cache.entry import Entry
from localstate._cache.local_cache import LocalCache
from localstate._sync.central.central_store import CentralStore

# rounds per durability mode and central backend: 2 x (10 + 10 + 5) = 50 kills per run
ROUNDS = {"local": 10, "central": 10, "memory": 5}


def round_settings(durability: str, rng: random.Random) -> tuple[float, dict[str, object]]:
    """How long the writer runs before the kill, and its settings, for one round."""
    if durability == "memory":
        # long enough that writes older than the loss bound exist to check; paced, since a
        # memory write never yields to the loop and real triggers await I/O between writes
        return rng.uniform(1.05, 1.3), {"flush_interval": rng.choice([0.1, 60.0]),
                                        "pace": 0.001}
    return rng.uniform(0.05, 0.6), {
        "flush_interval": rng.choice([0.01, 0.1, 60.0] if durability == "local"
                                     else [0.01, 0.1, 1.0]),
        "local_sync": rng.choice(["full", "normal"]),
    }


@pytest.mark.parametrize("durability", list(ROUNDS))
async def test_sigkill_at_random_moments_loses_nothing_the_mode_promises(
    durability: str, central_url: str, tmp_path: Path, fault_tally: FaultTally,
) -> None:
    seed = crash_seed()
    rng = random.Random(seed)
    await central_history.install(central_url)
    base = WriterOptions(central_url=central_url, cache_path=tmp_path / "crash-triggerer.db",
                         durability=durability)
    checker = CrashChecker()
    acks = 0
    async with WriterZygote() as zygote:
        for round_no in range(1, ROUNDS[durability] + 1):
            run_for, settings = round_settings(durability, rng)
            options = base.replace(**settings)
            where = f"round {round_no} of seed {seed} ({run_for=:.3f}, {settings})"
            run = await zygote.run_and_kill(options, run_for)
            acks += run.count
            try:
                await checker.check(run, where)
            finally:
                fault_tally.add("rounds killed")
    history = central_history.read(central_url)
    regressions = central_history.regressions(await history, values=True)
    assert not regressions, f"seed {seed}:\n" + "\n".join(regressions)
    # the writer really wrote: every key, many times over
    assert set(checker.previous_local) == set(base.state_keys), f"seed {seed}"
    assert checker.acks_checked >= 5 * len(base.state_keys), f"seed {seed}"
    assert checker.conflicts == 0, f"seed {seed}: one writer met a conflict"
    fault_tally.add("acknowledged writes checked", checker.acks_checked)
    if durability == "memory":
        fault_tally.lost("memory, beyond its window", checker.lost)
        fault_tally.add("memory writes lost within the window", checker.lost_in_window)
    else:
        fault_tally.lost(durability, checker.lost)
    print(f"\n{durability} crash rounds (seed {seed}): {ROUNDS[durability]} kills, {acks} "
          f"acknowledged, {checker.acks_checked} checked, lost={checker.lost}"
          + (f", {checker.lost_in_window} lost within the window (the oldest acknowledged "
             f"{checker.oldest_loss_s * 1000:.0f} ms before its kill)"
             if durability == "memory" else ""))


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


@pytest.mark.parametrize("marked", [False, True], ids=["dirty", "clean"])
async def test_a_write_flushed_before_its_local_commit_is_taken_at_the_next_open(
        central_url: str, tmp_path: Path, marked: bool) -> None:
    """A flush carries ``k`` = 2 to the central DB before the local commit of that write, and
    the process is SIGKILLed in between (`flush_before_commit_writer`): the file holds the
    acknowledged 1, dirty or (``clean``) with its earlier flush's mark-clean committed. The
    next store on the file takes the central 2 at its first flush: the store and the central
    DB agree. Before the file's ``closed`` mark, a clean row stayed at 1 for good while the
    central DB held 2."""
    cache = str(tmp_path / "cache.db")
    killed_after_the_flush(central_url, cache, marked=marked)
    with contextlib.closing(sqlite3.connect(cache)) as conn:
        assert conn.execute("SELECT value, version, synced_version FROM state WHERE key = 'k'"
                            ).fetchone() == ("1", 1, 1 if marked else 0)
        assert conn.execute("SELECT count(*) FROM meta WHERE name = 'closed'").fetchone() == (0,)
    store = await StateStore.open(central_url=central_url, cache_path=cache,
                                  triggerer_id="triggerer-old", flush_interval=3600.0)
    try:
        assert await store.get(INFLIGHT_OWNER, "k") == 1  # the file's, until the first flush
        report = await store.flush()
        assert (report.refreshed, report.conflicts) == (1 if marked else 0, 0)
        assert await store.get(INFLIGHT_OWNER, "k") == 2
    finally:
        await store.close()
    async with CentralStore.open(central_url) as central:
        assert (await central.read_many([(INFLIGHT_OWNER, "k")]))[
            (INFLIGHT_OWNER, "k")].data == "2"
    with contextlib.closing(sqlite3.connect(cache)) as conn:  # closed cleanly this time
        assert conn.execute("SELECT count(*) FROM meta WHERE name = 'closed'").fetchone() == (1,)
        assert conn.execute("SELECT value, version, synced_version FROM state WHERE key = 'k'"
                            ).fetchone() == ("2", 2, 2)
