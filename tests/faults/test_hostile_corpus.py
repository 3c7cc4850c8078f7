"""A hostile-input corpus against a real `localstate serve` process: 2,000 generated requests
per write route, each with at least one field no valid request holds (out-of-range numbers,
names too long or with control characters, wrong types, broken JSON values, versions at the
ceiling). Every answer is a typed 4xx with no internals in its body, the tables stay empty,
and the health route, polled all along, answers within 1 s each time.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from api_server import RW_TOKEN, ServeProcess

from localstate._core.rows import DirtyRow
from localstate._sync.central.central_store import CentralStore
from localstate._sync.central.fleet import FleetStatus

CASES_PER_ROUTE = 2000
OWNER = "hostile:o"
#: values no name field may hold
BAD_NAMES: list[Any] = ["", "a\nb", "a\x00b", "x" * 251, "\r", 5, None, ["a"], {"a": 1},
                        True, 1.5, "tab\there", "\x7f"]
#: values no version, epoch, pid or time may hold
BAD_INTS: list[Any] = [2**63, 2**63 - 1, -5, -1, 10**30, 10**400, 1e300, -1e15, "1", True,
                       None, [1], {"v": 1}, 1.5e19]
BAD_TIMES: list[Any] = [1e300, -1e15, -1, 10**30, 10**400, "now", True, [1], 3e11]
BAD_DATA: list[Any] = ["not json", "{", 5, [1], "99999999999999999999999", "NaN",
                       '{"a": Infinity}', "x" * 70_000, True]
FIELDS = ["owner", "key", "data", "version", "base_version", "updated_at", "updated_by", "epoch"]
FLEET_FIELDS = ["triggerer", "host", "pid", "flushed_at", "dirty_keys", "oldest_unflushed",
                "rows_per_s", "flush_interval"]


def _bad(field: str, rng: random.Random) -> Any:
    if field in ("owner", "key", "updated_by", "claimant", "writer", "triggerer", "host"):
        return rng.choice(BAD_NAMES)
    if field in ("updated_at", "flushed_at", "oldest_unflushed"):
        return rng.choice(BAD_TIMES)
    if field == "data":
        return rng.choice(BAD_DATA)
    if field == "op":
        return rng.choice(["drop", "", None, 1, "DIRECT"])
    if field == "base_version":  # -1 is valid there: "based on an unknown version"
        return rng.choice([v for v in BAD_INTS if v != -1])
    return rng.choice(BAD_INTS)


def _spoil(body: dict[str, Any], fields: list[str], rng: random.Random) -> dict[str, Any]:
    """`body` with 1 to 3 of `fields` made hostile (None for a required field: dropped)."""
    out = dict(body)
    for f in rng.sample(fields, rng.randint(1, min(3, len(fields)))):
        out[f] = _bad(f, rng)
    return out


def _flush(rng: random.Random) -> dict[str, Any]:
    row = dict(zip(FIELDS, [OWNER, f"k{rng.randint(0, 9)}", "1", 1, 0, time.time(), "t", 0],
                   strict=True))
    fleet = dict(zip(FLEET_FIELDS, ["t", "h", 1, time.time(), 0, None, 0.0, 1.0],
                     strict=True))
    spoiled_fleet = rng.random() < 0.3
    if spoiled_fleet:
        fleet = _spoil(fleet, [f for f in FLEET_FIELDS if f != "oldest_unflushed"], rng)
    else:
        row = _spoil(row, FIELDS, rng)
        if (row["data"] is None and row["owner"] == OWNER and isinstance(row["key"], str)
                and row["key"].startswith("k")):
            row["version"] = 2**63  # a deletion is valid data: spoil another field too
    return {"fields": {"DirtyRow": FIELDS}, "rows": [[row[f] for f in FIELDS]], "writer": "w",
            "policies": "reject", "fleet_fields": {"FleetStatus": FLEET_FIELDS},
            "fleet": [fleet[f] for f in FLEET_FIELDS]}


def _write(rng: random.Random) -> dict[str, Any]:
    body = {"op": "direct", "owner": OWNER, "key": "k", "data": "1", "updated_at": time.time(),
            "updated_by": "t"}
    if rng.random() < 0.3:
        body = {**body, "op": "if_version", "expected_version": 0}
        return _spoil(body, ["owner", "key", "expected_version", "updated_by", "op"], rng)
    out = _spoil(body, ["owner", "key", "data", "updated_at", "updated_by", "op"], rng)
    if out.get("data", 0) is None and out["op"] == "direct":
        out["updated_at"] = 1e300
    return out


def _claim(rng: random.Random) -> dict[str, Any]:
    out = _spoil({"owner": OWNER, "claimant": "t", "writer": "w"},
                 ["owner", "claimant", "writer"], rng)
    if out["writer"] is None:  # no writer is a valid claim: spoil it otherwise
        out["writer"] = "w" * 65
    return out


def _put(rng: random.Random) -> tuple[str, dict[str, Any]]:
    owner = rng.choice([*[n for n in BAD_NAMES if isinstance(n, str) and n], OWNER])
    key = rng.choice(["k", "\n", "x" * 300]) if owner == OWNER else "k"
    if owner == OWNER and key == "k":
        return (f"/api/v1/state/{quote(owner, safe='')}/k",
                {"value": 1, "expected_version": rng.choice([2**63, -1, "a", 1.5, 2**63 - 1])})
    return f"/api/v1/state/{quote(owner, safe='')}/{quote(key, safe='')}", {"value": 1}


def _requests(route: str, rng: random.Random) -> Iterator[tuple[str, str, bytes]]:
    for _ in range(CASES_PER_ROUTE):
        if route == "put":
            url, body = _put(rng)
            yield "PUT", url, _dumps(body)
        elif route == "delete":
            url, _body = _put(rng)
            version = rng.choice([2**63, -1, 0, "a", 10**30])
            yield "DELETE", f"{url}?expected_version={version}", b""
        else:
            make = {"flush": _flush, "write": _write, "claim": _claim}[route]
            yield "POST", f"/api/v1/{route}", _dumps(make(rng))


def _dumps(body: Any) -> bytes:
    """JSON with integers of any size (what a hostile client can send)."""
    import json

    return json.dumps(body, allow_nan=False).encode("utf-8", "surrogatepass")


@pytest.fixture
def backend() -> str:
    """A real serve process on PostgreSQL: the central DB the limits matter most for."""
    return "postgresql"


@pytest.mark.parametrize("route", ["flush", "write", "claim", "put", "delete"])
async def test_a_hostile_corpus_gets_typed_4xx_and_changes_nothing(
        central_url: str, route: str) -> None:
    server = ServeProcess(central_url)
    server.start()
    try:
        rng = random.Random(f"corpus-{route}")
        cases = list(_requests(route, rng))
        assert len(cases) == CASES_PER_ROUTE
        assert [f for f in FIELDS if f not in DirtyRow._fields] == []
        assert [f for f in FLEET_FIELDS if f not in FleetStatus._fields] == []
        statuses: dict[int, int] = {}
        slowest_health = 0.0
        done = asyncio.Event()
        headers = {"Authorization": f"Bearer {RW_TOKEN}", "Content-Type": "application/json"}
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client, \
                httpx.AsyncClient(base_url=server.url, timeout=5) as prober:

            async def probe() -> None:
                nonlocal slowest_health
                while not done.is_set():
                    start = time.monotonic()
                    r = await prober.get("/api/v1/health")
                    assert r.status_code == 200
                    slowest_health = max(slowest_health, time.monotonic() - start)
                    await asyncio.sleep(0.05)

            async def send(batch: list[tuple[str, str, bytes]]) -> None:
                for method, url, content in batch:
                    r = await client.request(method, url, content=content or None,
                                             headers=headers)
                    statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
                    assert 400 <= r.status_code < 500, (method, url, content[:2000], r.text)
                    body = r.json()
                    assert isinstance(body.get("error"), str), r.text
                    low = r.text.lower()
                    for leak in ("postgresql", "select ", "insert ", "traceback", "asyncpg",
                                 "/tmp/", "sqlalchemy"):
                        assert leak not in low, (leak, r.text)

            prober_task = asyncio.create_task(probe())
            try:
                await asyncio.gather(*(send(cases[i::8]) for i in range(8)))
            finally:
                done.set()
                await prober_task
            # control: the templates unspoiled are accepted, so each 4xx above came from
            # its hostile field (then they are removed again: the tables are checked empty)
            r = await client.post("/api/v1/flush", headers=headers, content=_dumps({
                "fields": {"DirtyRow": FIELDS}, "writer": "w",
                "rows": [["control:o", "k", "1", 1, 0, time.time(), "t", 0]],
                "fleet_fields": {"FleetStatus": FLEET_FIELDS},
                "fleet": ["t", "h", 1, time.time(), 0, None, 0.0, 1.0]}))
            assert r.status_code == 200, r.text
        async with CentralStore.open(central_url) as central:
            assert len(await central.read_owner("control:o")) == 1
            assert await central.read_owner(OWNER) == []
            # the control's triggerer (and the server's own, if it flushed): no hostile one
            assert {f.triggerer for f in await central.read_fleet()} - {server.store_id} == {"t"}
            assert await central.read_claims([OWNER]) == {}
        print(f"{route}: {CASES_PER_ROUTE} cases, statuses {sorted(statuses.items())}, "
              f"slowest health {slowest_health * 1000:.0f} ms")
        assert slowest_health < 1.0
    finally:
        server.stop()
