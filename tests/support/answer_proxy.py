"""A reverse proxy between one triggerer and the API server that can lose a flush's answer.

`LostAnswerProxy` passes a triggerer's requests (``sink = api``: HTTP/1.1, keep-alive, bodies
with a ``Content-Length``) to the API server and its answers back, and keeps every flush's
event statuses (`answers`). Armed with `hold_next`, it passes the next flush whose answer
says events were committed to the server as usual, reads the server's whole answer (so the
flush's transaction has committed) and never sends it on: the triggerer waits for an answer
that will not come, its events committed centrally and still in its cache file's outbox.
What the test does then (kill the triggerer, restart it: the outbox is sent again, and the
server finds the events already committed) is the test's.

No fault point in localstate's code: the answer is lost where it travels, as a network or a
crash would lose it, at a moment the test chooses.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import re
from dataclasses import dataclass, field
from typing import Any

__all__ = ["FlushAnswer", "LostAnswerProxy"]

_LENGTH = re.compile(rb"(?im)^content-length:\s*(\d+)\s*$")
_CHUNKED = re.compile(rb"(?im)^transfer-encoding:\s*chunked\s*$")
_GZIP = re.compile(rb"(?im)^content-encoding:\s*gzip\s*$")


@dataclass(frozen=True)
class FlushAnswer:
    """One flush with events, as the proxy saw it go and come back."""

    #: (owner, key) of each event the flush carried, in order
    events: tuple[tuple[str, str], ...]
    #: the server's status of each (committed, duplicate, refused)
    statuses: tuple[str, ...]
    #: the answer was held back (`LostAnswerProxy.hold_next`): the triggerer never had it
    held: bool = False


@dataclass
class LostAnswerProxy:
    upstream_host: str
    upstream_port: int
    #: every flush with events and its answer, in the order the answers came
    answers: list[FlushAnswer] = field(default_factory=list)
    port: int = 0
    _server: asyncio.base_events.Server | None = None
    _armed: bool = False
    _held: asyncio.Event = field(default_factory=asyncio.Event)
    _answered: asyncio.Event = field(default_factory=asyncio.Event)
    _connections: set[asyncio.StreamWriter] = field(default_factory=set)

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = int(self._server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for w in list(self._connections):
            w.close()
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 5)

    def url(self, path: str) -> str:
        """The proxy's address of the API server's `path` (e.g. ``/localstate``)."""
        return f"http://127.0.0.1:{self.port}{path}"

    # -- what a test arms and waits for -------------------------------------------------------

    def hold_next(self) -> None:
        """Lose the answer of the next flush that commits events (see the module docstring)."""
        self._held.clear()
        self._armed = True

    def disarm(self) -> None:
        self._armed = False

    @property
    def held(self) -> FlushAnswer | None:
        """The flush whose answer was held, once one was."""
        return next((a for a in reversed(self.answers) if a.held), None)

    async def wait_held(self) -> FlushAnswer:
        await self._held.wait()
        held = self.held
        assert held is not None
        return held

    async def wait_sent_again(self, held: FlushAnswer) -> dict[tuple[str, str], str]:
        """Once every event of the `held` flush was sent again and answered (by the answers
        passed on after it): each one's status then."""
        wanted = set(held.events)
        while True:
            self._answered.clear()
            after = self.answers[self.answers.index(held) + 1:]
            got: dict[tuple[str, str], str] = {}
            for a in after:
                for e, status in zip(a.events, a.statuses, strict=True):
                    if e in wanted and not a.held:
                        got.setdefault(e, status)  # its first answer after the held one
            if set(got) == wanted:
                return got
            await self._answered.wait()

    # -- the proxy ----------------------------------------------------------------------------

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter
                     ) -> None:
        self._connections.add(client_w)
        upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        try:
            while True:
                try:
                    head = await client_r.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return  # the client closed its connection
                length = _LENGTH.search(head)
                assert not _CHUNKED.search(head), "a chunked request: not what sink = api sends"
                body = await client_r.readexactly(int(length.group(1))) if length else b""
                if upstream is None:
                    upstream = await asyncio.open_connection(self.upstream_host,
                                                             self.upstream_port)
                up_r, up_w = upstream
                up_w.write(head + body)
                await up_w.drain()
                answer_head, answer_body, raw = await _read_answer(up_r)
                if self._record(head, body, answer_head, answer_body):
                    # held: the triggerer never hears of it; wait until it goes away
                    with contextlib.suppress(ConnectionError):
                        await client_r.read()
                    return
                client_w.write(raw)
                await client_w.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            return  # the API server went away: the client's connection closes too
        finally:
            self._connections.discard(client_w)
            client_w.close()
            if upstream is not None:
                upstream[1].close()

    def _record(self, head: bytes, body: bytes, answer_head: bytes, answer_body: bytes
                ) -> bool:
        """Note a flush with events and its answer; whether to hold the answer back."""
        line = head.split(b"\r\n", 1)[0].split()
        if len(line) < 2 or line[0] != b"POST" or not line[1].endswith(b"/api/v1/flush"):
            return False
        if b" 200 " not in answer_head.split(b"\r\n", 1)[0] + b" ":
            return False
        if _GZIP.search(head):
            body = gzip.decompress(body)
        request: dict[str, Any] = json.loads(body)
        if not request.get("events"):
            return False
        fields = list(request["event_fields"]["EventRow"])  # `field_header(EventRow)`
        owner, key = fields.index("owner"), fields.index("key")
        events = tuple((e[owner], e[key]) for e in request["events"])
        if _GZIP.search(answer_head):  # the API server compresses larger answers
            answer_body = gzip.decompress(answer_body)
        statuses = tuple(json.loads(answer_body)["event_statuses"])
        hold = self._armed and "committed" in statuses
        if hold:
            self._armed = False
        self.answers.append(FlushAnswer(events, statuses, held=hold))
        if hold:
            self._held.set()
        self._answered.set()
        return hold


async def _read_answer(r: asyncio.StreamReader) -> tuple[bytes, bytes, bytes]:
    """One HTTP answer: its head, its body (de-chunked) and its bytes as they came."""
    head = await r.readuntil(b"\r\n\r\n")
    if _CHUNKED.search(head):
        raw, body = b"", b""
        while True:
            size_line = await r.readuntil(b"\r\n")
            size = int(size_line.split(b";")[0], 16)
            chunk = await r.readexactly(size + 2)
            raw += size_line + chunk
            body += chunk[:-2]
            if size == 0:
                return head, body, head + raw
    length = _LENGTH.search(head)
    body = await r.readexactly(int(length.group(1))) if length else b""
    return head, body, head + body
