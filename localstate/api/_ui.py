"""The web UI: one static page (``static/index.html`` + ``app.js`` + ``style.css``) that calls
the API from the browser. No front-end build; no inline script, so the page is served with a
Content-Security-Policy that allows scripts from this origin only, and framing by this origin
only (Airflow's UI shows the page, mounted at /localstate/ by the plugin, in an iframe). The
page's URLs are relative, so it works at / and under a mount.
"""

from __future__ import annotations

from functools import cache
from importlib.resources import files

from fastapi import APIRouter
from fastapi.responses import Response

__all__ = ["build_ui_router"]

_CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; frame-ancestors 'self'; base-uri 'none'; form-action 'none'")
_TYPES = {"index.html": "text/html; charset=utf-8",
          "app.js": "text/javascript; charset=utf-8",
          "style.css": "text/css; charset=utf-8"}


@cache
def _asset(name: str) -> bytes:
    return files("localstate.api").joinpath("static").joinpath(name).read_bytes()


def _serve(name: str) -> Response:
    return Response(_asset(name), media_type=_TYPES[name], headers={
        "Content-Security-Policy": _CSP, "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer", "Cache-Control": "no-cache",
    })


def build_ui_router() -> APIRouter:
    router = APIRouter(include_in_schema=False)

    @router.get("/")
    async def index() -> Response:
        return _serve("index.html")

    @router.get("/ui/app.js")
    async def script() -> Response:
        return _serve("app.js")

    @router.get("/ui/style.css")
    async def style() -> Response:
        return _serve("style.css")

    return router
