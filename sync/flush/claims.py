"""`ClaimBook`: the claim epochs one store holds, and the owners it lost.

A store that claims an owner (`StateStore.claim`) holds the epoch the central DB gave it. Every
flushed write of that owner carries an epoch (`DirtyRow.epoch`), stamped here at flush time:

* the held epoch, for a write made since the claim;
* the epoch held before it (0 if none), for a write made before the claim (its
  ``updated_at`` is older than the claim's start): a write made under an older claim, or none,
  never goes out under the newer one. `StateStore.claim` flushes first, so only writes made
  while the claim was in progress get here.

Rows of owners this store never claimed keep epoch 0: they behave as before claims existed,
except that the central DB refuses them once another writer has claimed the owner.

When a flush comes back with a write refused for its epoch (`FlushOutcome.lost_to`), the owner
is lost: `check` raises `OwnerLost` for every later write of it until the store claims it again.
The loss is logged once per claim.

A claim that cannot be made now (the central DB out of reach) may hold its owner's writes
back (`hold`): a trigger moved here during an outage runs on from its cache and claims later,
and until then the previous holder's claim stands, so a flush of its writes would be refused
and its events dropped while the trigger goes on past them. Held, they stay local (the sync
worker skips the owners in ``waiting``) until the claim is made, then go out under it; or until
it is refused (`outclaimed`), the owner leaves (`unhold`), or every caller that held it gave
up waiting (`abandon`: a trigger sharing an asset's owner with another may leave first), then
go out to be fenced as any.

The same wait covers every claim while it is in flight (`ClaimBook.claiming`): the owner's
writes made meanwhile go out under the claim once it is made. A flush sent under the old
claim and answered after the new one was recorded could not tell a refusal by another
writer's claim from one of a write made before this store's own claim.

Invariants: an owner is in ``lost`` only while ``held`` has the epoch that lost it; a new claim
replaces both. An owner is in ``waiting`` exactly while a claim of it is in flight or a caller
holds it (`hold`, until a claim is made or refused, the owner leaves, or the callers abandon).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from typing import NamedTuple

from localstate._cache.entry import StateKey
from localstate._core.backoff import Backoff
from localstate._core.failure_log import FailureLog
from localstate._core.rows import DirtyRow
from localstate._sync.sinks.sink import ClaimingSink, Sink
from localstate.errors import CentralError, CentralUnavailable, ConfigError, OwnerLost

__all__ = ["ClaimBook", "HeldClaim", "claim_owner", "claiming_sink"]

log = logging.getLogger("localstate.store")


class HeldClaim(NamedTuple):
    epoch: int
    #: POSIX time the claim began (writes older than this were made before it)
    since: float
    #: the epoch held before this claim (0: none)
    before: int


class ClaimBook:
    """The claims of one store (see the module docstring). Runs on the event loop's thread."""

    def __init__(self) -> None:
        self.held: dict[str, HeldClaim] = {}
        #: owners another writer claimed: owner -> the epoch the central DB holds (one dict
        #: for the book's lifetime, changed in place: the store's writes read it directly)
        self.lost: dict[str, int] = {}
        #: owners whose claim waits to be made: their writes stay local until then (`hold`;
        #: one set for the book's lifetime, changed in place: the sync worker reads it).
        #: Kept by `_settle` from the two counts below, its only writer
        self.waiting: set[str] = set()
        #: per owner, the callers waiting for a claim that could not be made (`hold`)
        self._holds: Counter[str] = Counter()
        #: per owner, the claims of it in flight (`claiming`)
        self._in_flight: Counter[str] = Counter()
        #: writes the central DB refused for their epoch (stats, the fault tally)
        self.refused = 0
        #: claims failing through an outage: logged at its start, a minute, its end
        self.failure_log = FailureLog(
            log, "claiming owners in the central DB (triggers run unclaimed meanwhile)")

    def begin(self) -> float:
        """The time a claim begins: call before asking the central DB for the epoch."""
        return time.time()

    def took(self, owner: str, epoch: int, since: float) -> None:
        """The central DB gave this store `epoch` of `owner`, claimed from `since` on."""
        old = self.held.get(owner)
        self.held[owner] = HeldClaim(epoch, since, old.epoch if old is not None else 0)
        self.lost.pop(owner, None)
        del self._holds[owner]  # made: every caller waiting for it has its claim
        self._settle(owner)

    def hold(self, owner: str) -> None:
        """`owner`'s claim could not be made now and will be tried again: keep its writes
        local until it is made or refused (see the module docstring). One more caller waits."""
        self._holds[owner] += 1
        self._settle(owner)

    def abandon(self, owner: str) -> None:
        """One caller that held `owner` (`hold`) stops waiting for its claim (it leaves); once
        none waits, its writes go out to be fenced as any."""
        if self._holds[owner] > 1:
            self._holds[owner] -= 1
        else:
            del self._holds[owner]
        self._settle(owner)

    @contextlib.contextmanager
    def claiming(self, owner: str) -> Iterator[None]:
        """While a claim of `owner` is in flight: its writes stay local (as `hold`), so that
        no flush runs against the claim. A flush refused under another writer's claim and
        answered only after this one was recorded would be taken for a write from before it
        (`lose` False): the write undone and its events dropped, with no `OwnerLost` for the
        writer going on past them. Made, the claim ends the wait (`took`); failed, the owner
        is left as it was (held or not)."""
        self._in_flight[owner] += 1
        self._settle(owner)
        try:
            yield
        finally:
            self._in_flight[owner] -= 1
            self._settle(owner)

    def unhold(self, owner: str) -> None:
        """Let `owner`'s writes go out without waiting for a claim (it leaves this store, or
        cannot be claimed at all), whoever held it; a claim in flight still holds them."""
        del self._holds[owner]
        self._settle(owner)

    def _settle(self, owner: str) -> None:
        """``waiting`` from the counts: `owner` waits while a claim of it is in flight or a
        caller holds it."""
        if self._in_flight[owner] <= 0:
            del self._in_flight[owner]
            if self._holds[owner] <= 0:
                del self._holds[owner]
                self.waiting.discard(owner)
                return
        self.waiting.add(owner)

    def epoch_of(self, owner: str) -> int:
        """The epoch this store holds on `owner` (0: none)."""
        held = self.held.get(owner)
        return held.epoch if held is not None else 0

    def stamp(self, rows: Sequence[DirtyRow]) -> Sequence[DirtyRow]:
        """`rows` with the epoch each was written under (see the module docstring)."""
        held = self.held
        if not held:
            return rows
        out: list[DirtyRow] = []
        for r in rows:
            claim = held.get(r.owner)
            if claim is None:
                out.append(r)
            else:
                out.append(r._replace(
                    epoch=claim.epoch if r.updated_at >= claim.since else claim.before))
        return out

    def outclaimed(self, owner: str, current: int) -> None:
        """A conditional claim of `owner` found a newer claim (epoch `current`) standing: this
        store may not write it (its later writes raise `OwnerLost`)."""
        if owner not in self.lost:
            log.warning("owner %r was claimed by another writer (epoch %d) while this store "
                        "waited to claim it: its writes here are refused", owner, current)
        self.lost[owner] = current
        del self._holds[owner]
        self._settle(owner)

    def lose(self, owner: str, epoch: int, current: int) -> bool:
        """A write of `owner` made at `epoch` was refused: the central DB is at `current`.
        Returns whether the owner is lost (False: the write predates this store's claim,
        which is still the current one)."""
        self.refused += 1
        if current <= self.epoch_of(owner):
            return False
        if owner not in self.lost:
            log.warning(
                "owner %r was claimed by another writer (epoch %d, this store held %d): its "
                "writes here are refused from now on (OwnerLost); claim it again to write it",
                owner, current, epoch)
        self.lost[owner] = current
        return True

    def check(self, owner: str) -> None:
        """Raise `OwnerLost` when another writer claimed `owner` from this store."""
        current = self.lost.get(owner)
        if current is not None:
            raise self.error(owner, current)

    def error(self, owner: str, current: int) -> OwnerLost:
        epoch = self.epoch_of(owner)
        return OwnerLost(
            f"owner {owner!r} was claimed by another writer (central epoch {current}, this "
            f"store held {epoch}): this store may not write it; claim it again to take it back",
            owner=owner, epoch=epoch, current=current)


def claiming_sink(sink: Sink | None) -> ClaimingSink:
    """`sink`, which must keep claim epochs; `ConfigError` otherwise."""
    if not isinstance(sink, ClaimingSink):
        raise ConfigError(
            f"the sink {sink.url if sink else None} keeps no claim epochs (sink = airflow): "
            "owners cannot be claimed, so a zombie triggerer is not fenced; use sink = sql")
    return sink


async def claim_owner(book: ClaimBook, sink: ClaimingSink, owner: str, *, claimant: str,
                      writer: str | None, dirty: Iterable[StateKey],
                      flush: Callable[[], Awaitable[object]] | None,
                      load: Callable[[str], Awaitable[int]] | None,
                      patience: float = 0.0,
                      unless_claimed_since: float | None = None) -> int:
    """`StateStore.claim`: flush `owner`'s writes among `dirty` (read after the claim began)
    under the claim they were made in, take the next epoch from `sink` (recorded in `book`),
    then refresh the owner's keys (`load`); return the epoch. `flush` and `load`: None when
    the store holds no entries (direct mode).

    A claim the central DB refuses for now (`CentralUnavailable`: a row lock it could not have
    within the transaction bound, a pool with no free connection, a dropped connection) is
    tried again with backoff and jitter for `patience` seconds, then raised. Jitter, since
    the claims that met one frozen writer's locks all fail at about the same moment."""
    since = book.begin()
    if flush is not None and any(k[0] == owner for k in dirty):
        await flush()
    deadline, backoff = time.monotonic() + patience, Backoff(base=0.2, cap=2.0)
    with book.claiming(owner):  # no await since the flush: nothing of it went out meanwhile
        while True:
            try:
                epoch = await sink.claim(owner, claimant=claimant, writer=writer,
                                         unless_claimed_since=unless_claimed_since)
                break
            except OwnerLost as exc:  # a newer claim stands: this store's writes are refused
                book.outclaimed(owner, exc.current)
                raise
            except CentralUnavailable as exc:
                delay = backoff.next_delay()
                if time.monotonic() + delay > deadline:
                    book.failure_log.failed(f"{owner!r}: {exc}")
                    raise
                await asyncio.sleep(delay)
            except CentralError as exc:
                book.failure_log.failed(f"{owner!r}: {exc}")
                raise
        book.failure_log.succeeded()
        book.took(owner, epoch, since)
    if load is not None:
        await load(owner)
    return epoch
