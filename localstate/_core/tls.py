"""TLS verification of the API clients: the system's certificate authorities, or a CA bundle.

Every client of the localstate API (the API sink of ``sink = api``, `StateClient`,
`AsyncStateClient`, the CLI, `LocalStateHook`) verifies an ``https://`` server's certificate
and host name; no setting turns that off. With ``api_ca_bundle`` (a connection's
``ca_bundle`` extra) it trusts the authorities in that PEM file instead of the system's:
the private CA that signed the API server's certificate inside a cluster.
"""

from __future__ import annotations

import ssl
from pathlib import Path

from localstate.errors import ConfigError

__all__ = ["verification", "verification_hint"]


def verification(ca_bundle: str | Path | None, setting: str = "api_ca_bundle"
                 ) -> ssl.SSLContext | bool:
    """What httpx's ``verify`` takes: True (the default authorities) without a bundle, else
    a context trusting the bundle's (`ConfigError` naming `setting` when it cannot be read)."""
    if ca_bundle is None or str(ca_bundle) == "":
        return True
    try:
        return ssl.create_default_context(cafile=str(ca_bundle))
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"{setting} {str(ca_bundle)!r} is not a readable PEM file of CA "
                          f"certificates ({exc}); point it at the CA bundle that signed the "
                          "API server's certificate") from None


def verification_hint(exc: BaseException) -> str:
    """What to do, when a connection failed because the server's certificate was not
    verified ("" otherwise): for the message that names the failure."""
    if "CERTIFICATE_VERIFY_FAILED" not in str(exc):
        return ""
    return ("; its TLS certificate could not be verified: set api_ca_bundle (a connection's "
            "ca_bundle extra) to the PEM file of the CA that signed it, and use a host name "
            "the certificate names")
