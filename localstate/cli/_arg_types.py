"""Argument types for the command's parser: each turns one option's text into its value, or
raises `argparse.ArgumentTypeError` with a message saying what was expected (exit 2)."""

from __future__ import annotations

import argparse

__all__ = ["bench_modes", "count", "non_negative", "port_number", "positive_count",
           "trigger_counts", "version_number"]


def trigger_counts(text: str) -> list[int]:
    try:
        values = [int(part.replace("_", "")) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers separated by commas, not {text!r}"
                                         ) from None
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError("trigger counts must be whole numbers above 0")
    return values


def bench_modes(text: str) -> list[str]:
    # imported here: the bench package is only needed when `bench --modes` is given
    from localstate._bench.baselines import PEER_MODES
    from localstate._bench.runner import STORE_MODES

    allowed = ("bare", *STORE_MODES, *PEER_MODES)
    modes = [m.strip() for m in text.split(",") if m.strip()]
    bad = [m for m in modes if m not in allowed]
    if bad or not modes:
        raise argparse.ArgumentTypeError(
            f"unknown mode(s) {bad}; choose from {', '.join(allowed)}"
        )
    return modes


def non_negative(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, not {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError("expected a number >= 0")
    return value


def positive_rate(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, not {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError("expected a number above 0")
    return value


def version_number(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a version number, not {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError("a version is 0 or more")
    return value


def count(text: str) -> int:
    try:
        value = int(text.replace("_", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, not {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError("expected a whole number, 0 or more")
    return value


def positive_count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, not {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError("expected a number above 0")
    return value


def port_number(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 0 < value < 65536:
        raise argparse.ArgumentTypeError(f"expected a port from 1 to 65535, not {text!r}")
    return value
