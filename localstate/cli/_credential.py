"""credential: a triggerer's own API credential, derived from a per_triggerer key.

``localstate credential --key-file KEY`` prints (or, with ``--out``, writes with mode 0600)
the credential of this process's triggerer_id (its resolved setting: the host name, a
StatefulSet pod's name) under the key in KEY's first line, as the API server's
``per_triggerer`` entry of ``api_tokens`` verifies it (`localstate._core.triggerer_credential`).
In Kubernetes an init container runs it with the key mounted in that container only; the
triggerer reads the file through ``AIRFLOW__LOCALSTATE__API_TOKEN_CMD``.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from localstate._core.config import Settings
from localstate._core.setting_specs import MIN_TOKEN_LENGTH
from localstate._core.triggerer_credential import derive
from localstate.errors import ConfigError

__all__ = ["cmd_credential"]


def _key(path: Path) -> str:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read the per_triggerer key from {path} ({exc}); mount the "
                          "Secret that holds it there, or pass --key-file") from None
    key = next((line.strip() for line in lines if line.strip()), "")
    if len(key) < MIN_TOKEN_LENGTH:
        raise ConfigError(f"the key in {path} is {len(key)} characters long; a per_triggerer "
                          f"key has at least {MIN_TOKEN_LENGTH} (python -c 'import secrets; "
                          "print(secrets.token_urlsafe(32))')")
    return key


def _write_private(path: Path, text: str) -> None:
    """`text` into `path`, mode 0600 from its creation, replacing it whole."""
    part = path.with_name(f".{path.name}.{os.getpid()}.part")
    try:
        fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="ascii") as f:
            f.write(text)
        os.replace(part, path)
    except OSError as exc:
        part.unlink(missing_ok=True)
        raise ConfigError(f"cannot write the credential to {path} ({exc.strerror}); make "
                          "its folder writable by this user") from None


def cmd_credential(args: argparse.Namespace) -> int:
    triggerer_id = args.triggerer_id or Settings.resolve().resolved_triggerer_id
    try:
        credential = derive(_key(args.key_file), triggerer_id)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if args.out is None:
        print(credential)
    else:
        _write_private(args.out, credential + "\n")
    return 0
