"""One triggerer of the claim failover test: ``python claim_writer.py <json options>``.

It opens a `StateStore` (its own cache file, the shared central DB; flushes only when told)
and runs orders, one JSON object a line on stdin, one at a time, answering each with
``DONE <id> <answer>`` (one ``os.write`` per line):

``{"id": n, "claim": owner}``
    `StateStore.claim`: answers the epoch.
``{"id": n, "write": owner, "key": key, "value": v}``
    a set in ``memory`` durability: answers ``ok <version>``, or ``lost`` when the store
    refused it with `OwnerLost`.
``{"id": n, "get": owner, "key": key}``
    answers the value as JSON.
``{"id": n, "flush": true}``
    a flush: answers ``<lost> <conflicts>``, the writes it saw refused for their claim epoch
    and the conflicts it settled by policy.
``{"id": n, "claim_many": [owner, ...]}``
    claims them all at once (the storm of a triggerer taking many triggers over): answers
    JSON ``[[owner, seconds it took, epoch or the error's class name], ...]``.
``{"id": n, "freeze_in_flush": true}``
    a flush that stops this process (SIGSTOP) inside its transaction, its rows written and
    locked, just before COMMIT: a triggerer frozen mid-flush (answered once woken and done).
    Through ``sink = api`` (the triggerer holds no transaction there) it stops once its
    request's headers are sent and its body is not: the API server waits for the rest.
``{"id": n, "freeze_after_commit": true}``
    a flush that stops this process once the central DB has committed it (with ``sink =
    api``: once the server has its whole request and 0.5 s to commit it) and before the
    answer is read: a triggerer frozen between its COMMIT and its ``flush_timeout`` check.
``{"id": n, "dirty": true}``
    answers ``<dirty keys> <central errors>`` (`StateStore.stats`).
``{"quit": true}``
    closes the store and exits.

Options beyond the store's own settings: ``sink`` = ``api`` with ``api_url`` and
``api_token`` (no ``central_url`` then), ``tick_owners`` (owners whose key ``tick`` a
background task sets to a growing counter every ``tick_interval`` s, for the store's own
worker to flush every ``flush_interval`` s; the last round acknowledged goes to the file
``tick_record``), and the settings ``central_transaction_timeout`` and ``flush_timeout``.

The parent may SIGSTOP it at any moment (mid-flush too) and SIGCONT it later: a zombie.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import event

from localstate import StateStore
from localstate._sync.central.central_store import CentralStore
from localstate._sync.sinks.api_sink import ApiSink
from localstate.errors import LocalStateError, OwnerLost


def answer(n: int, *fields: object) -> None:
    os.write(1, (" ".join(["DONE", str(n), *(str(f) for f in fields)]) + "\n").encode())


async def run(store: StateStore, command: dict[str, Any]) -> None:
    n = command["id"]
    if "claim" in command:
        answer(n, await store.claim(command["claim"]))
    elif "write" in command:
        try:
            version = await store.set(command["write"], command["key"], command["value"],
                                      durability="memory")
        except OwnerLost:
            answer(n, "lost")
        else:
            answer(n, "ok", version)
    elif "get" in command:
        value = await store.get(command["get"], command["key"])
        answer(n, json.dumps(value, separators=(",", ":")))
    elif "dirty" in command:
        stats = store.stats()
        answer(n, stats.dirty_keys, stats.central_errors)
    elif "claim_many" in command:
        answer(n, json.dumps(await asyncio.gather(*(
            timed_claim(store, owner) for owner in command["claim_many"]))))
    else:
        if command.get("freeze_in_flush"):
            freeze_before_commit(store)
        elif command.get("freeze_after_commit"):
            freeze_after_commit(store)
        try:
            report = await store.flush()
        except LocalStateError as exc:  # e.g. the server ended a frozen flush's transaction
            answer(n, "error", type(exc).__name__)
            return
        lost = sum(1 for o in report.outcomes if o.lost_to)
        answer(n, lost, report.conflicts)


async def timed_claim(store: StateStore, owner: str) -> tuple[str, float, int | str]:
    started = time.monotonic()
    try:
        epoch: int | str = await store.claim(owner)
    except LocalStateError as exc:
        epoch = type(exc).__name__
    return owner, time.monotonic() - started, epoch


def stop_self() -> None:
    os.kill(os.getpid(), signal.SIGSTOP)


def stop_once(action: Callable[[], None]) -> Callable[[], None]:
    """`action` the first time the result is called, nothing after (a listener or hook stays
    installed: removing it mid-dispatch fails)."""
    once = [True]

    def run() -> None:
        if once.pop() if once else False:
            action()
    return run


def on_request_trace(store: StateStore, when: str, action: Callable[[], None]) -> None:
    """Run `action` (once) at the httpcore trace event `when` of the API sink's next request."""
    sink = store.sink
    assert isinstance(sink, ApiSink), sink
    act = stop_once(action)

    async def trace(name: str, _info: dict[str, Any]) -> None:
        if name == when:
            act()

    async def hook(request: httpx.Request) -> None:
        request.extensions["trace"] = trace

    sink._http.event_hooks["request"].append(hook)


def freeze_before_commit(store: StateStore) -> None:
    """Stop this process at the next COMMIT the central engine sends, once (with ``sink =
    api``: once the next request's headers are sent, its body not)."""
    if isinstance(store.sink, ApiSink):
        on_request_trace(store, "http11.send_request_headers.complete", stop_self)
        return
    sink = store.sink
    assert isinstance(sink, CentralStore), sink
    act = stop_once(stop_self)
    event.listen(sink.engine.sync_engine, "commit", lambda _conn: act())


def stop_after(seconds: float) -> None:
    """Block the event loop `seconds` (the request or COMMIT just sent is answered meanwhile,
    the answer left unread), then stop this process."""
    time.sleep(seconds)
    stop_self()


def freeze_after_commit(store: StateStore) -> None:
    """Stop this process once the next flush has committed, before it reads the answer."""
    if isinstance(store.sink, ApiSink):
        on_request_trace(store, "http11.send_request_body.complete",
                         lambda: stop_after(0.5))
        return
    sink = store.sink
    assert isinstance(sink, CentralStore), sink
    loop = asyncio.get_running_loop()
    # the listener runs just before the COMMIT is written to the socket; the loop's next turn,
    # after the COMMIT went out and the task waits for its answer, blocks and stops

    def later() -> None:
        loop.call_soon(stop_after, 0.5)

    act = stop_once(later)
    event.listen(sink.engine.sync_engine, "commit", lambda _conn: act())


async def tick(store: StateStore, owners: list[str], interval: float, record: str) -> None:
    """Set each owner's ``tick`` to 1, 2, 3, ... every `interval` s (acknowledged locally),
    writing the last round acknowledged for every owner to the file `record`."""
    for n in itertools.count(1):
        for owner in owners:
            await store.set(owner, "tick", n, durability="local")
        await asyncio.to_thread(Path(record).write_text, str(n))
        await asyncio.sleep(interval)


async def main(options: dict[str, Any]) -> None:
    extra = {k: options[k] for k in ("central_url", "central_transaction_timeout",
                                     "flush_timeout", "sink", "api_url", "api_token")
             if options.get(k) is not None}
    store = await StateStore.open(
        cache_path=options["cache_path"],
        triggerer_id=options["triggerer_id"], conflict_policy=options["conflict_policy"],
        flush_interval=options.get("flush_interval", 3600.0), local_sync="normal",
        central_thread=False, **extra,
    )
    ticking = (asyncio.create_task(tick(store, options["tick_owners"], options["tick_interval"],
                                        options["tick_record"]))
               if options.get("tick_owners") else None)
    # each loss is logged once; here they are the point, and thousands
    logging.getLogger("localstate.store").setLevel(logging.ERROR)
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    os.write(1, b"READY\n")
    while line := await reader.readline():
        command = json.loads(line)
        if "quit" in command:
            break
        await run(store, command)
    if ticking is not None:
        ticking.cancel()
    await store.close()


if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.argv[1])))
