"""A triggerer's graceful stop flushes while Airflow's supervisor channel still works.

Airflow 3.3's trigger runner (``TriggerRunner`` in ``airflow.jobs.triggerer_job_runner``) stops
on SIGTERM or SIGINT: its handler sets ``stop``, ``arun()`` leaves its loop and, in its
``finally``, cancels the comms reader task *before* the triggers are cancelled and their
``cleanup()`` runs. From then on no request to the supervisor is ever answered, so a flush
through the ``airflow`` sink in ``cleanup()`` can only time out. The supervisor, meanwhile,
answers requests until the runner exits: ``TriggerRunnerSupervisor.kill()`` services the
runner's socket during each escalation delay (SIGINT, then SIGTERM 10 s later, then SIGKILL).

So the runner's own signal handler is the first sign of shutdown, and `install` wraps it. On
the first SIGTERM/SIGINT the wrapper starts `_drain` on the trigger loop and passes the signal
on to Airflow only when the drain is over:

1. calls through the mixin (``get_watermark``/``set_watermark``, ``open_state``, the local
   ``asset_state_store``) are held from here on: they wait, unanswered and unacknowledged,
   until the trigger is cancelled (`gate`);
2. the store flushes, again while its flush leaves keys dirty (the ``airflow`` sink's flush is
   bounded), for up to `DRAIN_SECONDS`, under the supervisor's first escalation delay;
3. the store closes. Left open, it would only commit its writes to the cache file when the
   runner's ``asyncio.run`` ends (`localstate._cache.local_cache`), leaving the flush to the next
   open of that file;
4. Airflow's handler runs: the runner stops as it would have.

Every write acknowledged before step 1 is in the central store when the runner exits, unless
the drain runs out of time (logged, with the keys left; they stay in the local cache and are
flushed when a triggerer next opens that cache file, where the conflict policy decides: under
``max`` the greater, newer watermark wins). Signals arriving during the drain (the supervisor's
SIGINT after a SIGTERM to the process group) are absorbed; it stops at its deadline anyway.
Calls made through the store directly, not through the mixin, are not held: after the drain
they raise `StoreClosed`.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any, Final

from localstate._store import StateStore
from localstate.errors import LocalStateError, reason

__all__ = ["DRAIN_SECONDS", "drained", "gate", "install"]

log = logging.getLogger("localstate.airflow.shutdown")

#: seconds the drain may flush: under Airflow's 10 s between the supervisor's SIGINT and SIGTERM
DRAIN_SECONDS: Final = 8.0
_SIGNALS: Final = (signal.SIGTERM, signal.SIGINT)

_Handler = Callable[[int, FrameType | None], Any]


class _Stop:
    """The one shutdown of this process: installed once, drained once."""

    def __init__(self) -> None:
        self.installed = False
        self.started = False
        self.done = False
        #: writes wait on it from the drain's start; never set: they end with their trigger
        self.never = asyncio.Event()
        self.task: asyncio.Task[None] | None = None


_STOP = _Stop()


def _airflow_runner_handler(handler: object) -> bool:
    """Whether `handler` is Airflow's ``TriggerRunner._handle_signal`` (a bound method)."""
    module = sys.modules.get("airflow.jobs.triggerer_job_runner")
    runner = getattr(module, "TriggerRunner", None) if module is not None else None
    owner = getattr(handler, "__self__", None)
    return runner is not None and owner is not None and isinstance(owner, runner)


def install(store: StateStore) -> bool:
    """Wrap the trigger runner's SIGTERM/SIGINT handlers to drain `store` first (once per
    process). False when this is not Airflow's trigger runner (its handler is not installed,
    or this is not the main thread): nothing is changed then."""
    if _STOP.installed:
        return True
    if threading.current_thread() is not threading.main_thread():
        return False
    handlers = {sig: signal.getsignal(sig) for sig in _SIGNALS}
    if not all(_airflow_runner_handler(h) for h in handlers.values()):
        return False
    loop = asyncio.get_running_loop()
    for sig, previous in handlers.items():
        signal.signal(sig, _wrapper(loop, store, previous))  # type: ignore[arg-type]
    _STOP.installed = True
    return True


def _wrapper(loop: asyncio.AbstractEventLoop, store: StateStore, previous: _Handler
             ) -> _Handler:
    def on_signal(signum: int, frame: FrameType | None) -> None:
        # runs between two bytecodes of the loop's thread: schedule, never await here
        if _STOP.done or loop.is_closed():
            previous(signum, frame)
            return
        if _STOP.started:
            return  # absorbed: the drain passes the first one on at its end
        _STOP.started = True

        def start() -> None:
            # held here: the loop keeps only a weak reference to its tasks
            _STOP.task = loop.create_task(_drain(store, lambda: previous(signum, frame)),
                                          name="localstate-drain")

        loop.call_soon_threadsafe(start)

    return on_signal


async def _drain(store: StateStore, pass_on: Callable[[], None]) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DRAIN_SECONDS
    flushed = 0
    try:
        while not store.closed and store.stats().dirty_keys:
            left = deadline - loop.time()
            if left <= 0:
                break
            try:
                report = await asyncio.wait_for(store.flush(), left)
            except (asyncio.TimeoutError, LocalStateError) as exc:
                log.warning("graceful stop: flushing failed (%s)", reason(exc))
                break
            flushed += report.written + report.adopted
            if not report.written and not report.adopted:
                break  # nothing could go out (no accessor, a failing asset): do not spin
        left = 0 if store.closed else store.stats().dirty_keys
        if not store.closed:
            # flushes again only what is still dirty, retrying what the central DB refuses
            # for now, within what is left of the drain: Airflow's kill escalation follows
            await store.close(timeout=max(0.0, deadline - loop.time()))
        if left:
            log.warning("graceful stop: %d keys could not be flushed before the trigger runner "
                        "stops; they stay in the local cache and are flushed when a triggerer "
                        "opens it again", left)
        else:
            log.info("graceful stop: flushed %d keys before the trigger runner stops", flushed)
    finally:
        _STOP.done = True
        pass_on()


async def gate() -> None:
    """Return at once, except during and after a graceful stop's drain: then wait until the
    calling trigger is cancelled, so no write is acknowledged that the drain cannot flush and
    nothing reopens the store it closed."""
    if _STOP.started:
        await _STOP.never.wait()


def drained() -> bool:
    """Whether this process's graceful stop has flushed (``cleanup()`` need not)."""
    return _STOP.done

