"""How many of the project's source files one server-side flush runs through.

The real app serves one real flush of a ``sink = api`` triggerer (the request `ApiSink` sends:
dirty rows at a claim epoch, an emitted event, the fleet report) against a real central DB on
every backend. `sys.setprofile` records the project files (under ``localstate/`` and the
top-level ``sync/``) whose Python functions run while the route handler handles that one
request, from its entry to its response, across the greenlets SQLAlchemy runs its core in. A
flush reads as one handler calling the central store: those files stay within `MAX_FILES`.
The files the request runs before the handler (the middlewares, the caller's token, the
server's context) are printed beside them.

The count sees only the request's own work: the garbage collector, which runs finalizers of
any object of the process (an earlier test's store, say) inside whatever frame allocates when
it triggers, is run before the window and kept off during it.
"""

from __future__ import annotations

import gc
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import CodeType, FrameType
from typing import Any, Final

import greenlet  # type: ignore[import-untyped]
import httpx
import orjson
from api_server import RW_TOKEN, TOKENS

from localstate import Settings
from localstate._core.conflicts import PolicyMap
from localstate._core.rows import DirtyRow, EventRow
from localstate._sync.central.central_store import CentralStore
from localstate._sync.central.fleet import FleetStatus
from localstate._sync.sinks.api_sink import ApiSink
from localstate.api import create_app

#: the most project files one server-side flush may run through: 10, and since then two
#: concepts of their own joined the path: the history rows written in the flush's transaction
#: (`sync/central/history.py`) and the decoding of a large body in slices
#: (`localstate/_core/body_slices.py`); `sync/central/engine.py` runs too now (each PostgreSQL
#: transaction sets its own bounds, for poolers)
MAX_FILES: Final = 12
_ROOT: Final = Path(__file__).resolve().parents[2]
_SOURCES: Final = (_ROOT / "localstate", _ROOT / "sync")


def _project_file(filename: str) -> str | None:
    """`filename` relative to the repository when it is one of the project's sources."""
    path = Path(filename).resolve()
    if path.suffix != ".py" or not any(path.is_relative_to(s) for s in _SOURCES):
        return None
    return path.relative_to(_ROOT).as_posix()


def _runs_under(frame: FrameType | None, root: FrameType) -> bool:
    """Whether `root` is among the callers of `frame`, across the greenlets SQLAlchemy's
    asyncio layer runs its synchronous core in (a greenlet's callers go on in its parent)."""
    here = greenlet.getcurrent()
    while True:
        while frame is not None:
            if frame is root:
                return True
            frame = frame.f_back
        if here.parent is None:
            return False
        here = here.parent
        frame = here.gr_frame


@contextmanager
def files_run(request: set[str], handler: set[str], endpoint: CodeType) -> Iterator[None]:
    """Record the project files whose functions are called (or resumed) in this thread under
    the caller's frame (the ASGI call) in `request`, and those under the route handler's
    frame (a call of `endpoint`'s code, from its entry to its return) in `handler`. A
    coroutine of the client's that the event loop resumes meanwhile runs under neither."""
    seen: dict[str, str | None] = {}
    root = sys._getframe(2)  # the caller's, under the contextmanager's own
    entered: list[FrameType] = []

    def profile(frame: FrameType, event: str, _arg: Any) -> None:
        if event != "call":
            return
        if not entered and frame.f_code is endpoint:
            entered.append(frame)
        name = frame.f_code.co_filename
        if name not in seen:
            seen[name] = _project_file(name)
        found = seen[name]
        if found is None or not _runs_under(frame, root):
            return
        request.add(found)
        if entered and _runs_under(frame, entered[0]):
            handler.add(found)

    # Other objects' finalizers run wherever a collection triggers: collect now, and not
    # again until the window closes, so that what is recorded is the request's own work.
    collecting = gc.isenabled()
    gc.collect()
    gc.disable()
    previous = sys.getprofile()
    sys.setprofile(profile)
    try:
        yield
    finally:
        sys.setprofile(previous)
        if collecting:
            gc.enable()


class Profiled:
    """The app, with the files the handling of each ``/flush`` request runs recorded."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.request: set[str] = set()
        self.handler: set[str] = set()
        self.flushes = 0

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not str(scope["path"]).endswith("/flush"):
            await self.app(scope, receive, send)
            return
        self.flushes += 1
        endpoint = next(r.endpoint for r in self.app.routes
                        if getattr(r, "path", None) == "/api/v1/flush")
        with files_run(self.request, self.handler, endpoint.__code__):
            await self.app(scope, receive, send)


async def _one_profiled_flush(central_url: str, tmp_path: Path) -> Profiled:
    """One real ``sink = api`` flush served by the real app, profiled (`Profiled`)."""
    settings = Settings.resolve({"central_url": central_url, "api_tokens": TOKENS,
                                 "cache_path": str(tmp_path / "server.db")})
    async with CentralStore.open(central_url) as central:
        app = create_app(settings, central=central)
        profiled = Profiled(app)
        sink = ApiSink("http://localstate.test", RW_TOKEN,
                       transport=httpx.ASGITransport(app=profiled))
        try:
            async with app.router.lifespan_context(app):
                epoch = await sink.claim("trigger:t", claimant="triggerer-a")
                now = time.time()
                rows = [DirtyRow("trigger:t", f"k{i}", orjson.dumps({"n": i}).decode(), 1, 0,
                                 now, "triggerer-a", epoch) for i in range(5)]
                events = [EventRow(1, "trigger:t", "e1", orjson.dumps({"n": 1}).decode(), now,
                                   epoch)]
                sink.note_fleet(FleetStatus("triggerer-a", "host-a", 1234, now, 5, now, 2.0,
                                            5.0))
                outcomes, statuses = await sink.write_with_events(
                    rows, events, PolicyMap("reject"), writer="cache-a")
        finally:
            await sink.close()
        assert [o.resolution for o in outcomes] == ["written"] * 5
        assert statuses == ["committed"]
        committed = await central.read_many([("trigger:t", f"k{i}") for i in range(5)])
        assert {k: r.data for (_o, k), r in committed.items()} == {
            f"k{i}": orjson.dumps({"n": i}).decode() for i in range(5)}
        # the server, not the request, says who wrote: the token's name
        assert {r.updated_by for r in committed.values()} == {"token 1"}
        assert [r.triggerer for r in await central.read_fleet()] == ["triggerer-a"]
    assert profiled.flushes == 1
    return profiled


async def test_a_server_side_flush_runs_through_at_most_ten_files(
        central_url: str, tmp_path: Path) -> None:
    profiled = await _one_profiled_flush(central_url, tmp_path)
    files = sorted(profiled.handler)
    middle = sorted(profiled.request - profiled.handler)
    print(f"\none server-side flush: {len(files)} project files from the route handler's entry "
          "to its response:", *files, f"and {len(middle)} more before it (middlewares, the "
          f"caller's token): {middle}", sep="\n  ")
    assert {"localstate/api/_sink_routes.py", "sync/central/central_store.py",
            "sync/central/fenced_write.py"} <= set(files)
    assert len(files) <= MAX_FILES, (
        f"one server-side flush runs through {len(files)} project files (at most "
        f"{MAX_FILES}):\n  " + "\n  ".join(files))


async def test_no_collection_runs_inside_the_window(central_url: str, tmp_path: Path) -> None:
    """With the collector due at every allocation (threshold 1) around one profiled flush, no
    collection starts while the window is open: a collection runs finalizers of any object
    of the process (on a loaded machine an earlier test's store was counted so, its
    `__del__` run inside the handler), and it runs before the window instead."""
    during: list[int] = []

    def on_collection(phase: str, info: dict[str, int]) -> None:
        if phase == "start" and sys.getprofile() is not None:  # the window's profile is on
            during.append(info["generation"])

    thresholds = gc.get_threshold()
    gc.callbacks.append(on_collection)
    gc.set_threshold(1, 1_000_000, 1_000_000)
    try:
        profiled = await _one_profiled_flush(central_url, tmp_path)
    finally:
        gc.set_threshold(*thresholds)
        gc.callbacks.remove(on_collection)
    assert profiled.flushes == 1
    assert during == []
