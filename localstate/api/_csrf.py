"""`CsrfGuard`: no write from another site's page through a browser's ambient credentials.

Airflow's UI keeps its login (a JWT) in the ``_token`` cookie, which the browser attaches to
any request to the API server, whoever's page makes it; Airflow gives apps mounted in its API
server no protection against cross-site requests. A browser request is one that carries a
cookie, an ``Origin`` or a ``Referer``. An unsafe one (POST, PUT, PATCH, DELETE) without an
``Authorization: Bearer`` header is refused (403 ``csrf``) unless all three hold:

* its ``Origin`` (else its ``Referer``'s origin) is the server's own (the ``Host`` it was
  asked on) or one of the ``api_trusted_origins`` setting;
* it carries the header ``X-LocalState-Request`` (the page's script sends it; a form or a
  ``no-cors`` fetch cannot, and a cross-origin fetch needs a CORS preflight to);
* a request with a body (or any content type) says ``Content-Type: application/json`` (no
  "simple" content type a form can send).

Requests with a bearer header (triggerers, the CLI, `localstate.client`, scripts) are checked
by their token only: a browser never attaches that header on its own. A request with no cookie,
Origin or Referer is no browser's: the token check decides.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Receive, Scope, Send

from localstate.api._errors import error_response

__all__ = ["CSRF_HEADER", "UNSAFE_METHODS", "CsrfGuard", "origin_of"]

#: the header the page's own script sends with every write (any non-empty value)
CSRF_HEADER: Final = "X-LocalState-Request"
UNSAFE_METHODS: Final = frozenset({"POST", "PUT", "PATCH", "DELETE"})
_DEFAULT_PORTS: Final = {"http": 80, "https": 443}


def origin_of(url: str, default_scheme: str = "http") -> str | None:
    """``scheme://host:port`` of `url` (an Origin, a Referer or a bare ``host[:port]``), the
    port always written out; None when it names no host (``null``, garbage)."""
    text = url.strip()
    if text.lower() == "null":  # an opaque origin: a sandboxed frame, a file, a redirect
        return None
    if "://" not in text:
        text = f"{default_scheme}://{text}"
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    host = (parts.hostname or "").lower()
    if not host or scheme not in _DEFAULT_PORTS:
        return None
    if ":" in host:
        host = f"[{host}]"
    return f"{scheme}://{host}:{port or _DEFAULT_PORTS[scheme]}"


class CsrfGuard:
    """Refuse cross-site and cookie-only writes (see the module)."""

    def __init__(self, app: ASGIApp, trusted_origins: Iterable[str] = ()) -> None:
        self.app = app
        self.trusted = {o for o in (origin_of(t) for t in trusted_origins) if o}

    @staticmethod
    def _own(host: str | None) -> set[str]:
        """The server's own origin as the request names it: its Host under either scheme
        (a proxy that ends TLS makes the browser's https the server's http)."""
        if not host:
            return set()
        return {o for o in (origin_of(host, s) for s in ("http", "https")) if o}

    def refusal(self, scope: Scope) -> str | None:
        """Why this request is refused, or None when it may go on."""
        if scope["type"] != "http" or scope.get("method") not in UNSAFE_METHODS:
            return None
        headers: dict[str, str] = {}
        for name, value in scope.get("headers", ()):
            headers.setdefault(name.decode("latin-1").lower(), value.decode("latin-1"))
        auth = headers.get("authorization", "").strip()
        if auth.partition(" ")[0].lower() == "bearer":
            return None
        sent_origin = headers.get("origin")
        referer = headers.get("referer")
        if "cookie" not in headers and sent_origin is None and referer is None:
            return None  # no browser's request: the token check decides
        claimed = sent_origin if sent_origin is not None else referer
        if claimed is None:
            return ("a write from a browser must carry an Origin or Referer header; send "
                    "'Authorization: Bearer <token>' from scripts")
        origin = origin_of(claimed)
        if origin is None or origin not in (self.trusted | self._own(headers.get("host"))):
            return (f"a write from origin {claimed[:200]!r} is refused: only the server's own "
                    "pages (or the api_trusted_origins setting) may write with a login cookie")
        if not headers.get(CSRF_HEADER.lower(), "").strip():
            return (f"a write from a browser must carry the {CSRF_HEADER} header (the page's "
                    "script sends it); scripts send 'Authorization: Bearer <token>'")
        has_body = headers.get("content-length", "0").strip() not in ("", "0") or (
            "transfer-encoding" in headers)
        media = headers.get("content-type", "").split(";", 1)[0].strip().lower()
        if (has_body or media) and media != "application/json":
            return ("a write from a browser must send its body as 'Content-Type: "
                    f"application/json', not {media or 'no content type'!r}")
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        why = self.refusal(scope)
        if why is not None:
            await error_response(403, "csrf", why)(scope, receive, send)
            return
        await self.app(scope, receive, send)
