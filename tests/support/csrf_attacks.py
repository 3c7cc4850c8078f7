"""Cross-site request forgery, as a browser can send it: every unsafe route of the REST API
with a body its own page would send, and each way a page on another origin (or a form) can
send a request with the login cookie. The in-process tests and Airflow's API server end to
end both try every pair."""

from __future__ import annotations

from typing import Any

from api_paths import path

from localstate.api._csrf import CSRF_HEADER

BASE = "http://localstate.test"
OWNER = "dag:csrf"
#: every unsafe route, with a body its own page (or a client) would send
ROUTES: list[tuple[str, str, dict[str, Any] | None]] = [
    ("PUT", path(OWNER, "wm"), {"value": 1}),
    ("DELETE", path(OWNER, "wm"), None),
    ("POST", "/api/v1/flush", {"fields": ["owner"], "rows": []}),
    ("POST", "/api/v1/write", {"op": "direct", "owner": OWNER, "key": "wm",
                               "data": "1", "updated_at": 1.0, "updated_by": "evil"}),
    ("POST", "/api/v1/claim", {"owner": OWNER, "claimant": "evil"}),
    ("POST", "/api/v1/release", {"owner": OWNER, "claimant": "evil", "epoch": 1}),
    ("POST", "/api/v1/read", {"owner": OWNER}),
    ("PATCH", path(OWNER, "wm"), {"value": 1}),
]
ROUTE_IDS = [f"{m} {p.rsplit('/', 2)[-2] if 'state' in p else p}" for m, p, _ in ROUTES]
COOKIE = {"Cookie": "_token=eyJhbGciOiJIUzUxMiJ9.logged-in.sig"}
JSON = {"Content-Type": "application/json"}
PROOF = {CSRF_HEADER: "1"}

#: (id, headers, body as sent): what a page on another origin, or a form, can send
ATTACKS: list[tuple[str, dict[str, str], str]] = [
    ("cookie-only-no-proof", {**COOKIE, **JSON}, "json"),
    ("cross-site-origin", {**COOKIE, **JSON, **PROOF, "Origin": "https://evil.example"}, "json"),
    ("sibling-origin-port", {**COOKIE, **JSON, **PROOF, "Origin": "http://localstate.test:8081"},
     "json"),
    ("sibling-origin-host", {**COOKIE, **JSON, **PROOF,
                             "Origin": "http://other.localstate.test"}, "json"),
    ("null-origin", {**COOKIE, **JSON, **PROOF, "Origin": "null"}, "json"),
    ("cross-site-referer", {**COOKIE, **JSON, **PROOF,
                            "Referer": "https://evil.example/page.html"}, "json"),
    ("own-origin-no-proof", {**COOKIE, **JSON, "Origin": BASE}, "json"),
    ("form-text-plain", {**COOKIE, **PROOF, "Origin": BASE, "Content-Type": "text/plain"},
     "json"),
    ("form-urlencoded", {**COOKIE, **PROOF, "Origin": BASE,
                         "Content-Type": "application/x-www-form-urlencoded"}, "form"),
    ("form-multipart", {**COOKIE, **PROOF, "Origin": BASE,
                        "Content-Type": "multipart/form-data; boundary=x"}, "json"),
    ("no-cors-fetch-cross-site", {**COOKIE, "Origin": "https://evil.example",
                                  "Content-Type": "text/plain;charset=UTF-8"}, "json"),
    ("open-api-cross-site-no-cookie", {**JSON, "Origin": "https://evil.example"}, "json"),
]


def attack_body(body: dict[str, Any] | None, form: str) -> bytes | None:
    if body is None:
        return None
    import orjson

    if form == "form":
        return b"a=" + orjson.dumps(body)
    return orjson.dumps(body)
