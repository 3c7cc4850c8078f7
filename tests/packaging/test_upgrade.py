"""Upgrading from the previous release, run for real: its own code (pinned by commit, from
this repository's history) writes, is SIGKILLed in its flush window and keeps a process
running; then this tree's code upgrades the same central DB and cache file.

The previous release: 0.1.0 of 2026-12-03 (central schema 2, cache-file schema 1, no claims,
no writer ids). Its source is unpacked with ``git archive`` and put first on the path of a
subprocess of this venv (its dependencies are this tree's, which it accepts), so the test
needs no package index. On SQLite and PostgreSQL (that release had no MySQL support).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
import os
import random
import sqlite3
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest
from conftest import PG_LOCALES
from flush_before_commit_writer import killed_after_the_flush
from sqlalchemy import text

from localstate import StateStore
from localstate._core.version import __version__
from localstate._sync.central.central_store import CentralStore
from localstate._sync.central.engine import make_engine
from localstate.cli._central import schema_version

PREVIOUS_RELEASE = "339ce5c992792dcb1b4390845cc8c9f1478333fe"  # 0.1.0, 2026-12-03
REPO = Path(__file__).resolve().parents[2]
WRITER = Path(__file__).resolve().parents[1] / "upgrade" / "old_release_writer.py"
OWNER = "asset_watcher:upgrade"
N_KEYS = 300
#: writes a process of the previous release tries after the new holder's claim
ZOMBIE_WRITES = 30


@pytest.fixture(params=["sqlite", "postgresql"])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="session")
def previous_release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The previous release's source tree (``localstate`` and its ``sync`` link)."""
    archive = subprocess.run(["git", "-C", str(REPO), "archive", PREVIOUS_RELEASE],
                             check=True, capture_output=True).stdout
    root = tmp_path_factory.mktemp("previous-release")
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(root, filter="tar")
    return root


def _old(release: Path, *args: str, stdin: int | None = None) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(release)}
    return subprocess.Popen([sys.executable, str(WRITER), *args], env=env, text=True,
                            stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _ask(proc: subprocess.Popen[str], line: str) -> str:
    assert proc.stdin is not None
    assert proc.stdout is not None
    proc.stdin.write(line + "\n")
    proc.stdin.flush()
    return proc.stdout.readline().strip()


async def _central_values(url: str) -> dict[str, Any]:
    async with CentralStore.open(url, upgrade_schema=False) as central:
        rows = await central.read_many([(OWNER, f"k{i}") for i in range(N_KEYS)])
    return {k: (None if r.data is None else r.data) for (_o, k), r in rows.items()}


async def test_upgrade_from_the_previous_release(
    previous_release: Path, central_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    cache = str(tmp_path / "old.db")
    # 1. the previous release writes, and is killed in its flush window: v2 committed
    #    centrally, v3 acknowledged locally, the mark-clean of v2 lost
    crash = _old(previous_release, "crash", central_url, cache, str(N_KEYS))
    out, err = crash.communicate(timeout=120)
    assert crash.returncode == -9, err
    assert out.split() == ["acknowledged"]
    assert await schema_version(central_url) == 2
    # a read-only command never migrates: status says what to do, and leaves schema 2
    status = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "localstate.cli", "status", "--central-url", central_url],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "AIRFLOW_HOME": str(tmp_path / "airflow-home")})
    assert status.returncode == 1, status.stderr
    assert "schema 2, needs upgrade: run `localstate db upgrade`" in status.stdout, status
    assert status.stdout.startswith(f"localstate    {__version__}\n"), status.stdout
    assert await schema_version(central_url) == 2
    # the two releases tell themselves apart: this one's --version, the previous one's
    # package version (it had no --version yet)
    mine = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-m", "localstate.cli", "--version"],
        capture_output=True, text=True, timeout=60, check=True)
    theirs = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-c", "import localstate; print(localstate.__version__)"],
        capture_output=True, text=True, timeout=60, check=True, cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(previous_release)})
    assert mine.stdout.strip() == f"localstate {__version__}"
    assert theirs.stdout.strip() == "0.1.0" != __version__
    # 2. a process of the previous release keeps running, on an owner of its own
    zombie_cache = str(tmp_path / "zombie.db")
    zombie = _old(previous_release, "linger", central_url, zombie_cache, stdin=subprocess.PIPE)
    try:
        assert zombie.stdout is not None
        ready = zombie.stdout.readline().split()
        assert ready[:1] == ["ready"], ready
        assert ready[1].startswith(str(previous_release)), ready  # the previous release's code
        assert _ask(zombie, "write asset_watcher:moved wm 1") == "ok"
        # 3. this release takes over the file (and migrates), announced once
        caplog.set_level(logging.INFO)
        store = await StateStore.open(central_url=central_url, cache_path=cache,
                                      triggerer_id="triggerer-old", upgrade_schema=True,
                                      flush_interval=3600.0)
        try:
            upgrades = [r.getMessage() for r in caplog.records
                        if "upgraded the localstate schema of the central DB" in r.getMessage()]
            assert len(upgrades) == 1, upgrades
            assert "from version 2 to 8" in upgrades[0], upgrades
            cache_upgrades = [r.getMessage() for r in caplog.records
                              if r.getMessage().startswith("upgraded the local cache")]
            assert cache_upgrades == [
                f"upgraded the local cache {cache} from schema version 1 to 3 "
                "(a writer id of its own; an outbox for emitted events)"], cache_upgrades
            # every acknowledged write is there, and flushes as its own (no conflict)
            local = [await store.get(OWNER, f"k{i}") for i in range(N_KEYS)]
            report = await store.flush()
            central = await _central_values(central_url)
            lost = sum(1 for i, v in enumerate(local)
                       if v != {"v": 3} or central.get(f"k{i}") != '{"v":3}')
            print(f"flush-window crash: {N_KEYS} keys acknowledged at v3 (v2 committed "
                  f"centrally), {lost} lost, {report.conflicts} conflicts, "
                  f"{report.written} written")
            assert (lost, report.conflicts, report.written) == (0, 0, N_KEYS), report
            # 4. the new holder claims the zombie's owner; the zombie's next write fails
            #    loudly and is not accepted
            await store.claim("asset_watcher:moved")
            await store.set("asset_watcher:moved", "wm", 100)
            await store.flush()
            answers = [_ask(zombie, f"write asset_watcher:moved wm {2 + i}")
                       for i in range(ZOMBIE_WRITES)]
            accepted = sum(1 for a in answers if not a.startswith("error"))
            print(f"the previous release's process after the upgrade: {accepted} of "
                  f"{ZOMBIE_WRITES} writes accepted; its error: {answers[0]}")
            assert accepted == 0, answers
            for answer in answers:  # the error names what is missing, the renamed table
                assert "localstate_state_variable" in answer, answer
            async with CentralStore.open(central_url, upgrade_schema=False) as c:
                row = (await c.read_many([("asset_watcher:moved", "wm")]))[
                    ("asset_watcher:moved", "wm")]
            assert row.data == "100"
        finally:
            await store.close()
    finally:
        zombie.kill()
        zombie.communicate()
    # 5. the downgrade is refused: the previous release opens neither the DB nor the file
    for url, cache_path, what in (
            (central_url, str(tmp_path / "fresh.db"), "central DB"),
            (f"sqlite:///{tmp_path / 'other-central.db'}", cache, "local cache")):
        again = _old(previous_release, "crash", url, cache_path, "1")
        _out, err = again.communicate(timeout=120)
        assert again.returncode == 1, err
        last = err.strip().splitlines()[-1]
        assert last.startswith("localstate.errors.SchemaError"), last
        assert what in last, last
        assert "newer than this" in last, last


async def _before_the_upgrade(url: str, cache: str) -> dict[str, tuple[Any, ...]]:
    """Each key as the previous release left it, read before this tree touches either side:
    the cache file's (value, version, synced_version, updated_at) and the central DB's
    (value, version, updated_at, updated_by)."""
    with contextlib.closing(sqlite3.connect(f"file:{cache}?mode=ro", uri=True)) as conn:
        local = {str(k): tuple(rest) for k, *rest in conn.execute(
            "SELECT key, value, version, synced_version, updated_at FROM state"
            " WHERE owner = ?", (OWNER,)).fetchall()}
    engine = make_engine(url)
    try:
        async with engine.connect() as c:
            rows = (await c.execute(text(
                "SELECT key, value, version, updated_at, updated_by"
                " FROM localstate_state_variable WHERE owner = :o"), {"o": OWNER})).all()
            central = {str(k): tuple(rest) for k, *rest in rows}
    finally:
        await engine.dispose()
    return {k: (local.get(k), central.get(k)) for k in local.keys() | central.keys()}


def _flushes_whose_mark_clean_was_lost(before: dict[str, tuple[Any, ...]]) -> int:
    """Keys the previous release's central DB holds at a later version than its cache file
    knows was flushed: killed between a flush's central commit and its mark-clean, or
    before the local commit of a write the flush carried."""
    return sum(1 for local, central in before.values() if central is not None
               and central[1] > (0 if local is None else local[2]))


#: SIGKILL rounds per backend (each: a fresh DB the previous release writes until killed at a
#: random point, then this tree upgrades it); LOCALSTATE_UPGRADE_ROUNDS for a longer run
ROUNDS = int(os.environ.get("LOCALSTATE_UPGRADE_ROUNDS", "50"))
_KEYS = 40


async def test_sigkill_rounds_then_upgrade_lose_no_acknowledged_write(
    previous_release: Path, backend: str, tmp_path: Path, request: pytest.FixtureRequest,
) -> None:
    """Each round the previous release writes (flushing every 20 ms) and is SIGKILLed after
    a random number of acknowledged sets, anywhere: mid-set, mid-flush, between its central
    commit and its mark-clean. This tree then upgrades the DB and the file: each key reads
    its last acknowledged value or a later write of it, the flush reports no conflict, and
    the central DB ends equal to the file."""
    rng = random.Random(ROUNDS)
    rounds = ROUNDS if backend == "sqlite" else max(1, ROUNDS // 5)
    lost = conflicts = acknowledged = window_keys = window_rounds = 0
    losses: list[str] = []
    for n in range(rounds):
        if backend == "sqlite":
            url = f"sqlite:///{tmp_path / f'central-{n}.db'}"
        else:
            url = request.getfixturevalue("pg_server").create_database(
                f"upgrade_{os.getpid()}_{n}", locale=PG_LOCALES[backend])
        cache = str(tmp_path / f"cache-{n}.db")
        old = _old(previous_release, "random", url, cache, str(_KEYS), str(n))
        assert old.stdout is not None
        acked: dict[str, int] = {}
        target = rng.randrange(10, 150)
        for _ in range(target):
            key, i = old.stdout.readline().split()
            acked[key] = int(i)
        old.kill()
        rest, _err = old.communicate(timeout=60)
        for line in rest.splitlines():  # acknowledged before the kill, read after it
            key, i = line.split()
            acked[key] = int(i)
        acknowledged += len(acked)
        before = await _before_the_upgrade(url, cache)
        cut = _flushes_whose_mark_clean_was_lost(before)
        window_keys += cut
        window_rounds += cut > 0
        store = await StateStore.open(central_url=url, cache_path=cache,
                                      triggerer_id="triggerer-old", flush_interval=3600.0)
        try:
            opened = {k: await store.get(OWNER, k) for k in acked}
            report = await store.flush()
            conflicts += report.conflicts
            got = {k: await store.get(OWNER, k) for k in acked}
            async with CentralStore.open(url, upgrade_schema=False) as central:
                rows = await central.read_many([(OWNER, k) for k in acked])
            central_values = {k: None if r.data is None else int(r.data)
                              for (_o, k), r in rows.items()}
            for k, last in acked.items():
                # as opened, the acknowledged value or a later write; after the first flush
                # the store and the central DB agree on one, however the kill fell
                if (opened[k] is None or opened[k] < last or got[k] is None or got[k] < last
                        or central_values.get(k) != got[k]):
                    lost += 1
                    losses.append(f"round {n} key {k}: acknowledged {last}, read {opened[k]} "
                                  f"then {got[k]} after the first flush, central "
                                  f"{central_values.get(k)}; before "
                                  f"the upgrade (cache, central): {before.get(k)}")
        finally:
            await store.close()
    print(f"{backend}: {rounds} SIGKILL rounds, {acknowledged} keys' last acknowledged "
          f"writes checked, {lost} lost, {conflicts} conflicts; killed in the flush window "
          f"(central commit made, mark-clean lost) in {window_rounds} rounds, {window_keys} "
          "keys")
    assert (lost, conflicts) == (0, 0), "\n".join(losses)


async def test_airflow_db_migrate_upgrades_the_previous_releases_schema(
    previous_release: Path, central_url: str, tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``airflow db migrate``'s path (localstate's Alembic revisions, run by Alembic) on the
    schema the previous release left, its flush window cut by a SIGKILL: each missing step is
    applied and announced, the previous release's rows are marked as its own, and this tree
    then flushes the file with no conflict; a second run changes nothing."""
    from alembic_revisions import run_revisions, schema_state, sync_engine

    cache = str(tmp_path / "old.db")
    crash = _old(previous_release, "crash", central_url, cache, "20")
    _out, err = crash.communicate(timeout=120)
    assert crash.returncode == -9, err
    caplog.set_level(logging.INFO)
    engine = sync_engine(central_url)
    try:
        run_revisions(engine)
        steps = [r.getMessage() for r in caplog.records
                 if "upgraded the localstate schema of the central DB" in r.getMessage()]
        assert [s.split(" to ")[1].split(":")[0] for s in steps] == [
            str(v) for v in range(3, 9)], steps  # one line per step, 3 to 8
        first = schema_state(engine)
        with engine.connect() as conn:
            marked = conn.execute(text(
                "SELECT count(*) FROM localstate_state WHERE writer = 'earlier-release'"
            )).scalar_one()
        assert marked == 20
        run_revisions(engine)
        assert schema_state(engine) == first
    finally:
        engine.dispose()
    store = await StateStore.open(central_url=central_url, cache_path=cache,
                                  triggerer_id="triggerer-old", upgrade_schema=False,
                                  flush_interval=3600.0)
    try:
        report = await store.flush()
        assert (report.conflicts, report.written) == (0, 20), report
    finally:
        await store.close()
    central = await _central_values(central_url)
    assert [central[f"k{i}"] for i in range(20)] == ['{"v":3}'] * 20


@pytest.mark.parametrize("marked", [False, True], ids=["dirty", "clean"])
async def test_a_write_flushed_before_its_local_commit_is_taken_after_the_upgrade(
    previous_release: Path, backend: str, marked: bool, tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    """The previous release flushes ``k`` = 2 to the central DB before the local commit of
    that write and is SIGKILLed in between (`flush_before_commit_writer`): its file holds the
    acknowledged 1 (dirty, or with MARKED ``clean`` its flush's mark-clean committed), the
    central DB the later 2. After this tree's upgrade and first flush, the store and the
    central DB agree on 2: never the store on 1 with 2 central, which a file opened clean
    kept for good."""
    if backend == "sqlite":
        url = f"sqlite:///{tmp_path / 'central.db'}"
    else:
        url = request.getfixturevalue("pg_server").create_database(
            f"inflight_{os.getpid()}_{int(marked)}", locale=PG_LOCALES[backend])
    cache = str(tmp_path / "cache.db")
    killed_after_the_flush(url, cache, marked=marked, release=previous_release)
    before = await _before_the_upgrade(url, cache)
    assert before["k"][0][:3] == ("1", 1, 1 if marked else 0)  # the file: 1, v1
    assert before["k"][1][:2] == ("2", 2)  # the central DB: 2, v2
    store = await StateStore.open(central_url=url, cache_path=cache,
                                  triggerer_id="triggerer-old", flush_interval=3600.0)
    try:
        report = await store.flush()
        assert await store.get(OWNER, "k") == 2
        assert report.conflicts == 0
    finally:
        await store.close()
    async with CentralStore.open(url, upgrade_schema=False) as central:
        assert (await central.read_many([(OWNER, "k")]))[(OWNER, "k")].data == "2"
