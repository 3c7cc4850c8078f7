"""flush: the backlog of cache files no live process holds (a stopped triggerer's writes not
yet in the central DB). A cache in use is skipped, since its triggerer flushes it itself."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from pathlib import Path
from typing import Any

from localstate._core.config import Settings
from localstate.cli._cache_files import cache_files, cache_folder, cache_summary
from localstate.cli._central import settings_for
from localstate.cli._exit_codes import EXIT_ERROR
from localstate.cli._printing import print_json
from localstate.errors import CacheLocked

__all__ = ["cmd_flush"]


async def _flush_one(path: Path, settings: Settings, dirty: int, progress: bool
                     ) -> dict[str, Any]:
    from localstate._bench.progress import Progress
    from localstate._store import StateStore

    batch = settings.max_batch
    total = max(1, -(-dirty // batch))
    bar = Progress(total, label=f"flush {path.name}", enabled=progress)
    try:
        store = await StateStore.open(settings=settings.replace(
            cache_path=str(path), triggerer_id=path.stem, flush_interval=3600.0))
    except CacheLocked:
        return {"path": str(path), "skipped": "in use by a live process, which flushes it"}
    try:
        start = store.stats().central_transactions

        async def watch() -> None:
            seen = 0
            while True:
                done = store.stats().central_transactions - start
                while seen < min(done, total):
                    seen += 1
                    bar.step(f"{store.stats().dirty_keys} rows left")
                await asyncio.sleep(0.1)

        watcher = asyncio.get_running_loop().create_task(watch())
        try:
            report = await store.flush()
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
        while bar.done < total:
            bar.step("done")
        stats = store.stats()
    finally:
        await store.close()
    return {"path": str(path), "flushed": stats.central_rows, "conflicts": report.conflicts,
            "still_dirty": stats.dirty_keys}


def cmd_flush(args: argparse.Namespace) -> int:
    settings = settings_for(args)
    paths = [Path(p) for p in args.cache] if args.cache else cache_files(settings)
    results: list[dict[str, Any]] = []

    async def go() -> None:
        for path in paths:
            if not path.is_file():
                results.append({"path": str(path), "error": "no such file"})
                continue
            summary = cache_summary(path)
            if "error" in summary:
                results.append({"path": str(path), "error": summary["error"]})
            elif not summary["dirty"]:
                results.append({"path": str(path), "flushed": 0, "conflicts": 0,
                                "still_dirty": 0})
            else:
                results.append(await _flush_one(path, settings, summary["dirty"],
                                                not args.no_progress and not args.json))

    asyncio.run(go())
    failed = [r for r in results if "error" in r]
    if args.json:
        print_json(results)
    elif not results:
        print(f"no cache files in {cache_folder(settings)}: nothing to flush")
    else:
        for r in results:
            name = Path(r["path"]).name
            if "error" in r:
                print(f"{name}: {r['error']}")
            elif "skipped" in r:
                print(f"{name}: skipped, {r['skipped']}")
            else:
                print(f"{name}: flushed {r['flushed']} rows, {r['conflicts']} conflicts, "
                      f"{r['still_dirty']} still unflushed")
    return EXIT_ERROR if failed else 0
