"""The HTTP protocol's paths and error table (`localstate._core.protocol`), both directions: an
error the server answers with comes back at a client as the same typed error, with its details; the
server's own failures keep their text out of the answer. (The wire codecs of the batched sink
endpoints are tested through the sink: tests/integration/test_api_sink.py.)"""

from __future__ import annotations

import httpx
import pytest

from localstate._core.protocol import STATE_PATH, answer_for, error_for, item_path
from localstate.errors import (
    AccessDenied,
    CacheCorrupt,
    CentralError,
    CentralUnavailable,
    InvalidInput,
    InvalidName,
    LocalStateError,
    StoreClosed,
    ValueEncodingError,
    ValueTooLarge,
    VersionConflict,
    VersionExhausted,
    WriteRejected,
)


def _answer(exc: LocalStateError) -> httpx.Response:
    """The response the server sends for `exc` (the body the API's error handler writes)."""
    answer = answer_for(exc)
    message = answer.public if answer.public is not None else str(exc)
    return httpx.Response(answer.status,
                          json={"error": answer.code, "message": message,
                                "detail": answer.detail},
                          request=httpx.Request("PUT", "http://api/api/v1/state/o/k"))


@pytest.mark.parametrize("exc", [
    VersionConflict("stale", expected=3, actual=5),
    VersionExhausted("at the ceiling", owner="dag:a", key="k"),
    WriteRejected("lost"),
    ValueTooLarge("big", size=2_000_000, limit=1_048_576),
    InvalidName("bad name"),
    ValueEncodingError("not JSON"),
    InvalidInput("bad input"),
], ids=lambda e: type(e).__name__)
def test_a_callers_error_comes_back_as_its_own_type(exc: LocalStateError) -> None:
    back = error_for(_answer(exc))
    assert type(back) is type(exc)
    assert str(exc) in str(back)
    assert "(PUT /api/v1/state/o/k: " in str(back)
    if isinstance(exc, VersionConflict):
        assert isinstance(back, VersionConflict)
        assert (back.expected, back.actual) == (3, 5)
    if isinstance(exc, VersionExhausted):
        assert isinstance(back, VersionExhausted)
        assert (back.owner, back.key) == ("dag:a", "k")
    if isinstance(exc, ValueTooLarge):
        assert isinstance(back, ValueTooLarge)
        assert (back.size, back.limit) == (2_000_000, 1_048_576)


@pytest.mark.parametrize(("exc", "status", "back_type"), [
    (CentralUnavailable("postgresql://secret@db refused"), 503, CentralUnavailable),
    (CentralError("SQL: syntax error near secret"), 502, CentralError),
    (StoreClosed("closed secret"), 503, CentralUnavailable),
    (CacheCorrupt("/var/lib/secret.db is not a database", path="/var/lib/secret.db"), 503,
     CentralUnavailable),
    (LocalStateError("anything else, secret"), 500, CentralError),
], ids=lambda v: v.__name__ if isinstance(v, type) else str(v)[:12])
def test_a_server_failure_keeps_its_text_out_of_the_answer(
        exc: LocalStateError, status: int, back_type: type[LocalStateError]) -> None:
    answer = answer_for(exc)
    assert answer.status == status
    assert answer.public is not None
    assert "secret" not in answer.public
    assert answer.retry_after is (status == 503)
    back = error_for(_answer(exc))
    assert type(back) is back_type
    assert "secret" not in str(back)


def test_access_and_unknown_answers() -> None:
    request = httpx.Request("GET", "http://api/api/v1/state/o/k")
    for status in (401, 403):
        back = error_for(httpx.Response(status, json={"error": "forbidden", "message": "no"},
                                        request=request))
        assert isinstance(back, AccessDenied)
        assert back.status == status
    back = error_for(httpx.Response(418, text="not json", request=request))
    assert type(back) is LocalStateError
    assert "I'm a teapot (GET /api/v1/state/o/k: 418)" in str(back)


def test_an_item_path_is_one_encoded_segment_per_name() -> None:
    assert item_path("dag:etl/load", "a/b") == f"{STATE_PATH}dag%3Aetl%2Fload/a%2Fb"
    assert item_path("..", "k.v") == f"{STATE_PATH}%2E%2E/k%2Ev"
    with pytest.raises(InvalidName):
        item_path("", "k")
