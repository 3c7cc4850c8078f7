"""Claim epochs (fencing tokens): `CentralStore.claim`, the claim fence of the flush on every
backend (`central_url`: SQLite, PostgreSQL, MySQL-family), and a store's `OwnerLost`.

A zombie is a writer that held an owner's claim and kept writing after another writer claimed
it. The fence must refuse its writes whatever the policy and whatever order the flushes arrive
in; an owner nobody claimed behaves as before.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import pytest_asyncio
from conftest import StoreFactory
from sqlalchemy import select

from localstate import StateStore
from localstate._core.conflicts import PolicyMap
from localstate._core.rows import DirtyRow, FlushOutcome
from localstate._sync.central.central_store import CentralStore
from localstate._sync.central.schema import event
from localstate._sync.flush.claims import ClaimBook
from localstate.errors import OwnerLost

OWNER = "asset_watcher:orders"
#: an owner whose events need no Airflow tables (emit on every backend)
TRIGGER_OWNER = "trigger:orders"
POLICIES = ["reject", "last_writer_wins", "max"]


def row(key: str, value: Any, *, version: int, base: int, by: str, epoch: int,
        owner: str = OWNER) -> DirtyRow:
    return DirtyRow(owner, key, orjson.dumps(value).decode(), version, base, time.time(), by,
                    epoch)


def only(outcomes: list[FlushOutcome]) -> FlushOutcome:
    assert len(outcomes) == 1, outcomes
    return outcomes[0]


async def committed_keys(central: CentralStore, owner: str = OWNER) -> list[str]:
    """The keys of `owner`'s events the central DB committed, in emit order."""
    t = event.c
    rows = await central.run_read(select(t.key).where(t.owner == owner).order_by(t.seq),
                                  "read events")
    return [str(k) for (k,) in rows]


async def value(central: CentralStore, key: str, owner: str = OWNER) -> Any:
    got = (await central.read_many([(owner, key)])).get((owner, key))
    return None if got is None or got.data is None else orjson.loads(got.data)


@pytest_asyncio.fixture
async def central(central_url: str) -> AsyncIterator[CentralStore]:
    store = await CentralStore.open(central_url)
    try:
        yield store
    finally:
        await store.close()


async def test_claim_bumps_the_epoch_and_records_the_claimant(central: CentralStore) -> None:
    assert await central.read_claims([OWNER]) == {}
    assert await central.claim(OWNER, claimant="triggerer-a") == 1
    assert await central.claim(OWNER, claimant="triggerer-b") == 2
    assert await central.claim("other", claimant="triggerer-a") == 1
    assert await central.read_claims([OWNER, "other", "never"]) == {
        OWNER: (2, "triggerer-b"), "other": (1, "triggerer-a")}


async def test_a_storm_of_claims_gives_each_claim_its_own_epoch_in_few_transactions(
    central: CentralStore,
) -> None:
    """Hundreds of claims at once (triggers moving to this triggerer), one owner claimed
    three times among them, by different claimants: each claim gets an epoch of its own, the
    repeated owner's three in a row, the last claimant recorded. On PostgreSQL the waiting
    claims are made together, a few transactions for the storm."""
    owners = [f"storm:{i:03d}" for i in range(200)]
    calls = [(o, "triggerer-a") for o in owners] + [(OWNER, f"triggerer-{n}") for n in "xyz"]
    before = central.transactions
    epochs = await asyncio.gather(*(central.claim(o, claimant=c) for o, c in calls))
    assert epochs[:200] == [1] * 200
    assert sorted(epochs[200:]) == [1, 2, 3]
    claims = await central.read_claims([*owners, OWNER])
    assert all(claims[o] == (1, "triggerer-a") for o in owners)
    last = calls[200 + epochs[200:].index(3)][1]
    assert claims[OWNER] == (3, last)
    transactions = central.transactions - before
    if central.dialect == "postgresql":
        assert transactions <= 10, transactions
    else:
        assert transactions == len(calls)


async def test_a_conditional_claim_never_takes_an_owner_back_from_a_newer_claim(
    central: CentralStore,
) -> None:
    before_any = time.time() - 1
    # no claim row yet, or only claims made before the time given: the claim goes through
    assert await central.claim(OWNER, claimant="a", unless_claimed_since=before_any) == 1
    assert await central.claim(OWNER, claimant="a", unless_claimed_since=time.time() + 1) == 2
    # started before b's claim: refused, and nothing changed
    started = time.time() - 1
    with pytest.raises(OwnerLost) as lost:
        await central.claim(OWNER, claimant="late", unless_claimed_since=started)
    assert (lost.value.owner, lost.value.current) == (OWNER, 2)
    assert await central.read_claims([OWNER]) == {OWNER: (2, "a")}


async def test_a_store_refused_a_conditional_claim_may_not_write_the_owner(
    open_store: StoreFactory,
) -> None:
    started = time.time() - 1
    holder = await open_store(triggerer_id="holder")
    late = await open_store(triggerer_id="late")
    assert await holder.claim(OWNER) == 1
    with pytest.raises(OwnerLost):
        await late.claim(OWNER, unless_claimed_since=started)
    with pytest.raises(OwnerLost):
        await late.set(OWNER, "wm", 1)
    await holder.set(OWNER, "wm", 2)  # the holder is untouched


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("zombie_first", [True, False], ids=["zombie-first", "owner-first"])
async def test_a_lower_epoch_is_refused_whatever_the_policy_and_order(
        central: CentralStore, policy: str, zombie_first: bool) -> None:
    policies = PolicyMap(policy)
    assert await central.claim(OWNER, claimant="a") == 1
    first = only(await central.write_batch(
        [row("wm", 10, version=1, base=0, by="a", epoch=1)], policies, writer="file-a"))
    assert first.resolution == "written"
    assert await central.claim(OWNER, claimant="b") == 2
    # The zombie's writes: based on the current version (the version fence alone lets it in),
    # larger (max alone lets it in), and a key the new owner never wrote.
    zombie = [row("wm", 99, version=2, base=1, by="a", epoch=1),
              row("new", 7, version=1, base=0, by="a", epoch=1)]
    owner = [row("wm", 11, version=2, base=1, by="b", epoch=2)]
    if zombie_first:
        refused = await central.write_batch(zombie, policies, writer="file-a")
        taken = only(await central.write_batch(owner, policies, writer="file-b"))
    else:
        taken = only(await central.write_batch(owner, policies, writer="file-b"))
        refused = await central.write_batch(zombie, policies, writer="file-a")
    assert taken.resolution == "written"
    assert [(o.resolution, o.lost_to) for o in refused] == [("adopted", 2), ("adopted", 2)]
    wm, new = refused
    assert wm.central is not None
    assert new.central is not None
    assert wm.central.data == (orjson.dumps(11).decode() if not zombie_first else
                               orjson.dumps(10).decode())
    assert new.central.data is None  # nothing there
    assert new.central.version == 0
    assert await value(central, "wm") == 11
    assert await value(central, "new") is None


@pytest.mark.parametrize("policy", POLICIES)
async def test_a_writer_that_never_claimed_is_refused_once_the_owner_is_claimed(
        central: CentralStore, policy: str) -> None:
    policies = PolicyMap(policy)
    # unclaimed: epoch 0 writes go in as before
    assert only(await central.write_batch(
        [row("wm", 1, version=1, base=0, by="x", epoch=0)], policies,
        writer="file-x")).resolution == "written"
    await central.claim(OWNER, claimant="b")
    refused = only(await central.write_batch(
        [row("wm", 5, version=2, base=1, by="x", epoch=0)], policies, writer="file-x"))
    assert (refused.resolution, refused.lost_to) == ("adopted", 1)
    assert await value(central, "wm") == 1
    # another owner, still unclaimed, is untouched by that claim
    assert only(await central.write_batch(
        [row("wm", 1, version=1, base=0, by="x", epoch=0, owner="free")], policies,
        writer="file-x")).resolution == "written"


@pytest.mark.parametrize("policy", POLICIES)
async def test_within_one_claim_the_policy_applies_unchanged(
        central: CentralStore, policy: str) -> None:
    policies = PolicyMap(policy)
    epoch = await central.claim(OWNER, claimant="b")
    await central.write_batch([row("wm", 10, version=1, base=0, by="b", epoch=epoch)],
                              policies, writer="file-b")
    # a stale write at the current epoch: settled by the policy, not the claim
    stale = only(await central.write_batch(
        [row("wm", 20, version=1, base=0, by="c", epoch=epoch)], policies, writer="file-c"))
    assert stale.lost_to == 0
    assert stale.conflict
    expected = {"reject": 10, "last_writer_wins": 20, "max": 20}[policy]
    assert await value(central, "wm") == expected


def test_claim_book_stamps_writes_made_before_a_claim_with_the_older_epoch() -> None:
    book = ClaimBook()
    before = row("wm", 1, version=1, base=0, by="a", epoch=0)._replace(updated_at=100.0)
    after = row("k", 1, version=1, base=0, by="a", epoch=0)._replace(updated_at=200.0)
    other = row("k", 1, version=1, base=0, by="a", epoch=0, owner="free")
    assert book.stamp([before]) == [before]  # nothing claimed: nothing changes
    book.took(OWNER, 3, since=50.0)
    book.took(OWNER, 4, since=150.0)
    assert [r.epoch for r in book.stamp([before, after, other])] == [3, 4, 0]
    # a refusal of a pre-claim write does not lose a claim that still stands...
    assert not book.lose(OWNER, 3, 4)
    book.check(OWNER)
    # ...a higher central epoch does
    assert book.lose(OWNER, 4, 5)
    with pytest.raises(OwnerLost, match="claimed by another writer") as caught:
        book.check(OWNER)
    assert (caught.value.owner, caught.value.epoch, caught.value.current) == (OWNER, 4, 5)
    book.took(OWNER, 6, since=300.0)  # claimed back
    book.check(OWNER)


def test_claim_book_holds_an_owner_until_the_last_caller_waiting_for_its_claim_leaves(
) -> None:
    """Two triggers here watch one asset; its claim could not be made for either. The first to
    leave abandons its wait, but the other still waits: the owner's writes stay held. They go
    out once the last waiter leaves, yet never while a claim of the owner is in flight."""
    book = ClaimBook()
    book.hold(OWNER)
    book.hold(OWNER)
    book.abandon(OWNER)
    assert OWNER in book.waiting
    with book.claiming(OWNER):  # the other trigger's background claim, in flight
        book.abandon(OWNER)
        assert OWNER in book.waiting
    assert OWNER not in book.waiting  # it failed: nobody waits any more
    book.hold(OWNER)
    with book.claiming(OWNER):
        book.took(OWNER, 2, since=100.0)  # made: every waiter has it
    assert OWNER not in book.waiting
    book.abandon(OWNER)  # a waiter leaving after the claim was made changes nothing
    assert OWNER not in book.waiting
    book.hold(OWNER)
    book.hold(OWNER)
    book.unhold(OWNER)  # the owner leaves this store: whoever held it
    assert OWNER not in book.waiting


async def test_a_zombie_store_gets_owner_lost_and_takes_the_new_owners_record(
        open_store: StoreFactory, central: CentralStore,
        caplog: pytest.LogCaptureFixture) -> None:
    a: StateStore = await open_store(triggerer_id="a")
    b: StateStore = await open_store(triggerer_id="b")
    assert await a.claim(OWNER) == 1
    await a.set(OWNER, "wm", 1)
    await a.flush()
    assert await b.claim(OWNER) == 2
    assert await b.get(OWNER, "wm") == 1  # the claim loaded the owner's keys
    await b.set(OWNER, "wm", 2)
    await a.set(OWNER, "wm", 50)  # the zombie, not knowing yet
    await a.set(OWNER, "extra", 1)
    report = await a.flush()
    assert sorted((o.row.key, o.lost_to) for o in report.outcomes) == [("extra", 2), ("wm", 2)]
    assert a.claims_refused == 2
    with pytest.raises(OwnerLost):
        await a.set(OWNER, "wm", 51)
    with pytest.raises(OwnerLost):
        await a.delete(OWNER, "wm")
    with pytest.raises(OwnerLost):
        await a.compare_and_set(OWNER, "wm", 52, expected_version=1)
    assert await a.get(OWNER, "wm") == 1  # took the central record, not its own
    assert await a.get(OWNER, "extra") is None
    assert sum("was claimed by another writer" in r.message for r in caplog.records) == 1
    await b.flush()
    assert await value(central, "wm") == 2
    await a.set("free", "wm", 1)  # other owners are still a's to write
    # claimed back: a writes again, from b's record
    assert await a.claim(OWNER) == 3
    assert await a.get(OWNER, "wm") == 2
    await a.set(OWNER, "wm", 3)
    await a.flush()
    assert await value(central, "wm") == 3


async def test_a_central_write_of_a_zombie_fails_with_owner_lost(
        open_store: StoreFactory) -> None:
    a: StateStore = await open_store(triggerer_id="a")
    b: StateStore = await open_store(triggerer_id="b")
    await a.claim(OWNER)
    await b.claim(OWNER)
    with pytest.raises(OwnerLost) as caught:
        await a.set(OWNER, "wm", 1, durability="central")
    assert (caught.value.epoch, caught.value.current) == (1, 2)


def crash_after_writing(url: str, cache: Path, owner: str, value: int) -> None:
    """A process that claims `owner`, writes `value` to its cache file (local durability)
    and dies before any flush."""
    script = f"""
import asyncio, os
from localstate import StateStore
async def main():
    store = await StateStore.open(central_url={url!r}, cache_path={str(cache)!r},
                                  triggerer_id="a", flush_interval=3600)
    await store.claim({owner!r})
    await store.set({owner!r}, "wm", {value}, durability="local")
    os._exit(0)
asyncio.run(main())
"""
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120)


@pytest.mark.parametrize("claimed_meanwhile", [False, True], ids=["restart", "moved"])
async def test_a_restarted_triggerer_flushes_the_writes_of_its_own_claim(
        central_url: str, central: CentralStore, tmp_path: Path,
        claimed_meanwhile: bool) -> None:
    """Writes acknowledged under a claim and left in the cache file by a crash are the file's
    own: the restarted process flushes them though it has not claimed again, unless another
    writer claimed the owner meanwhile (then they are a zombie's, refused)."""
    cache = tmp_path / "a.db"
    crash_after_writing(central_url, cache, OWNER, 7)
    if claimed_meanwhile:
        assert await central.claim(OWNER, claimant="b") == 2
    store = await StateStore.open(central_url=central_url, cache_path=cache, triggerer_id="a",
                                  flush_interval=3600)
    try:
        report = await store.flush()
        assert [o.lost_to for o in report.outcomes] == [2 if claimed_meanwhile else 0]
        assert await value(central, "wm") == (None if claimed_meanwhile else 7)
        if claimed_meanwhile:
            with pytest.raises(OwnerLost):
                await store.set(OWNER, "wm", 8)
        else:
            await store.set(OWNER, "wm", 8)
            await store.flush()
            assert await value(central, "wm") == 8
    finally:
        await store.close()


async def test_a_write_refused_while_this_store_claims_again_is_never_dropped_silently(
        open_store: StoreFactory, central: CentralStore,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A claim in flight while a flush of the owner runs: the flush's transaction meets
    another writer's claim (its writes refused), and this store's claim commits right after
    it and is recorded before the flush's answer is. Settled then, the refusal looked like one
    of a write from before this store's claim, which stands (`ClaimBook.lose` answered False):
    the watermark went back to the central record and the event was dropped, with no
    `OwnerLost`, and the writer went on past them (an item lost, the watermark one version
    short). While its claim is in flight, a store's flushes leave the owner's writes alone:
    they go out under the claim once it is made."""
    b: StateStore = await open_store(triggerer_id="b")
    a: StateStore = await open_store(triggerer_id="a")
    assert await b.claim(TRIGGER_OWNER) == 1
    await b.emit(TRIGGER_OWNER, {"n": 1}, watermark=1)
    await b.flush()
    assert await a.claim(TRIGGER_OWNER) == 2  # the trigger moved to a

    sink: Any = b.sink
    real_claim, real_write = sink.claim, sink.write_with_events
    claim_sent, claim_go = asyncio.Event(), asyncio.Event()
    flush_done, flush_answer = asyncio.Event(), asyncio.Event()

    async def claim(*args: Any, **kwargs: Any) -> int:
        claim_sent.set()
        await claim_go.wait()  # the claim's transaction comes after the flush's
        return int(await real_claim(*args, **kwargs))

    async def write_with_events(*args: Any, **kwargs: Any) -> Any:
        result = await real_write(*args, **kwargs)  # committed (or refused) centrally
        flush_done.set()
        await flush_answer.wait()  # its answer arrives after the claim's
        return result

    monkeypatch.setattr(sink, "claim", claim)
    monkeypatch.setattr(sink, "write_with_events", write_with_events)
    claiming = asyncio.create_task(b.claim(TRIGGER_OWNER))  # the trigger is back on b
    await claim_sent.wait()
    await b.emit(TRIGGER_OWNER, {"n": 2}, watermark=2)  # b's trigger goes on meanwhile
    flushing = asyncio.create_task(b.flush())
    # fixed: the flush leaves the owner alone (no transaction); before: it is refused
    refused = asyncio.ensure_future(flush_done.wait())
    await asyncio.wait({flushing, refused}, return_when=asyncio.FIRST_COMPLETED)
    refused.cancel()
    claim_go.set()
    assert await claiming == 3
    flush_answer.set()
    await flushing
    # b holds the owner: its writes go on, and nothing it emitted is lost
    await b.emit(TRIGGER_OWNER, {"n": 3}, watermark=3)
    await b.flush()
    committed = await committed_keys(central, TRIGGER_OWNER)
    assert committed == ["1", "2", "3"], committed
    record = await b.read_committed(TRIGGER_OWNER, "watermark")
    assert record is not None
    assert (record.value, record.version) == (3, 3)
