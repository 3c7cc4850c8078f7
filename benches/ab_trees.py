"""Hot path of two source trees, measured alternately in one run: A, B, B, A, A, B, ...

    python benches/ab_trees.py OLD_TREE NEW_TREE [--rounds 5] [--seconds 0.5]

Each tree is first copied into the layout it installs as (``localstate/`` with the top-level
``sync/`` as ``localstate/sync/``; a tree of an earlier layout, with a symlink there, is copied
through it), so that each run imports that tree's code only, whatever the venv's editable
install points at. Each round runs one fresh subprocess per tree (``PYTHONPATH=<copy>``), which
measures the
memory-durability set, the cached get and the local set against the bare limit (an ``await`` of
a coroutine that sets a dict) in that same process; only those ratios are compared, since the
machines are shared and noisy. Prints the median ratio per tree and figure, their quotient, and
the median and range of the rounds' own new/old quotients (paired: each round's two runs are
neighbours in time).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

_INNER = r"""
import asyncio, json, sys, tempfile, time
from pathlib import Path
from localstate import StateStore

async def throughput(op, writers, seconds):
    counts = [0] * writers
    deadline = time.perf_counter() + seconds
    async def loop(w):
        n = 0
        while time.perf_counter() < deadline:
            for _ in range(64):
                await op(w, n)
                n += 1
            await asyncio.sleep(0)
        counts[w] = n
    started = time.perf_counter()
    await asyncio.gather(*(loop(w) for w in range(writers)))
    return sum(counts) / (time.perf_counter() - started)

async def main(seconds):
    bare = {}
    async def bare_set(w, n):
        bare[f"o{w}", "wm"] = n
    async def bare_get(w, n):
        return bare.get((f"o{w}", "wm"))
    owners = [f"trigger:bench:{w}" for w in range(1000)]
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        async with StateStore(cache_path=f"{tmp}/c.db", central_url=f"sqlite:///{tmp}/x.db",
                              triggerer_id="ab", flush_interval=1.0) as store:
            for writers in (1, 1000):
                for o in owners[:writers]:
                    await store.set(o, "wm", 0)
                b = await throughput(bare_set, writers, seconds)
                async def mset(w, n):
                    await store.set(owners[w], "wm", n, durability="memory")
                out[f"memory set x{writers}"] = await throughput(mset, writers, seconds) / b
                bg = await throughput(bare_get, writers, seconds)
                async def cget(w, n):
                    return await store.get(owners[w], "wm")
                out[f"cached get x{writers}"] = await throughput(cget, writers, seconds) / bg
            b = await throughput(bare_set, 1000, seconds)
            async def lset(w, n):
                await store.set(owners[w], "wm", n, durability="local")
            out["local set x1000"] = await throughput(lset, 1000, seconds) / b
    print(json.dumps(out))

asyncio.run(main(float(sys.argv[1])))
"""


def installed_layout(tree: Path, into: Path) -> Path:
    """A copy of the tree's package as it installs: `into`/localstate, with sync/ inside."""
    package = into / "localstate"
    shutil.copytree(tree / "localstate", package)  # follows a symlinked localstate/sync
    if not (package / "sync").exists():
        shutil.copytree(tree / "sync", package / "sync")
    return into


def measure(tree: Path, seconds: float) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    proc = subprocess.run([sys.executable, "-c", _INNER, str(seconds)], env=env, cwd=tree,
                          capture_output=True, text=True, check=True)
    result: dict[str, float] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("old", type=Path)
    parser.add_argument("new", type=Path)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=0.5)
    args = parser.parse_args()
    runs: dict[str, list[dict[str, float]]] = {"old": [], "new": []}
    staging = Path(tempfile.mkdtemp(prefix="ab-trees-"))
    trees = {which: installed_layout(tree.resolve(), staging / which)
             for which, tree in (("old", args.old), ("new", args.new))}
    for i in range(args.rounds):
        # the order alternates too: old first in even rounds, new first in odd ones
        for which in ("old", "new") if i % 2 == 0 else ("new", "old"):
            runs[which].append(measure(trees[which], args.seconds))
    names = list(runs["old"][0])
    print(f"{'figure (x bare)':<20} {'old':>8} {'new':>8} {'new/old':>8}  "
          f"{'paired new/old: median (min-max)':>34}")
    for name in names:
        old = statistics.median(r[name] for r in runs["old"])
        new = statistics.median(r[name] for r in runs["new"])
        # each round's new over the same round's old: the two ran one after the other, so
        # a slow spell of the machine weighs on both
        paired = [n[name] / o[name] for o, n in zip(runs["old"], runs["new"], strict=True)]
        spread = f"{statistics.median(paired):.3f} ({min(paired):.2f}-{max(paired):.2f})"
        print(f"{name:<20} {old:>8.3f} {new:>8.3f} {new / old:>8.3f}  {spread:>34}")
    shutil.rmtree(staging)

if __name__ == "__main__":
    main()
