"""Per-triggerer credentials: a bearer token derived from one key and a triggerer's id.

A fleet of triggerers (a StatefulSet's pods) needs one credential per triggerer, bound to its
``triggerer_id``, without an operator making a token per pod. An entry of the API server's
``api_tokens`` with ``"per_triggerer": true`` holds a key instead of a token; the credential of
triggerer ``T`` under that key is

    lst1.<T>.<base64url(HMAC-SHA256(key, "localstate triggerer credential\\0" + T))>

(`derive`; ``localstate credential`` prints or writes it). The API server takes it as a token
bound to the identity ``T`` with the entry's role and owners, so the rows, claims and fleet
report it sends are recorded as ``T`` whatever the request names: holding ``T``'s credential
lets a process act as ``T`` only, and the key itself is never a bearer token. Only a process
that holds the key can make a credential, so the key goes to the API server and to whatever
makes each triggerer's credential before it starts (an init container), never to the
triggerer's own process.

Rotation: the API server accepts credentials under every ``per_triggerer`` entry, so a new
key is added beside the old one, the triggerers restarted with credentials of the new key,
then the old entry removed (docs: Hardening).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
from typing import Final

__all__ = ["PREFIX", "credential_triggerer", "derive"]

#: what every credential starts with (the scheme's version)
PREFIX: Final = "lst1."
_CONTEXT: Final = b"localstate triggerer credential\0"
#: a triggerer id, as the triggerer_id setting takes it (it names a cache file)
_TRIGGERER_ID: Final = re.compile(r"[A-Za-z0-9_.:@-]{1,200}")
_MAC: Final = re.compile(r"[A-Za-z0-9_-]{43}")


def derive(key: str, triggerer_id: str) -> str:
    """The credential of `triggerer_id` under `key`."""
    if not _TRIGGERER_ID.fullmatch(triggerer_id) or triggerer_id in {".", ".."}:
        raise ValueError(f"triggerer id {triggerer_id!r}: expected 1 to 200 of A-Z a-z 0-9 "
                         "_ . : @ - (the triggerer_id setting's form)")
    mac = hmac.new(key.encode("utf-8"), _CONTEXT + triggerer_id.encode("ascii"),
                   hashlib.sha256).digest()
    return f"{PREFIX}{triggerer_id}.{base64.urlsafe_b64encode(mac).decode().rstrip('=')}"


def credential_triggerer(credential: str) -> str | None:
    """The triggerer id a credential of this form names (not yet verified), or None when
    `credential` is not of this form."""
    if not credential.startswith(PREFIX):
        return None
    triggerer_id, dot, mac = credential[len(PREFIX):].rpartition(".")
    if not dot or not _MAC.fullmatch(mac) or not _TRIGGERER_ID.fullmatch(triggerer_id):
        return None
    return triggerer_id
