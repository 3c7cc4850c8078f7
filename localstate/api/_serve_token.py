"""The token `localstate serve` generates when no ``api_tokens`` are configured.

Secure by default, as Jupyter is: a server started with no tokens still needs one. It is made
once with `secrets.token_urlsafe` (256 bits), kept in ``$AIRFLOW_HOME/localstate/api-token``
with mode 0600 (created that way, never readable by others for a moment), reused at the next
start, and printed once, inside the URL the server logs. Only an explicit ``api_open`` serves
with no token at all, and only on loopback.
"""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path
from typing import Final

from localstate._core.config import Settings
from localstate._core.setting_specs import ApiToken
from localstate.errors import ConfigError

__all__ = ["TOKEN_FILE_NAME", "serve_token", "token_file"]

TOKEN_FILE_NAME: Final = "api-token"
_TOKEN_BYTES: Final = 32


def token_file(settings: Settings) -> Path:
    return settings.home / "localstate" / TOKEN_FILE_NAME


def serve_token(settings: Settings) -> ApiToken:
    """The generated token: read from its file, or made and written there (mode 0600)."""
    path = token_file(settings)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            secret = _read(path)
        else:
            secret = secrets.token_urlsafe(_TOKEN_BYTES)
            with os.fdopen(fd, "w") as f:
                f.write(secret + "\n")
                f.flush()
                os.fsync(f.fileno())
    except OSError as exc:
        raise ConfigError(
            f"cannot keep the API token in {path} ({exc.strerror}); make that folder writable, "
            "or configure api_tokens"
        ) from None
    return ApiToken(secret=secret, role="read-write", owners=("",), name="generated token")


def _read(path: Path) -> str:
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        raise ConfigError(
            f"the API token file {path} is readable by other users (mode {mode:04o}); "
            f"`chmod 600 {path}`, or delete it to have a new token made"
        )
    secret = path.read_text().strip()
    if len(secret) < 16:
        raise ConfigError(f"the API token file {path} holds no usable token; delete it to "
                          "have a new one made")
    return secret
