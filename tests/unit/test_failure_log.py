"""`FailureLog`: one WARNING when a retried operation starts failing, a summary at most once a
`summary_every`, one INFO when it recovers (an injected clock drives the time)."""

from __future__ import annotations

import logging

import pytest

from localstate._core.failure_log import FailureLog

LOGGER = "localstate.tests.failure_log"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def lines(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == level]


def test_a_failure_retried_every_second_for_150_s_logs_three_warnings_and_one_info(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    clock = Clock()
    fl = FailureLog(logging.getLogger(LOGGER), "flush to http://api", clock=clock)
    for _ in range(151):  # t = 0 .. 150
        fl.failed(ConnectionError("refused"), retry_in=1.0)
        clock.now += 1.0
    warnings = lines(caplog, logging.WARNING)
    # the start, then a summary at 60 s and at 120 s
    assert len(warnings) == 3
    assert warnings[0].startswith("flush to http://api failed, retrying in 1.00 s: refused")
    assert warnings[1] == ("flush to http://api still failing: 61 failures in 60 s, the last: "
                           "refused")
    assert "121 failures in 120 s" in warnings[2]
    assert len(lines(caplog, logging.DEBUG)) == 151 - 3
    fl.succeeded()
    assert lines(caplog, logging.INFO) == [
        "flush to http://api recovered after 151 failures in 151.0 s"]
    assert not fl.failing


def test_a_success_without_a_failure_logs_nothing_and_a_new_streak_warns_again(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    clock = Clock()
    fl = FailureLog(logging.getLogger(LOGGER), "read-through", summary_every=10.0, clock=clock)
    fl.succeeded()
    assert not caplog.records
    fl.failed("down")
    clock.now += 2.5
    fl.succeeded()
    fl.failed("down again")
    assert lines(caplog, logging.WARNING) == [
        "read-through failed: down (retried quietly; a summary every 10 s while it fails)",
        "read-through failed: down again (retried quietly; a summary every 10 s while it "
        "fails)"]
    assert lines(caplog, logging.INFO) == ["read-through recovered after 1 failures in 2.5 s"]
    assert fl.failures == 1


def test_summaries_are_spaced_by_the_interval_not_by_the_failures(
        caplog: pytest.LogCaptureFixture) -> None:
    """Failures far apart (a long backoff): each one past the interval is a summary, never
    more than one per interval."""
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    clock = Clock()
    fl = FailureLog(logging.getLogger(LOGGER), "claim", clock=clock)
    fl.failed("x")
    for step in (59.9, 0.2, 59.0, 1.0, 200.0):
        clock.now += step
        fl.failed("x")
    # start; 60.1 s: summary; 119.1 s: not yet (59 s since); 120.1 s: summary; 320.1: summary
    assert len(lines(caplog, logging.WARNING)) == 4
