"""`ConfigWatcher`: live reload of airflow.cfg into a running store.

A store opened with ``watch_config`` (``StateStore.open(watch_config=True)``, or
``[localstate] watch_config = True``) watches its airflow.cfg with `watchfiles.awatch`. When the
file changes, the settings are resolved again in the usual order (the store's own arguments and
the environment still win over the file) and the live ones, ``enabled``, ``flush_interval``,
``max_batch`` and ``durability``, are applied through `StateStore.reconfigure`:

* ``enabled = False`` flushes every dirty key, then sends every call to the central DB; while
  the central DB cannot take those writes the turn-off is pending: the store serves from the
  cache until they are flushed (`localstate._pending_switch`); ``enabled = True`` opens the
  local cache and starts the sync worker;
* the other three take effect at once (a flush wait in progress ends early).

A file edited into an invalid state (a bad value, a file that does not parse) is reported: it is
logged at ERROR with the setting, where it came from and what is allowed, and kept in
`last_error` (and ``store.stats().config_error``); the settings in force stay the last good
ones. A change that cannot be applied now (turning the cache on when its file cannot be opened)
is reported the same way and retried every `retry_interval` seconds until it applies or the
file changes again.

The folder of the file is watched, not the file itself, so an editor that saves by writing a new
file and renaming it over the old one is seen too.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from watchfiles import awatch

from localstate._core.config import Settings
from localstate.errors import ConfigError, LocalStateError, StoreClosed

__all__ = ["ConfigWatcher", "Reconfigurable"]

log = logging.getLogger("localstate.reload")


class Reconfigurable(Protocol):
    """What a watcher needs of a store (`StateStore` is one)."""

    @property
    def settings(self) -> Settings: ...
    async def reconfigure(self, settings: Settings) -> tuple[str, ...]: ...


class ConfigWatcher:
    """Watches one airflow.cfg and applies its live settings to `store`."""

    def __init__(
        self,
        store: Reconfigurable,
        path: str | Path,
        *,
        environ: Mapping[str, str] | None = None,
        retry_interval: float = 5.0,
    ) -> None:
        self.store = store
        self.path = Path(os.path.abspath(path))
        self.retry_interval = retry_interval
        self._environ = environ
        # the store's own arguments keep winning over the file, as they did when it opened
        s = store.settings
        self._explicit: dict[str, Any] = {
            name: getattr(s, name) for name, source in s.sources.items() if source == "argument"
        }
        #: why the last change was not applied (None: it was)
        self.last_error: str | None = None
        #: changes of the file handled so far (applied, refused or found to change nothing)
        self.reloads = 0
        #: reloads that changed a live setting of the store
        self.applied = 0
        self._pending: Settings | None = None  # resolved but not applied yet: retried
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._handled = asyncio.Condition()

    async def start(self) -> None:
        """Start watching; returns once the watch is in place (no edit after it is missed)."""
        if self._task is not None:
            return
        folder = self.path.parent
        if not folder.is_dir():
            raise ConfigError(f"cannot watch {self.path} for live reload: the folder {folder} "
                              "does not exist; create it or turn watch_config off")
        armed = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(
            self._run(armed), name="localstate-config-watcher")
        armed_wait = asyncio.ensure_future(armed.wait())
        await asyncio.wait({self._task, armed_wait}, return_when=asyncio.FIRST_COMPLETED)
        armed_wait.cancel()
        if self._task.done():  # it failed before it could watch: say why
            task, self._task = self._task, None
            task.result()
        # the file may have changed between the store reading it and the watch starting
        await self.reload()

    async def stop(self) -> None:
        """Stop watching (waits for a change being applied). Safe twice."""
        task, self._task = self._task, None
        if task is None:
            return
        self._stop.set()
        # a watch that failed was reported by _run: closing the store must not fail on it
        with contextlib.suppress(Exception):
            await task

    async def _run(self, armed: asyncio.Event) -> None:
        name = self.path.name
        changes = awatch(
            self.path.parent,
            watch_filter=lambda _change, changed: _is(changed, name),
            stop_event=self._stop,
            step=50,
            rust_timeout=max(1, int(self.retry_interval * 1000)),
            yield_on_timeout=True,
            recursive=False,
        )
        # awatch puts its watch in place in the first step of its first __anext__, before it
        # first awaits; a callback scheduled now runs after that step, so `armed` says the
        # watch is live.
        asyncio.get_running_loop().call_soon(armed.set)
        try:
            async for batch in changes:
                if batch or self._pending is not None:  # a change, or a retry of one pending
                    await self.reload()
        except Exception as exc:  # the folder went away, the watch limit was reached, ...
            self._report(f"stopped watching {self.path} ({type(exc).__name__}: {exc}); "
                         "changes to it apply at the next start", traceback=True)
            raise

    async def reload(self) -> tuple[str, ...]:
        """Read the file now and apply it; return the live settings that changed.

        Never raises for a bad file or a change that cannot be applied: that is logged and
        kept in `last_error`, and the settings in force stay as they were.
        """
        changed: tuple[str, ...] = ()
        try:
            settings = Settings.resolve(self._explicit, environ=self._environ,
                                        config_file=self.path)
        except ConfigError as exc:
            self._pending = None
            self._report(f"{exc}; the settings in force stay the last good ones")
        else:
            try:
                changed = await self.store.reconfigure(settings)
            except StoreClosed:
                self._pending = None
            except Exception as exc:  # the watcher outlives any one failed reload
                self._pending = settings
                self._report(f"could not apply {self.path}: {exc}; the settings in force stay "
                             f"as they were, retrying every {self.retry_interval:g} s",
                             traceback=not isinstance(exc, LocalStateError))
            else:
                self._pending = None
                if self.last_error is not None:
                    log.info("%s is valid again and applied", self.path)
                self.last_error = None
                self.applied += bool(changed)
        self.reloads += 1
        async with self._handled:
            self._handled.notify_all()
        return changed

    async def wait_for_reload(self, after: int, timeout: float) -> int:
        """Wait until more than `after` reloads were handled; return how many now."""
        async with self._handled:
            await asyncio.wait_for(self._handled.wait_for(lambda: self.reloads > after),
                                   timeout)
        return self.reloads

    def _report(self, message: str, *, traceback: bool = False) -> None:
        self.last_error = message
        log.error("live reload: %s", message, exc_info=traceback)


def _is(changed: str, name: str) -> bool:
    return os.path.basename(changed) == name
