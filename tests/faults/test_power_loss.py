"""Power loss: what survives when every write that was not fsynced is dropped.

A SIGKILL (`test_process_crash.py`) leaves every written page in the operating system's cache;
a power loss also drops whatever was not yet fsynced: data written since a file's last
``fsync``/``fdatasync``, and names (a created, renamed or unlinked file, a new folder) since the
last ``fsync`` of their folder. These tests check the cache against that.

**How: record once, replay many cut points** (the method of ALICE and CrashMonkey). The crash
harness's writer (`crash_writer.py` through `crash_harness.WriterZygote`) runs under an
``LD_PRELOAD`` shim (`powerloss_shim.c`, compiled with gcc into a temporary folder when the
test runs) that appends every mutating file operation under the cache's disk and the central
DB's folder to a log, with its data and its fsync boundaries, together with each
acknowledgement the writer prints, in the order they took effect. After the writer is killed,
`powerloss.Replay` plays the log forward and, at each chosen cut point, writes the *durable
image*: the cache's disk as a power loss at that moment leaves it (each file as of its last
fsync, each folder's names as of its last fsync; half of the points also keep a random part of
the unsynced writes, torn at 4 KiB pages, and a random prefix of each folder's unsynced name
changes), and the central SQLite DB with everything written up to the cut (a server that did
not lose power; the central DB is SQLite here, outside the lossy disk, because it must be
taken back to each cut point, which a PostgreSQL server cannot). `crash_harness.CrashChecker` then
opens a store on that image, as the restarted triggerer would, and checks every write
acknowledged before the cut. One recording serves a hundred points, so a point costs one
reopen, not one writer run.

Why a shim and not a FUSE file system (LazyFS): the shim needs no mount, no privilege, no
package beyond gcc, and no daemon to crash or hang; and because it records rather than
simulates, one run yields every cut point, including each fsync boundary, exactly. What it
cannot see, it need not: SQLite writes the ``-shm`` file through ``mmap``, and that file is
rebuilt from the WAL by the first connection after a restart, so its content never matters.
The lock file (`file_lock.py`) is never fsynced either, on purpose: its holder line only
informs, the ``flock`` excludes; the images have it missing, empty or torn, and every open takes
it over.

Cut points: every fsync boundary of the first open (just before and just after each fsync),
then boundaries drawn from each phase the log shows (group commits, checkpoints, the mark-clean
after a flush) and points drawn at random. Both ``local_sync`` settings, a fresh cache (whose
folder the writer creates) and an existing one. Every choice (points, torn pages) comes from
one seed, printed on failure: ``LOCALSTATE_CRASH_SEED=<seed>`` makes the same choices again
(the recording itself follows the machine's timing, so a point's index may name another
moment).
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from crash_harness import CrashChecker, Run, WriterOptions, WriterZygote, central_state, crash_seed
from fault_tally import FaultTally
from powerloss import (
    MARK,
    SYNC,
    CheckpointWatch,
    Record,
    Replay,
    Root,
    compile_shim,
    ends_whole,
    phases,
    read_log,
    remove,
    scratch,
    shim_env,
)

from localstate._cache.entry import StateKey
from localstate._core.codec import decode
from localstate.errors import CacheError

# checked per recording: every first-open boundary, up to PER_PHASE boundaries of each other
# phase, and RANDOM points; 2 recordings per local_sync: >= 2 x 2 x (10 + 3 x 12 + 25) points
PER_PHASE = 12
RANDOM = 25
RUN_FOR = 1.0  # s the writer writes at least before its kill (then on to a checkpoint)


@dataclass
class Recording:
    """One writer run under the shim, and the durable state it started from."""

    label: str
    options: WriterOptions
    roots: list[Path]  # [the cache's disk (lossy), the central DB's folder (kept)]
    base: list[Root]  # the roots as the recording found them
    records: list[Record]
    base_local: dict[StateKey, tuple[int, int]]
    base_central: dict[StateKey, tuple[int, int]]


@dataclass
class Tally:
    points: Counter[str] = field(default_factory=Counter)  # per phase
    refused: int = 0  # cache files refused with a typed error naming them (never wiped)
    lossy_points: int = 0  # points that lost acknowledged writes (normal only)
    worst: int = 0  # most acknowledged writes lost at one point (normal only)


def cache_rows(folder: Path, cache_name: str) -> dict[StateKey, tuple[int, int]]:
    """(value, version) of each live row of the cache file under `folder`, read from a copy."""
    if not (folder / cache_name).exists():
        return {}
    copy = scratch(folder.parent, "rows-")
    try:
        for f in folder.glob(cache_name + "*"):
            shutil.copy(f, copy / f.name)
        with contextlib.closing(sqlite3.connect(copy / cache_name)) as conn:
            rows = conn.execute("SELECT owner, key, value, version FROM state "
                                "WHERE value IS NOT NULL").fetchall()
        return {(o, k): (int(decode(v)), ver) for o, k, v, ver in rows}
    finally:
        remove(copy)


async def record(zygote: WriterZygote, options: WriterOptions, label: str, roots: list[Path],
                 log: Path) -> Recording:
    """Run the writer under the shim for RUN_FOR s, kill it, and keep its slice of the log."""
    disk, central = roots
    base = Replay.snapshot([disk], [central])
    again = Replay.snapshot([disk], [central])  # a replay mutates its roots: one to check with
    base_local = cache_rows(options.cache_path.parent, options.cache_path.name)
    copy = scratch(disk.parent, "central-")
    try:
        shutil.copytree(central, copy, dirs_exist_ok=True)
        base_central = await central_state(f"sqlite:///{copy / 'central.db'}",
                                           options.state_keys)
    finally:
        remove(copy)
    start = log_size(log)
    # on past RUN_FOR until a checkpoint: each recording then covers one, however slow the machine
    await zygote.run_and_kill(options, RUN_FOR,
                              until=CheckpointWatch(log, start, options.cache_path))
    records = read_log(log, start)
    if ends_whole(log, start):
        replay_matches_disk(Replay(again, records), roots)
    return Recording(label, options, roots, base, records, base_local, base_central)


def log_size(log: Path) -> int:
    return log.stat().st_size if log.exists() else 0


def replay_matches_disk(replay: Replay, roots: list[Path]) -> None:
    """The whole log replayed without loss gives the files on disk, byte for byte: the shim
    missed no operation. (Not the ``-shm`` files: SQLite writes them through mmap, and rebuilds
    them after a restart.)"""
    replay.advance(len(replay.records))
    image = scratch(roots[0].parent, "whole-")
    try:
        replay.materialize(image, lose=False)
        for root in roots:
            real = {p.relative_to(root): p.read_bytes() for p in root.rglob("*")
                    if p.is_file() and not p.name.endswith("-shm")}
            copy = image / root.name
            replayed = {p.relative_to(copy): p.read_bytes() for p in copy.rglob("*")
                        if p.is_file() and not p.name.endswith("-shm")}
            assert replayed.keys() == real.keys(), (sorted(map(str, replayed)),
                                                    sorted(map(str, real)))
            differ = [str(p) for p in real if real[p] != replayed[p]]
            assert not differ, f"the replay differs from the disk: {differ}"
    finally:
        remove(image)


def choose_cuts(rec: Recording, rng: random.Random) -> list[tuple[int, str, bool]]:
    """(cut, phase, torn) for every point to check, in log order."""
    disk = rec.roots[0]
    phase = phases(rec.records, disk, rec.options.cache_path)
    boundaries: dict[str, set[int]] = {}
    for i, r in enumerate(rec.records):
        if r.op == SYNC:
            for cut in (i, i + 1):
                boundaries.setdefault(phase[cut], set()).add(cut)
    chosen: dict[int, str] = {}
    for name, cuts in boundaries.items():
        picks = sorted(cuts) if name == "first open" else rng.sample(
            sorted(cuts), min(PER_PHASE, len(cuts)))
        chosen.update((c, name) for c in picks)
    for c in rng.sample(range(len(rec.records) + 1), min(RANDOM, len(rec.records) + 1)):
        chosen.setdefault(c, phase[c])
    return [(c, chosen[c], rng.random() < 0.5) for c in sorted(chosen)]


async def check_points(rec: Recording, checker: CrashChecker, rng: random.Random, seed: int,
                       tally: Tally, scratch_dir: Path) -> None:
    replay = Replay(rec.base, rec.records)
    disk, central = rec.roots
    cache_rel = rec.options.cache_path.relative_to(disk.parent)
    acked, marks_read = Run(rec.options), 0  # the acknowledgements before the cut
    for cut, phase, torn in choose_cuts(rec, rng):
        replay.advance(cut)
        where = (f"{rec.label}, cut {cut} of {len(rec.records)} ({phase}"
                 f"{', torn' if torn else ''}), seed {seed}")
        target = scratch(scratch_dir, "image-")
        try:
            replay.materialize(target, random.Random(rng.random()) if torn else None)
            while marks_read < len(replay.marks):
                line = replay.marks[marks_read][1]
                marks_read += 1
                if len(line.split()) == 5:  # not READY or EXIT
                    acked.add_ack_line(line)
            run = Run(rec.options.replace(cache_path=target / cache_rel,
                                          central_url=f"sqlite:///{target / central.name}"
                                                      f"/central.db"),
                      acks={k: list(a) for k, a in acked.acks.items()},
                      # the power fails after the last acknowledgement before the cut
                      killed_at=max((a[-1].at for a in acked.acks.values()), default=0.0))
            checker.previous_local = dict(rec.base_local)
            checker.previous_central = dict(rec.base_central)
            lost_before = checker.lost
            await check_or_refused(checker, run, where, tally)
            lost = checker.lost - lost_before
            tally.lossy_points += lost > 0
            tally.worst = max(tally.worst, lost)
            tally.points[phase] += 1
        finally:
            remove(target)


async def check_or_refused(checker: CrashChecker, run: Run, where: str, tally: Tally) -> None:
    """The checker's checks, or a typed refusal that names the cache file and leaves it as is."""
    path = run.options.cache_path
    files = {f: f.read_bytes() for f in path.parent.glob(path.name + "*")} if \
        path.parent.exists() else {}
    refusal: CacheError | None = None
    try:
        await checker.check(run, where)
    except CacheError as exc:
        refusal = exc
    if refusal is not None:
        assert str(path) in str(refusal), f"{where}: a refusal not naming the file: {refusal}"
        after = {f: f.read_bytes() for f in files if f.exists()}
        assert after == files, f"{where}: the refused cache file was changed"
        tally.refused += 1


@pytest.fixture
def disk_folder(tmp_path: Path) -> Iterator[Path]:
    """Where the recorded writer's files go: a tmpfs when there is one. Its fsyncs cost nothing,
    so the writer commits many times more often (what survives is the replay's business, not
    the real disk's), and the images the checks open are written to memory."""
    shm = Path("/dev/shm")
    if not (shm.is_dir() and os.access(shm, os.W_OK)):
        yield tmp_path
        return
    folder = Path(tempfile.mkdtemp(prefix="localstate-powerloss-", dir=shm))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def shim(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return compile_shim(tmp_path_factory.mktemp("powerloss-shim"))


@pytest.mark.parametrize("local_sync", ["full", "normal"])
async def test_power_loss_at_fsync_boundaries_and_random_points(
    local_sync: str, shim: Path, disk_folder: Path, fault_tally: FaultTally,
) -> None:
    seed = crash_seed()
    rng = random.Random(seed)
    tmp_path = disk_folder
    disk, central = tmp_path / "disk", tmp_path / "central-disk"
    disk.mkdir()
    central.mkdir()
    log = tmp_path / "powerloss.log"
    base = WriterOptions(central_url=f"sqlite:///{central / 'central.db'}",
                         cache_path=disk / "cache" / "crash-triggerer.db",
                         local_sync=local_sync, flush_interval=0.05)
    # full: a fresh cache in `local` durability, then the same cache reopened in `central`;
    # normal: `local` both times (what it loses is measured, not refused)
    second = "central" if local_sync == "full" else "local"
    checkers = {d: CrashChecker(tolerate_loss=local_sync == "normal") for d in ("local", second)}
    tally = Tally()
    async with WriterZygote(shim_env(shim, log, [disk, central])) as zygote:
        recordings = [await record(zygote, base, "fresh cache, local", [disk, central], log)]
        recordings.append(await record(zygote, base.replace(durability=second),
                                       f"existing cache, {second}", [disk, central], log))
    for rec in recordings:
        await check_points(rec, checkers[rec.options.durability], rng, seed, tally, tmp_path)
    points = sum(tally.points.values())
    c = list(checkers.values())
    summary = (f"\npower loss, local_sync={local_sync} (seed {seed}): {points} points "
               f"{dict(tally.points)}, {sum(x.acks_checked for x in c)} acknowledgements "
               f"checked, lost at {tally.lossy_points} points (at most {tally.worst} writes at "
               f"one, the oldest acknowledged {max(x.oldest_loss_s for x in c) * 1000:.0f} ms "
               f"before the power loss), {sum(x.conflicts for x in c)} conflicts, "
               f"{tally.refused} refused, {sum(x.central_ahead for x in c)} keys where the "
               f"central DB was ahead of the reopened cache by an unacknowledged write")
    print(summary)
    fault_tally.add("power-loss points checked", points)
    # enough points (>= 200 a run with the other local_sync), every phase met, and the writer
    # really wrote
    assert points >= 100, summary
    assert set(tally.points) >= {"first open", "group commit", "mark-clean", "checkpoint"}, (
        summary)
    assert sum(x.acks_checked for x in c) > 10 * points, summary
    if local_sync == "full":
        assert sum(x.conflicts for x in c) == 0, summary
        assert tally.refused == 0, summary
        for durability, checker in checkers.items():
            fault_tally.lost(f"{durability}, power loss", checker.lost)
    else:
        fault_tally.add("power-loss points that lost writes under local_sync=normal",
                        tally.lossy_points)
        fault_tally.add("most writes lost at one power-loss point under local_sync=normal",
                        tally.worst)


# -- regression: a new cache's names ----------------------------------------------------------

FIRST_COMMIT = """
import asyncio, os, sys, time
from pathlib import Path
from localstate._cache.entry import Entry
from localstate._cache.local_cache import LocalCache

async def main() -> None:
    cache = await LocalCache.open(Path(sys.argv[1]), owner_id="first", local_sync="full")
    await cache.commit(("owner", "key"), Entry("1", 1, 1, time.time(), "first", 0))
    os.write(1, b"ACK\\n")
    await cache.close()

asyncio.run(main())
"""


@pytest.mark.parametrize(("folder", "sqlite_dirsync"), [
    ("a/b", True),  # the open creates the cache's folders: each is fsynced into its parent
    ("", False),  # a SQLite that never fsyncs folders (SQLITE_DISABLE_DIRSYNC): the open
                  # fsyncs the folder of the file it created itself
], ids=["new folders", "sqlite without dirsync"])
def test_a_new_cache_survives_power_loss_after_its_first_commit(
    folder: str, sqlite_dirsync: bool, shim: Path, tmp_path: Path,
) -> None:
    # Once the first `local` commit of a new cache is acknowledged under `full`, a power loss
    # must leave its folders, the file and the row: a name is durable only once its folder
    # is fsynced.
    disk = tmp_path / "disk"
    disk.mkdir()
    log = tmp_path / "powerloss.log"
    cache = disk / folder / "cache.db"
    snapshot = Replay.snapshot([disk], [])
    subprocess.run([sys.executable, "-c", FIRST_COMMIT, str(cache)], check=True,
                   env={**os.environ, **shim_env(shim, log, [disk])})
    records = read_log(log)
    acked = next(i for i, r in enumerate(records) if r.op == MARK and r.data == b"ACK\n")
    replay = Replay(snapshot, records, sqlite_dirsync=sqlite_dirsync)
    replay.advance(acked)
    image = replay.materialize(tmp_path / "image")[0]
    survivor = image / cache.relative_to(disk)
    assert survivor.exists(), sorted(str(p) for p in image.rglob("*"))
    with contextlib.closing(sqlite3.connect(survivor)) as conn:
        assert conn.execute("SELECT value FROM state").fetchall() == [("1",)]


# -- the layer itself ------------------------------------------------------------------------

UNSYNCED = """
import os, sys
folder = sys.argv[1]
fd = os.open(f"{folder}/f", os.O_CREAT | os.O_RDWR, 0o644)
os.write(fd, b"a" * 5000)
os.fsync(fd)  # the data is durable, the name not yet
os.write(1, b"DATA\\n")
dfd = os.open(folder, os.O_RDONLY)
os.fsync(dfd)  # now the name too
os.write(1, b"NAME\\n")
os.pwrite(fd, b"b" * 10, 4090)  # unsynced, across a page boundary
os.rename(f"{folder}/f", f"{folder}/g")  # unsynced
os.write(1, b"END\\n")
"""


def test_the_replay_keeps_only_what_was_fsynced(shim: Path, tmp_path: Path) -> None:
    disk = tmp_path / "disk"
    disk.mkdir()
    log = tmp_path / "powerloss.log"
    snapshots = [Replay.snapshot([disk], []) for _ in range(4)]
    subprocess.run([sys.executable, "-c", UNSYNCED, str(disk)], check=True,
                   env={**os.environ, **shim_env(shim, log, [disk])})
    records = read_log(log)
    mark = {r.data: i for i, r in enumerate(records) if r.op == MARK}

    def image(roots: list[Root], cut: int, name: str, torn: random.Random | None = None,
              lose: bool = True) -> dict[str, bytes]:
        replay = Replay(roots, records)
        replay.advance(cut)
        folder = replay.materialize(tmp_path / name, torn, lose=lose)[0]
        return {p.name: p.read_bytes() for p in folder.iterdir()}

    a, b = b"a" * 5000, b"a" * 4090 + b"b" * 10 + b"a" * 900
    # the file's data was synced, its name not: a power loss takes the file
    assert image(snapshots[0], mark[b"DATA\n"], "data") == {}
    # after the folder's fsync, the file as synced, under its synced name, whatever came later
    assert image(snapshots[1], len(records), "end") == {"f": a}
    # all of it, as the process saw it
    assert image(snapshots[2], len(records), "seen", lose=False) == {"g": b}
    # torn: either name, and each 4 KiB page of the unsynced write old or new
    torn = image(snapshots[3], len(records), "torn", torn=random.Random(3))
    [(name, data)] = torn.items()
    assert name in {"f", "g"}
    assert data in {a, b, b"a" * 4090 + b"b" * 6 + b"a" * 904, b"a" * 4096 + b"b" * 4 + b"a" * 900}
