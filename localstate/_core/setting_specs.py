"""Every setting's declaration: its parser, default, description and whether it is secret.

`SPECS` is the one list of settings (add a setting here, with its `Settings` field in
`localstate._core.config`, which resolves them); each parser takes a raw value (text from the
environment or airflow.cfg, or the native type from an argument) and returns the value or raises
`ValueError` saying what is allowed.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Final, Literal

from localstate._core.conflicts import ConflictPolicy
from localstate._core.model import DURABILITIES
from localstate._core.retention_rules import parse_age, parse_retention
from localstate.errors import InvalidInput

__all__ = [
    "API_ROLES",
    "DEFAULTS",
    "LIVE_SETTINGS",
    "MIN_TOKEN_LENGTH",
    "SETTING_NAMES",
    "SPECS",
    "ApiRole",
    "ApiToken",
    "Spec",
    "setting_specs",
]

ApiRole = Literal["read", "read-write"]
API_ROLES: Final[tuple[ApiRole, ...]] = ("read", "read-write")
#: shortest bearer token accepted: a guessable token is no protection
MIN_TOKEN_LENGTH: Final = 16
# printable ASCII without spaces: what an HTTP Authorization header can carry verbatim
_TOKEN_CHARS: Final = re.compile(r"[!-~]+")


@dataclass(frozen=True)
class ApiToken:
    """One bearer token of the REST API: its role and the owner prefixes it may touch.

    The secret is left out of `repr()`, so a logged `Settings` never shows it.
    """

    secret: str = field(repr=False)
    role: ApiRole
    #: owner prefixes this token may read (and write, for read-write); "" means every owner
    owners: tuple[str, ...]
    #: a label for messages ("token 2" unless the JSON form names it)
    name: str = ""
    #: who writes with this token: recorded as updated_by (and the claimant) of its writes
    #: whatever the request says; "" means the token's name
    identity: str = ""
    #: `secret` is a key, not a token: each triggerer presents the credential derived from it
    #: and its own triggerer_id (`localstate._core.triggerer_credential`), bound to that id
    per_triggerer: bool = False

    @property
    def can_write(self) -> bool:
        return self.role == "read-write"

    def allows(self, owner: str) -> bool:
        return any(owner.startswith(prefix) for prefix in self.owners)


# -- parsers: str (or the native type) -> value, raising ValueError with what is allowed -------


def _bool(raw: Any) -> bool:
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ValueError("expected true or false")


def _positive_float(raw: Any) -> float:
    try:
        value = float(raw)
    except (TypeError, ValueError):
        raise ValueError("expected a number of seconds greater than 0") from None
    if not value > 0 or value != value or value == float("inf"):
        raise ValueError("expected a number of seconds greater than 0")
    return value


def _optional_rate(raw: Any) -> float | None:
    """A rate per second greater than 0, or none (empty, ``none``, 0: no limit)."""
    if raw is None or (isinstance(raw, str) and raw.strip().lower() in ("", "none")):
        return None
    try:
        value = float(raw)
    except (TypeError, ValueError):
        raise ValueError("expected a number per second greater than 0, or none") from None
    if value == 0:
        return None
    if not value > 0 or value == float("inf"):
        raise ValueError("expected a number per second greater than 0, or none")
    return value


def _positive_int(raw: Any) -> int:
    if isinstance(raw, bool):
        raise ValueError("expected a whole number greater than 0")
    try:
        value = int(str(raw).strip()) if not isinstance(raw, int) else raw
    except ValueError:
        raise ValueError("expected a whole number greater than 0") from None
    if value <= 0:
        raise ValueError("expected a whole number greater than 0")
    return value


def _optional_positive_int(raw: Any) -> int | None:
    """A whole number greater than 0, or none (empty, ``none``): derived from other settings."""
    if raw is None or (isinstance(raw, str) and raw.strip().lower() in ("", "none")):
        return None
    try:
        return _positive_int(raw)
    except ValueError:
        raise ValueError("expected a whole number greater than 0, or none") from None


def _non_negative_float(raw: Any) -> float:
    try:
        value = float(raw if not isinstance(raw, str) else raw.strip())
    except (TypeError, ValueError):
        raise ValueError("expected a number of seconds, 0 or more") from None
    if isinstance(raw, bool) or not 0 <= value < float("inf"):
        raise ValueError("expected a number of seconds, 0 or more")
    return value


def _age(raw: Any) -> float:
    """An age: seconds (a number), or text such as 7d, 36h, 90m, 30s."""
    if isinstance(raw, bool):
        raise ValueError("expected an age: seconds, or 7d, 36h, 90m, 30s")
    try:
        seconds = float(raw) if isinstance(raw, (int, float)) else float(str(raw).strip())
    except ValueError:
        try:
            parsed = parse_age(str(raw), what="an age")
        except InvalidInput as exc:
            raise ValueError(str(exc)) from None
        if parsed is None:
            raise ValueError("expected an age such as 7d, not never") from None
        seconds = parsed
    if not 0 < seconds < float("inf"):
        raise ValueError("expected an age above zero: seconds, or 7d, 36h, 90m, 30s")
    return seconds


def _choice(*allowed: str) -> Callable[[Any], str]:
    def parse(raw: Any) -> str:
        text = str(raw).strip().lower()
        if text not in allowed:
            raise ValueError(f"expected one of {', '.join(allowed)}")
        return text

    return parse


def _optional_str(raw: Any) -> str | None:
    if raw is None:
        return None
    text = str(raw).strip()
    return text or None


_TRIGGERER_ID = re.compile(r"[A-Za-z0-9_.:@-]{1,200}")


def _triggerer_id(raw: Any) -> str | None:
    # It names the cache file (<cache_dir>/<id>.db) and stamps updated_by: a "/" or ".." would
    # put the file elsewhere, a control character would garble logs and the CLI's tables.
    text = _optional_str(raw)
    if text is None:
        return None
    if not _TRIGGERER_ID.fullmatch(text) or text in {".", ".."}:
        raise ValueError("expected 1 to 200 of A-Z a-z 0-9 _ . : @ - (it names the cache file)")
    return text


def _optional_path(raw: Any) -> Path | None:
    if raw is None or str(raw).strip() == "":
        return None
    return Path(str(raw)).expanduser()


def _policy_spec(raw: Any) -> str:
    text = str(raw).strip()
    ConflictPolicy.parse(text)  # raises ConfigError (a ValueError) naming what is allowed
    return text


def _conflict_policy(raw: Any) -> str | dict[str, str]:
    """A policy name, or owner-glob=policy pairs ("asset_watcher:*=max, *=reject")."""
    if isinstance(raw, Mapping):
        return {str(k): _policy_spec(v) for k, v in raw.items()}
    text = str(raw).strip()
    if "=" not in text:
        return _policy_spec(text)
    mapping: dict[str, str] = {}
    for part in text.split(","):
        if not part.strip():
            continue
        pattern, sep, policy = part.partition("=")
        if not sep or not pattern.strip():
            raise ValueError("expected owner-glob=policy pairs separated by commas")
        mapping[pattern.strip()] = _policy_spec(policy)
    return mapping


def _optional_host(raw: Any) -> str | None:
    text = _optional_str(raw)
    if text is not None and (any(c.isspace() for c in text) or "/" in text):
        raise ValueError("expected a host name or an IP address")
    return text


def _host(raw: Any) -> str:
    text = _optional_host(raw)
    if text is None:
        raise ValueError("expected a host name or an IP address")
    return text


def _port(raw: Any) -> int:
    if isinstance(raw, bool):
        raise ValueError("expected a port number from 1 to 65535")
    try:
        value = int(str(raw).strip()) if not isinstance(raw, int) else raw
    except ValueError:
        raise ValueError("expected a port number from 1 to 65535") from None
    if not 0 < value < 65536:
        raise ValueError("expected a port number from 1 to 65535")
    return value


def _metric_prefix(raw: Any) -> str:
    text = str(raw).strip().strip(".")
    if not text or not re.fullmatch(r"[A-Za-z0-9_.-]+", text):
        raise ValueError("expected letters, digits, '_', '-' and '.' (e.g. localstate)")
    return text


_TOKEN_FORMAT: Final = (
    "expected TOKEN:ROLE:PREFIX|PREFIX entries separated by commas (ROLE read or read-write, "
    "PREFIX an owner prefix or * for every owner), or a JSON list of "
    '{"token": ..., "role": ..., "owners": [...], "name": ...} objects'
)


def _http_url(raw: Any) -> str | None:
    text = _optional_str(raw)
    if text is not None and (not re.fullmatch(r"https?://[^\s/?#]+(/[^\s?#]*)?", text)):
        raise ValueError("expected an http:// or https:// URL without query "
                         "(e.g. http://127.0.0.1:8686)")
    return text


def _optional_token(raw: Any) -> str | None:
    text = _optional_str(raw)
    if text is not None and not _TOKEN_CHARS.fullmatch(text):
        raise ValueError("the token must be printable ASCII without spaces")
    return text


def _api_token_identity(raw: Any, label: str) -> str:
    if raw is None:
        return ""
    if not isinstance(raw, str) or not raw or len(raw) > 250 or not raw.isprintable():
        raise ValueError(f"{label}: identity must be a printable name of 1 to 250 characters "
                         "(the triggerer_id of the process that holds the token)")
    return raw


def _api_token(secret: Any, role: Any, owners: Any, name: str, label: str) -> ApiToken:
    # messages name the token by position or label, never by its secret
    if not isinstance(secret, str) or not _TOKEN_CHARS.fullmatch(secret):
        raise ValueError(f"{label}: the token must be printable ASCII without spaces")
    if len(secret) < MIN_TOKEN_LENGTH:
        raise ValueError(
            f"{label}: the token is {len(secret)} characters long; use at least "
            f"{MIN_TOKEN_LENGTH} (python -c 'import secrets; print(secrets.token_urlsafe(32))')"
        )
    if role not in API_ROLES:
        raise ValueError(f"{label}: role {role!r} is not one of {', '.join(API_ROLES)}")
    if not isinstance(owners, list | tuple) or not owners or not all(
        isinstance(o, str) and o for o in owners
    ):
        raise ValueError(f"{label}: owners must be a non-empty list of owner prefixes (* for all)")
    prefixes = tuple(sorted({"" if o == "*" else o for o in owners}))
    if "" in prefixes:
        prefixes = ("",)
    return ApiToken(secret=secret, role=role, owners=prefixes, name=name)


def _api_tokens(raw: Any) -> tuple[ApiToken, ...]:
    """API bearer tokens, as text (TOKEN:ROLE:PREFIX|PREFIX, ...) or a JSON list."""
    if raw is None:
        return ()
    if isinstance(raw, tuple | list) and all(isinstance(t, ApiToken) for t in raw):
        tokens = tuple(raw)
    else:
        items: list[Any]
        if isinstance(raw, list | tuple):
            items = list(raw)
        else:
            text = str(raw).strip()
            if not text:
                return ()
            if text[0] in "[{":
                try:
                    loaded = json.loads(text)
                except ValueError:
                    raise ValueError(f"not valid JSON; {_TOKEN_FORMAT}") from None
                items = loaded if isinstance(loaded, list) else [loaded]
            else:
                items = [part.strip() for part in re.split(r"[,\n]", text) if part.strip()]
        parsed: list[ApiToken] = []
        for n, item in enumerate(items, 1):
            label = f"token {n}"
            if isinstance(item, Mapping):
                unknown = set(item) - {"token", "role", "owners", "name", "identity",
                                       "per_triggerer"}
                if unknown:
                    raise ValueError(f"{label}: unknown field(s) {sorted(unknown)}")
                given = item.get("name")
                name = given if isinstance(given, str) and given else f"token {n}"
                label = f"token {given!r}" if name == given else label
                token = _api_token(item.get("token"), item.get("role"), item.get("owners"),
                                   name, label)
                identity = _api_token_identity(item.get("identity"), label)
                per_triggerer = item.get("per_triggerer", False)
                if not isinstance(per_triggerer, bool):
                    raise ValueError(f"{label}: per_triggerer must be true or false")
                if per_triggerer and identity:
                    raise ValueError(f"{label}: a per_triggerer key binds each credential to "
                                     "its own triggerer id; drop its identity")
                parsed.append(replace(token, identity=identity, per_triggerer=per_triggerer))
            elif isinstance(item, str):
                secret, sep1, rest = item.partition(":")
                role, sep2, owners = rest.partition(":")
                if not (sep1 and sep2 and owners):
                    raise ValueError(f"{label} has no TOKEN:ROLE:PREFIXES form; {_TOKEN_FORMAT}")
                parsed.append(_api_token(secret.strip(), role.strip(),
                                         [o.strip() for o in owners.split("|")], label, label))
            else:
                raise ValueError(f"{label}: {_TOKEN_FORMAT}")
        tokens = tuple(parsed)
    secrets_seen: set[str] = set()
    for t in tokens:
        if t.secret in secrets_seen:
            raise ValueError(f"{t.name}: the same token is listed twice")
        secrets_seen.add(t.secret)
    return tokens


def _origins(raw: Any) -> tuple[str, ...]:
    """Web origins (scheme://host[:port]), comma separated or a list."""
    if raw is None:
        return ()
    items = list(raw) if isinstance(raw, list | tuple) else str(raw).split(",")
    out: list[str] = []
    for item in (str(i).strip() for i in items):
        if not item:
            continue
        if not re.fullmatch(r"https?://[^/\s?#]+", item):
            raise ValueError(f"{item!r} is not an origin: scheme://host[:port], no path")
        out.append(item.lower())
    return tuple(out)


@dataclass(frozen=True)
class Spec:
    parse: Callable[[Any], Any]
    default: Any
    help: str
    #: never shown: error messages say <hidden> instead of the value
    secret: bool = False


SPECS: Final[dict[str, Spec]] = {
    "enabled": Spec(_bool, True, "local-first cache on (true) or every call straight to the "
                     "central DB (false)"),
    "cache_dir": Spec(_optional_path, None, "folder of the cache files; default "
                       "$AIRFLOW_HOME/localstate"),
    "cache_path": Spec(_optional_path, None, "the cache file itself; default "
                        "<cache_dir>/<triggerer_id>.db"),
    "central_url": Spec(_optional_str, None, "SQLAlchemy URL of the central DB; default "
                         "sqlite:///$AIRFLOW_HOME/localstate-central.db"),
    "triggerer_id": Spec(_triggerer_id, None, "this process's id (updated_by, cache file "
                          "name); default the host name"),
    "durability": Spec(_choice(*sorted(DURABILITIES)), "local", "when a set is acknowledged"),
    "flush_interval": Spec(_positive_float, 1.0, "seconds between flushes to the central DB"),
    "max_batch": Spec(_positive_int, 10_000, "dirty keys that trigger a flush at once, and rows "
                       "per central transaction"),
    "max_value_bytes": Spec(_positive_int, 64 * 1024, "largest encoded value"),
    "central_budget_rows_per_s": Spec(_optional_rate, None, "rows per second the whole fleet "
                                      "of triggerers may write to the central DB: each "
                                      "stretches its flush interval to share it; none: no "
                                      "budget"),
    "conflict_policy": Spec(_conflict_policy, "reject", "reject, last_writer_wins, max, "
                             "max:<int|timestamp|text|position>, max:<field>[:<order>], or "
                             "owner-glob=policy pairs"),
    "local_sync": Spec(_choice("full", "normal"), "full", "SQLite synchronous pragma of the "
                        "cache: full survives power loss, normal only a crash"),
    "memory_window": Spec(_positive_float, 0.05, "seconds within which a memory-durability "
                           "write reaches the local WAL"),
    "central_timeout": Spec(_positive_float, 30.0, "seconds a central-durability write waits"),
    "close_timeout": Spec(_positive_float, 10.0, "seconds close() spends flushing"),
    "flush_timeout": Spec(_positive_float, 60.0, "seconds one flush transaction may take "
                          "before it is abandoned and retried (a central DB that stopped "
                          "answering)"),
    "central_transaction_timeout": Spec(_positive_float, 10.0, "seconds the central DB "
                                        "lets a transaction of this process wait for a row "
                                        "lock or stay open idle before it ends it: the locks "
                                        "of a writer frozen mid-flush are freed within it "
                                        "(PostgreSQL, MySQL, MariaDB)"),
    "absent_ttl": Spec(_positive_float, 5.0, "seconds a key found absent centrally is "
                        "remembered as absent"),
    "max_keys_in_memory": Spec(_positive_int, 100_000, "entries a store keeps in memory; "
                                "beyond it the least recently used clean ones are evicted "
                                "and read through again when asked for"),
    "upgrade_schema": Spec(_bool, True, "create or upgrade the central schema on open"),
    "sink": Spec(_choice("sql", "airflow", "api"), "sql", "where flushes go: sql "
                 "(localstate's own central table at central_url), airflow (Airflow 3.3's "
                 "asset state store, through the accessors the triggerer gives watcher "
                 "triggers) or api (a localstate API server at api_url: no database "
                 "credentials in this process)"),
    "central_thread": Spec(_bool, True, "talk to the central DB from a thread of its own, so "
                            "busy triggers never delay a flush"),
    "api_url": Spec(_http_url, None, "with sink = api: the localstate API server to flush "
                    "and read through (http://host:8686, or Airflow's API server with the "
                    "plugin: http://airflow-api-server:8080/localstate); with sink = airflow: "
                    "Airflow's API server with the plugin, where cache misses of asset watchers "
                    "are read in one request per batch (writes still go through the accessors)"),
    "api_ca_bundle": Spec(_optional_path, None, "a PEM file of the certificate authorities "
                          "trusted for an https:// api_url (the CA of the API server's "
                          "certificate); none: the system's. Certificates are always "
                          "verified"),
    "api_token": Spec(_optional_token, None, "the bearer token sent to api_url: with sink = "
                      "api a read-write token of the server's api_tokens whose owner prefixes "
                      "cover this process's owners; with sink = airflow a read token covering "
                      "asset_watcher: owners", secret=True),
    "api_tokens": Spec(_api_tokens, (), "REST API bearer tokens: TOKEN:ROLE:PREFIX|PREFIX, ... "
                        "(ROLE read or read-write; PREFIX an owner prefix, * for all) or a JSON "
                        "list of {token, role, owners, name, identity, per_triggerer} "
                        "(per_triggerer: token is a key, and each triggerer presents the "
                        "credential `localstate credential` derives from it and its "
                        "triggerer_id); "
                        "none: `localstate serve` generates one (see api_open)", secret=True),
    "api_open": Spec(_bool, False, "with no api_tokens, serve the API with no token at all "
                      "(loopback only); off: `localstate serve` generates a token, kept in "
                      "$AIRFLOW_HOME/localstate/api-token (mode 0600)"),
    "api_trusted_origins": Spec(_origins, (), "web origins besides the server's own whose "
                                "pages may write with a browser's login cookie "
                                "(https://airflow.example.com, ...); none: the server's own "
                                "pages only"),
    "api_max_request_bytes": Spec(_optional_positive_int, None, "largest body of a flush or "
                                  "batched read the API server reads; larger: 413 too_large "
                                  "before it is read (by Content-Length, or counted as a "
                                  "chunked body arrives). None: what api_max_batch_rows rows "
                                  "can need, api_max_batch_rows x (4 x max_value_bytes + "
                                  "4 KiB), but no more than a client sends (it splits its "
                                  "batches above 32 MiB), plus 64 KiB: 33619968 bytes (32 MiB "
                                  "+ 64 KiB) with the defaults"),
    "api_max_batch_rows": Spec(_positive_int, 100_000, "most rows one flush request may "
                               "carry; more: 413 too_many_rows (clients send at most "
                               "100,000); also bounds api_max_request_bytes' default"),
    "api_fleet_details": Spec(_bool, False, "show every caller of /fleet the triggerers' "
                              "hosts and pids; off: admins only (others see names and lag)"),
    "api_host": Spec(_host, "127.0.0.1", "address `localstate serve` binds"),
    "api_port": Spec(_port, 8686, "port `localstate serve` listens on"),
    "statsd_host": Spec(_optional_host, None, "StatsD host to send metrics to (UDP); "
                         "none: StatsD off"),
    "statsd_port": Spec(_port, 8125, "StatsD port"),
    "statsd_prefix": Spec(_metric_prefix, "localstate", "prefix of every metric name"),
    "statsd_tags": Spec(_bool, False, "name the triggerer in a DogStatsD tag "
                        "(|#triggerer_id:<id>) instead of as the last segment of each StatsD "
                        "metric name"),
    "otel": Spec(_bool, False, "report the same metrics as OpenTelemetry instruments (needs "
                  "opentelemetry-api)"),
    "metrics_interval": Spec(_positive_float, 10.0, "seconds between two metric reports "
                              "(sampled from stats(), never per set)"),
    "asset_mirror": Spec(_choice("auto", "on", "off"), "auto", "also write each flushed "
                         "row of an asset_watcher:<asset> owner to Airflow's asset_state_store "
                         "in the flush's transaction; auto: when the central DB is Airflow's"),
    "watch_config": Spec(_bool, False, "watch airflow.cfg and apply changes of the live "
                          "settings (enabled, flush_interval, max_batch, durability) to the "
                          "running store"),
    "history": Spec(_bool, True, "record each owner's history (watermarks a flush committed, "
                    "events with their outcome, claims) in the central DB, in the flush's own "
                    "transaction; shown by `localstate history OWNER`, the REST API and the "
                    "state page"),
    "history_max_rows": Spec(_positive_int, 1000, "history rows each owner keeps (the newest; "
                             "trimmed as writes add them, and by `localstate db prune`)"),
    "history_max_age": Spec(_age, 7 * 86_400.0, "how long a history row is kept: an age such "
                            "as 7d, 36h, 90m"),
    "history_watermark_every": Spec(_non_negative_float, 10.0, "seconds within which an "
                                    "owner's watermark advances are recorded once (the "
                                    "latest, at the next flush after the window); events and "
                                    "claims are always recorded. 0: every flush's"),
    "retention": Spec(parse_retention, (), "how long `localstate db prune` keeps rows not "
                      "updated: owner-glob=age pairs, first match wins (trigger:*=7d, "
                      "asset_watcher:*=never); owners no rule names: --older-than"),
}

SETTING_NAMES: Final = tuple(SPECS)
#: each setting's default, written once (in `SPECS`); `Settings` takes its field defaults here
DEFAULTS: Final[dict[str, Any]] = {name: spec.default for name, spec in SPECS.items()}
#: the settings a running store takes on without a restart (`StateStore.reconfigure`)
LIVE_SETTINGS: Final = ("enabled", "flush_interval", "max_batch", "durability")


def setting_specs() -> dict[str, tuple[Any, str, bool]]:
    """Each setting's (default, description, secret): for `localstate config` and the
    ``[localstate]`` section the Airflow provider declares (one source of truth)."""
    return {name: (spec.default, spec.help, spec.secret) for name, spec in SPECS.items()}
