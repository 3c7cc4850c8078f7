"""A request sent by hand over a socket, for the tests of when a server answers an oversized
body: before the client has sent all of it."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator


async def answer_while_sending(port: int, head: bytes, parts: Iterator[bytes]) -> bytes:
    """Send `head`, then `parts` one by one, reading between them: the server's answer as
    soon as it comes, while the request's body is not yet all sent (parts left over)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(head)
        for part in parts:
            writer.write(part)
            await writer.drain()
            try:
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 0.5)
            except TimeoutError:
                continue
            length = re.search(rb"(?i)content-length: *(\d+)", head)
            assert length is not None, head
            return head + await reader.readexactly(int(length.group(1)))
        raise AssertionError("every part was sent before the server answered")
    finally:
        writer.close()
