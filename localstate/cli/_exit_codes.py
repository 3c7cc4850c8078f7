"""The `localstate` command's exit codes, and the error that ends in "not found"."""

from __future__ import annotations

from localstate.errors import LocalStateError

__all__ = ["EXIT_CONFLICT", "EXIT_ERROR", "EXIT_NOT_FOUND", "EXIT_USAGE", "NotFound"]

EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_NOT_FOUND = 3
EXIT_CONFLICT = 4


class NotFound(LocalStateError):
    """The state variable asked for has no value (exit 3)."""
