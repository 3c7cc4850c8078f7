"""The HTTP client against a real `localstate.api` server (uvicorn on a loopback port)."""

from __future__ import annotations

import asyncio
import logging
import math
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import uvicorn

from localstate import (
    AccessDenied,
    CentralUnavailable,
    FlushState,
    InvalidInput,
    InvalidName,
    LocalStateError,
    StateStore,
    ValueEncodingError,
    ValueTooLarge,
    VersionConflict,
)
from localstate.api import create_app
from localstate.client import AsyncStateClient, StateClient

RW = "rw-all-0123456789abcdef"
RO = "ro-all-0123456789abcdef"
RW_DAG = "rw-dag-0123456789abcdef"
TOKENS = f"{RW}:read-write:*, {RO}:read:*, {RW_DAG}:read-write:dag:"


@dataclass
class Server:
    url: str
    store: StateStore
    loop: asyncio.AbstractEventLoop

    def close_store(self) -> None:
        """Close the serving store on the server's loop (its writes then answer 503)."""
        asyncio.run_coroutine_threadsafe(self.store.close(), self.loop).result(timeout=30)


@pytest.fixture
def server(central_url: str, tmp_path: Path) -> Iterator[Server]:
    """`create_app` served by uvicorn on its own thread and loop, on 127.0.0.1:<free port>."""
    store = StateStore(central_url=central_url, cache_path=tmp_path / "api.db",
                       triggerer_id="api-server", max_value_bytes=1024, api_tokens=TOKENS)
    app = create_app(store.settings, local=store, manage_local=True)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)  # connections queue from now on: no wait for the server to be up
    config = uvicorn.Config(app, lifespan="on", log_level="warning", ws="none", loop="none")
    uv = uvicorn.Server(config)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_until_complete, args=(uv.serve([sock]),),
                              name="uvicorn-test")
    thread.start()
    try:
        yield Server(f"http://127.0.0.1:{sock.getsockname()[1]}", store, loop)
    finally:
        uv.should_exit = True
        thread.join(timeout=30)
        loop.close()
        sock.close()
    assert not thread.is_alive()


@pytest.fixture
def client(server: Server) -> Iterator[StateClient]:
    with StateClient(server.url, token=RW) as c:
        yield c


def test_set_get_record_delete_list(client: StateClient, server: Server) -> None:
    owner = "dag:etl/load"  # a '/' in the owner: one path segment all the same
    rec = client.set(owner, "cursor", {"offset": 10})
    assert (rec.owner, rec.key, rec.value, rec.version) == (owner, "cursor", {"offset": 10}, 1)
    assert rec.flush_state is FlushState.FLUSHED
    assert rec.central_version == 1  # central durability: held when set returns
    assert rec.updated_by == "token 1"  # the server records the caller: the token's name
    assert client.get(owner, "cursor") == {"offset": 10}
    assert client.get(owner, "absent", default="none") == "none"
    assert client.record(owner, "absent") is None
    for name in ("..", ".", "100% €", "a/b"):  # names that need encoding
        client.set(owner, name, name)
        assert client.get(owner, name) == name
    listed = list(client.list("dag:etl/", page_size=2))  # three pages
    assert [r.key for r in listed] == sorted(["cursor", "..", ".", "100% €", "a/b"])
    assert client.delete(owner, "cursor") is True
    assert client.delete(owner, "cursor") is False
    assert client.get(owner, "cursor") is None
    assert client.status()["triggerer_id"] == "api-server"


def test_conditional_writes(client: StateClient) -> None:
    assert client.set("dag:c", "k", 1, expected_version=0).version == 1  # only if absent
    with pytest.raises(VersionConflict) as info:
        client.set("dag:c", "k", 2, expected_version=0)
    assert (info.value.expected, info.value.actual) == (0, 1)
    assert client.set("dag:c", "k", 2, expected_version=1).version == 2
    with pytest.raises(VersionConflict):
        client.delete("dag:c", "k", expected_version=1)
    assert client.delete("dag:c", "k", expected_version=2) is True
    assert client.get("dag:c", "k") is None


#: (token, call, error raised, attributes it carries)
ERROR_CASES: list[tuple[str | None, Any, type[LocalStateError], dict[str, Any]]] = [
    (RW, lambda c: c.set("dag:x", "k", "v" * 2000), ValueTooLarge, {"limit": 1024}),
    (RW, lambda c: c.set("dag:x", "k", 1, expected_version=-1), InvalidInput, {}),
    (RW, lambda c: list(c.list("dag:\x01")), InvalidName, {}),
    (None, lambda c: c.get("dag:x", "k"), AccessDenied, {"status": 401}),
    ("wrong-0123456789abcdef", lambda c: c.get("dag:x", "k"), AccessDenied, {"status": 401}),
    (RO, lambda c: c.set("dag:x", "k", 1), AccessDenied, {"status": 403}),
    (RW_DAG, lambda c: c.get("asset_watcher:x", "k"), AccessDenied, {"status": 403}),
    # refused before anything is sent
    (RW, lambda c: c.set("dag:x", "k", math.nan), ValueEncodingError, {}),
    (RW, lambda c: c.get("", "k"), InvalidName, {}),
    (RW, lambda c: c.set("dag:x", "k", 1, expected_version="1"), InvalidInput, {}),
]


def test_http_errors_come_back_typed(server: Server) -> None:
    # one server for every case: starting one per case cost a second each
    for n, (token, call, error, attrs) in enumerate(ERROR_CASES):
        with StateClient(server.url, token=token) as c:
            with pytest.raises(error) as info:
                call(c)
            assert type(info.value) is error, f"case {n}: {info.value!r}"
            for name, value in attrs.items():
                assert getattr(info.value, name) == value, f"case {n}"
    with StateClient(server.url, token=RW) as c:
        assert c.get("dag:x", "k") is None  # nothing was written


class _Seen(logging.Handler):
    """Sets `event` when a record whose message contains `text` is logged."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text
        self.event = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if self.text in record.getMessage():
            self.event.set()


@pytest.mark.parametrize("backend", ["sqlite"])  # the HTTP layer's: one backend tells
@pytest.mark.parametrize("path", ["/api/v1/read", "/api/v1/flush"])
def test_a_client_gone_mid_body_is_no_server_error(
        server: Server, path: str, caplog: pytest.LogCaptureFixture) -> None:
    """A triggerer killed while its request's body is on the way: the server logs it at info
    (no traceback, no 500) and serves on; nothing was written."""
    seen = _Seen("closed the connection before its request body arrived")
    logging.getLogger("localstate.api.errors").addHandler(seen)
    try:
        with caplog.at_level(logging.INFO), socket.create_connection(
                ("127.0.0.1", int(server.url.rsplit(":", 1)[1])), timeout=10) as sock:
            sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {RW}"
                         "\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n"
                         "\r\n{\"rows\": [".encode())
            sock.shutdown(socket.SHUT_RDWR)
            assert seen.event.wait(timeout=30), "the server never saw the disconnect"
    finally:
        logging.getLogger("localstate.api.errors").removeHandler(seen)
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == [], [r.getMessage() for r in errors]
    with StateClient(server.url, token=RW) as c:
        assert c.get("dag:x", "k") is None
        c.set("dag:x", "k", 1)
        assert c.get("dag:x", "k") == 1


def test_503_when_the_server_store_is_closed(client: StateClient, server: Server) -> None:
    client.set("dag:u", "k", 1)
    server.close_store()
    with pytest.raises(CentralUnavailable, match="503"):
        client.set("dag:u", "k", 2)


def test_an_unreachable_server_and_a_wrong_url(server: Server) -> None:
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()  # nothing listens there now
    with StateClient(f"http://127.0.0.1:{port}", token=RW, timeout=5) as c, pytest.raises(
            CentralUnavailable, match="did not answer"):
        c.get("dag:x", "k")
    with StateClient(server.url + "/elsewhere", token=RW) as c, pytest.raises(
            LocalStateError, match="not a localstate API"):
        c.get("dag:x", "k")


async def test_the_async_client(server: Server) -> None:
    async with AsyncStateClient(server.url, token=RW) as c:
        rec = await c.set("asset_watcher:orders", "watermark", 41)
        assert rec.version == 1
        assert await c.get("asset_watcher:orders", "watermark") == 41
        assert await c.get("asset_watcher:orders", "nope", default=0) == 0
        got = await c.record("asset_watcher:orders", "watermark")
        assert got is not None
        assert got.value == 41
        with pytest.raises(VersionConflict):
            await c.set("asset_watcher:orders", "watermark", 42, expected_version=0)
        await asyncio.gather(*(c.set("asset_watcher:orders", f"k{i}", i) for i in range(10)))
        keys = [r.key async for r in c.list("asset_watcher:", page_size=4)]
        assert keys == sorted(["watermark", *(f"k{i}" for i in range(10))])
        assert await c.delete("asset_watcher:orders", "watermark") is True
        assert await c.delete("asset_watcher:orders", "watermark") is False
        assert (await c.status())["cache_enabled"] is True
    async with AsyncStateClient(server.url, token=RO) as ro:
        with pytest.raises(AccessDenied) as info:
            await ro.set("asset_watcher:orders", "watermark", 1)
        assert info.value.status == 403
