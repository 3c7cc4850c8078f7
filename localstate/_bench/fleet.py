"""The fleet benchmark: ``localstate bench --fleet N --triggers K [--budget R]``.

N triggerer processes (`localstate._bench.fleet_member`) with K triggers each, against one
PostgreSQL. Each trigger claims its owner and sets its watermark every ``set_interval`` s.

1. *steady*: everyone runs for ``warmup`` s (a budget settles), then ``window`` s are measured:
   the central transactions and rows per second, compared with `model`;
2. *moves*, as Airflow makes them: one triggerer is stopped (SIGSTOP); after ``threshold`` s
   (Airflow's ``triggerer_health_check_threshold``) the others claim its triggers; then it is
   woken (SIGCONT): a zombie, whose triggers write on until their flush is refused and they
   stop on `OwnerLost`. Then another triggerer is killed (SIGKILL) and, after the threshold,
   its triggers are claimed by the one left.

The figures come from the database itself: a history table that triggers on the state and
claim tables fill (every write with its transaction id and time, every claim), installed for
the run and removed after it. ``regressions``: watermarks that went backwards in that history;
``zombie_writes_accepted``: writes the DB took from a triggerer after another had claimed the
owner; ``duplicate_window_ms``: the longest time a zombie's trigger ran on after the claim that
took its owner (until its store refused it).
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
from sqlalchemy.engine import make_url

from localstate._sync.central.central_store import CentralStore
from localstate.errors import ConfigError

__all__ = ["FleetConfig", "model", "run_fleet"]

_HISTORY = "localstate_bench_history"
_INSTALL = f"""
CREATE TABLE IF NOT EXISTS {_HISTORY} (
    id bigserial PRIMARY KEY, kind text NOT NULL, owner text NOT NULL, value text,
    who text NOT NULL, epoch bigint, txid bigint NOT NULL, at timestamptz NOT NULL);
CREATE OR REPLACE FUNCTION {_HISTORY}_write() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO {_HISTORY} (kind, owner, value, who, txid, at) VALUES
        ('w', NEW.owner, NEW.value, NEW.updated_by, txid_current(), clock_timestamp());
    RETURN NEW;
END $$;
CREATE OR REPLACE FUNCTION {_HISTORY}_claim() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO {_HISTORY} (kind, owner, who, epoch, txid, at) VALUES
        ('c', NEW.owner, NEW.claimant, NEW.epoch, txid_current(), clock_timestamp());
    RETURN NEW;
END $$;
DROP TRIGGER IF EXISTS {_HISTORY}_write ON localstate_state;
CREATE TRIGGER {_HISTORY}_write AFTER INSERT OR UPDATE ON localstate_state
    FOR EACH ROW EXECUTE FUNCTION {_HISTORY}_write();
DROP TRIGGER IF EXISTS {_HISTORY}_claim ON localstate_owner_claim;
CREATE TRIGGER {_HISTORY}_claim AFTER INSERT OR UPDATE ON localstate_owner_claim
    FOR EACH ROW EXECUTE FUNCTION {_HISTORY}_claim();
"""
_REMOVE = f"""
DROP TRIGGER IF EXISTS {_HISTORY}_write ON localstate_state;
DROP TRIGGER IF EXISTS {_HISTORY}_claim ON localstate_owner_claim;
DROP FUNCTION IF EXISTS {_HISTORY}_write();
DROP FUNCTION IF EXISTS {_HISTORY}_claim();
DROP TABLE IF EXISTS {_HISTORY};
"""


@dataclass
class FleetConfig:
    central_url: str
    triggerers: int = 3
    triggers: int = 300
    budget: float | None = None
    flush_interval: float = 1.0
    #: seconds between two sets of one trigger
    set_interval: float = 0.5
    warmup: float = 8.0
    window: float = 8.0
    threshold: float = 1.5
    folder: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="ls-fleet-")))


def model(n: int, k: int, flush_interval: float, set_rate: float, *,
          budget: float | None = None, flush_s: float = 0.0) -> dict[str, float]:
    """The central load the README's model predicts (see "Fleet benchmark" there).

    Each of the n triggerers flushes once per period P = interval + flush time, in one
    transaction (k <= max_batch); each of its k triggers' watermark is one row of it if it was
    set since the last flush: a fraction min(1, set_rate * P) of them for periodic sets. A
    budget R stretches the interval until the rows/s are R.
    """
    interval = flush_interval
    rows = n * k * min(1.0, set_rate * (interval + flush_s)) / (interval + flush_s)
    if budget is not None and rows > budget:
        # rows/s = n k / P once every key is dirty at each flush: P = n k / R
        interval = max(flush_interval, n * k / budget - flush_s)
        rows = n * k * min(1.0, set_rate * (interval + flush_s)) / (interval + flush_s)
    return {"central_rows_per_s": rows, "central_txns_per_s": n / (interval + flush_s),
            "flush_interval_s": interval}


class _Member:
    def __init__(self, name: str, proc: asyncio.subprocess.Process) -> None:
        self.name = name
        self.proc = proc
        self.lines: asyncio.Queue[str] = asyncio.Queue()
        self.lost: dict[str, float] = {}
        self.stats: dict[str, Any] | None = None
        self.owners: list[str] = []
        #: POSIX time it was woken from SIGSTOP (a zombie's triggers run from then on)
        self.woken_at = 0.0

    async def read(self) -> None:
        assert self.proc.stdout is not None
        while line := await self.proc.stdout.readline():
            text = line.decode().rstrip("\n")
            kind, _, rest = text.partition(" ")
            if kind == "LOST":
                owner, at = rest.rsplit(" ", 1)
                self.lost[owner] = float(at)
            elif kind == "STATS":
                self.stats = json.loads(rest)
            else:
                await self.lines.put(text)

    def send(self, **command: Any) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(command).encode() + b"\n")

    async def own(self, owners: list[str]) -> None:
        self.owners += owners
        self.send(own=owners)
        answer = await asyncio.wait_for(self.lines.get(), 300)
        assert answer.startswith("OWNED"), answer


async def _start(cfg: FleetConfig, name: str) -> tuple[_Member, asyncio.Task[None]]:
    options = {"central_url": cfg.central_url, "cache_path": str(cfg.folder / f"{name}.db"),
               "triggerer_id": name, "flush_interval": cfg.flush_interval,
               "budget": cfg.budget, "set_interval": cfg.set_interval}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "localstate._bench.fleet_member", json.dumps(options),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
    m = _Member(name, proc)
    task = asyncio.create_task(m.read())
    ready = await asyncio.wait_for(m.lines.get(), 120)
    assert ready == "READY", ready
    return m, task


def _dsn(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


async def _load(conn: asyncpg.Connection, prefix: str, since: float, until: float
                ) -> tuple[int, int]:
    """(write transactions, rows written) of this run's owners between two POSIX times."""
    row = await conn.fetchrow(
        f"SELECT count(DISTINCT txid), count(*) FROM {_HISTORY} WHERE kind = 'w' "
        "AND starts_with(owner, $1) AND at >= to_timestamp($2) AND at < to_timestamp($3)",
        prefix, since, until)
    assert row is not None
    return int(row[0]), int(row[1])


async def _verdicts(conn: asyncpg.Connection, prefix: str) -> dict[str, Any]:
    rows = await conn.fetch(
        f"SELECT kind, owner, value, who, extract(epoch FROM at) FROM {_HISTORY} "
        "WHERE starts_with(owner, $1) ORDER BY id", prefix)
    holder: dict[str, str] = {}
    last: dict[str, int] = {}
    claims: dict[str, list[tuple[float, str]]] = {}
    regressions = accepted = 0
    for kind, owner, value, who, at in rows:
        if kind == "c":
            holder[owner] = who
            claims.setdefault(owner, []).append((float(at), who))
            continue
        if owner in holder and who != holder[owner]:
            accepted += 1
        if value is not None:
            v = int(json.loads(value))
            if v < last.get(owner, v):
                regressions += 1
            last[owner] = v
    return {"regressions": regressions, "zombie_writes_accepted": accepted, "claims": claims}


def _duplicate_window(claims: dict[str, list[tuple[float, str]]], members: list[_Member]
                      ) -> float | None:
    """The longest a zombie's trigger ran on after another triggerer claimed its owner."""
    windows = []
    for m in members:
        for owner, at in m.lost.items():
            taken = [t for t, who in claims.get(owner, []) if who != m.name and t <= at]
            if taken:  # it ran from the claim, or from its waking if it was stopped then
                windows.append(at - max(max(taken), m.woken_at))
    return max(windows, default=None)


async def run_fleet(cfg: FleetConfig) -> dict[str, Any]:
    """Run the benchmark; the result row (``scenario = "fleet"``)."""
    if make_url(cfg.central_url).get_backend_name() != "postgresql":
        raise ConfigError("bench --fleet runs against PostgreSQL: pass --central-url "
                          "postgresql://...")
    await (await CentralStore.open(cfg.central_url)).close()  # the schema, migrated
    prefix = f"fleet:{uuid.uuid4().hex[:8]}:"
    conn = await asyncpg.connect(_dsn(cfg.central_url))
    members: list[tuple[_Member, asyncio.Task[None]]] = []
    try:
        await conn.execute(_INSTALL)
        members = list(await asyncio.gather(*(
            _start(cfg, f"fleet-{i}") for i in range(cfg.triggerers))))
        ms = [m for m, _ in members]
        owners = [f"{prefix}{i:05d}" for i in range(cfg.triggerers * cfg.triggers)]
        await asyncio.gather(*(m.own(owners[i * cfg.triggers:(i + 1) * cfg.triggers])
                               for i, m in enumerate(ms)))
        await asyncio.sleep(cfg.warmup)
        start = time.time()
        await asyncio.sleep(cfg.window)
        end = time.time()
        handovers, handover_s = await _moves(cfg, ms)
        await asyncio.sleep(2 * cfg.flush_interval + 1.0)
        for m in ms:
            if m.proc.returncode is None:
                m.send(quit=True)
        for m, task in members:
            await asyncio.wait_for(m.proc.wait(), 120)
            await task
        txns, rows = await _load(conn, prefix, start, end)
        verdict = await _verdicts(conn, prefix)
    finally:
        for m, _task in members:
            if m.proc.returncode is None:
                m.proc.send_signal(signal.SIGCONT)
                m.proc.kill()
                await m.proc.wait()
        await conn.execute(_REMOVE)
        await conn.close()
    seconds = end - start
    stats = [m.stats for m, _ in members if m.stats is not None]
    lags = [s["lag_p99_s"] for s in stats if s["lag_p99_s"] is not None]
    window = _duplicate_window(verdict["claims"], [m for m, _ in members])
    predicted = model(cfg.triggerers, cfg.triggers, cfg.flush_interval, 1 / cfg.set_interval,
                      budget=cfg.budget)
    return {
        "scenario": "fleet", "triggerers": cfg.triggerers, "triggers": cfg.triggers,
        "flush_interval": cfg.flush_interval, "set_rate_per_trigger": 1 / cfg.set_interval,
        "seconds": seconds,
        "central_txns_per_s": txns / seconds, "central_rows_per_s": rows / seconds,
        "model_txns_per_s": predicted["central_txns_per_s"],
        "model_rows_per_s": predicted["central_rows_per_s"],
        "model_flush_interval_s": predicted["flush_interval_s"],
        "flush_interval_s": max((s["flush_interval_s"] for s in stats), default=None),
        "budget_rows_per_s": cfg.budget,
        "lag_p99_ms": None if not lags else 1000 * max(lags),
        "handovers": handovers,
        "handover_claims_s": handover_s,
        "regressions": verdict["regressions"],
        "zombie_writes_accepted": verdict["zombie_writes_accepted"],
        "zombie_writes_refused": sum(s["zombie_writes_refused"] for s in stats),
        "zombie_triggers_stopped": sum(len(m.lost) for m, _ in members),
        "duplicate_window_ms": None if window is None else 1000 * window,
    }


async def _moves(cfg: FleetConfig, ms: list[_Member]) -> tuple[int, float]:
    """Stop one triggerer and hand its triggers over (it wakes a zombie); kill another and
    hand its triggers over. Returns the triggers moved and the seconds the first handover's
    claims took."""
    moved = 0
    if len(ms) < 2:
        return moved, 0.0
    zombie, rest = ms[0], ms[1:]
    zombie.proc.send_signal(signal.SIGSTOP)
    await asyncio.sleep(cfg.threshold)
    started = time.monotonic()
    handover = asyncio.create_task(_hand_over(zombie.owners, rest))
    # A claim waits for a flush the zombie left open (stopped inside its transaction): it
    # wakes after a threshold whether the claims are done or not, as a paused process does.
    await asyncio.wait([handover], timeout=cfg.threshold)
    zombie.woken_at = time.time()
    zombie.proc.send_signal(signal.SIGCONT)  # its triggers write on until refused
    await handover
    took = time.monotonic() - started
    moved += len(zombie.owners)
    await asyncio.sleep(cfg.threshold)
    if len(rest) >= 2:
        dead, rest = rest[0], rest[1:]
        dead.proc.kill()
        await dead.proc.wait()
        await asyncio.sleep(cfg.threshold)
        await _hand_over(dead.owners, rest)
        moved += len(dead.owners)
    return moved, took


async def _hand_over(owners: list[str], to: list[_Member]) -> None:
    share = [owners[i::len(to)] for i in range(len(to))]
    await asyncio.gather(*(m.own(part) for m, part in zip(to, share, strict=True) if part))
