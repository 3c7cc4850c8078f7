// localstate web UI: lists state variables, shows the fleet's flush health (from the fleet
// table every triggerer's flushes write), edits a value with a confirmation and the version
// it was read at (only for a caller who may write: api/v1/me says). Plain JS against api/v1; every value
// goes into the page as text (textContent), never as HTML. URLs are relative to the page, so
// the same page works at `localstate serve`'s / and mounted in Airflow's API server at
// /localstate/ (where it is shown in a sandboxed iframe of Airflow's UI: no window.confirm
// there, so the confirmation is part of the page).
"use strict";

(function () {
  const TOKEN_KEY = "localstate.token";
  const STATUS_EVERY_MS = 2000;
  const PAGE = 100;
  const $ = (id) => document.getElementById(id);

  let nextCursor = null;
  let ownerPrefix = "";
  // the listing the table shows: a reset starts a new one, and only the newest listing's
  // pages reach the table (an answer to an older request is dropped)
  let listing = 0;
  let canWrite = false; // whether the caller may write (api/v1/me); no Edit control if not
  let editing = null; // the item being edited
  let pendingValue; // the value waiting for its confirmation (undefined: none)

  // Each name is one path segment: encode '/', and dots too (a segment "." or ".." would be
  // resolved away by the browser before it reached the server).
  function encodeName(name) {
    return encodeURIComponent(name).replace(/\./g, "%2E");
  }

  function token() {
    return sessionStorage.getItem(TOKEN_KEY) || "";
  }

  // The URL `localstate serve` prints carries its generated token (?token=...): keep it for
  // this tab, and take it out of the address bar and the history.
  function takeTokenFromUrl() {
    const params = new URLSearchParams(window.location.search);
    const given = params.get("token");
    if (!given) return;
    sessionStorage.setItem(TOKEN_KEY, given);
    params.delete("token");
    const rest = params.toString();
    window.history.replaceState(null, "", window.location.pathname + (rest ? `?${rest}` : ""));
  }

  class ApiFailure extends Error {
    constructor(status, body) {
      super((body && body.message) || `HTTP ${status}`);
      this.status = status;
      this.body = body || {};
    }
  }

  async function api(path, options = {}) {
    const headers = Object.assign(
      { Accept: "application/json", "X-LocalState-Request": "1" }, options.headers || {});
    const t = token();
    if (t) headers.Authorization = `Bearer ${t}`;
    if (options.body !== undefined) headers["Content-Type"] = "application/json";
    const response = await fetch(path, Object.assign({}, options, { headers }));
    if (response.status === 204) return null;
    let body = null;
    try {
      body = await response.json();
    } catch (_e) {
      body = null;
    }
    if (!response.ok) throw new ApiFailure(response.status, body);
    return body;
  }

  function say(text, kind) {
    const m = $("message");
    m.textContent = text;
    m.className = kind || "";
  }

  function seconds(s) {
    if (s === null || s === undefined) return "–";
    if (s < 1) return `${Math.round(s * 1000)} ms`;
    if (s < 120) return `${s.toFixed(1)} s`;
    return `${Math.round(s / 60)} min`;
  }

  function preview(value) {
    const text = JSON.stringify(value);
    return text.length > 80 ? `${text.slice(0, 77)}...` : text;
  }

  function when(iso) {
    if (!iso) return "–";
    const d = new Date(iso);
    return isNaN(d) ? iso : d.toLocaleString();
  }

  // -- who the caller is ------------------------------------------------------------------

  async function loadMe() {
    try {
      const me = await api("api/v1/me");
      canWrite = Boolean(me.can_write);
      $("me").textContent = canWrite ? `${me.name} · may edit` : `${me.name} · read only`;
    } catch (e) {
      canWrite = false;
      if (e.status === 401) $("token-form").hidden = false;
    }
    document.body.dataset.canWrite = String(canWrite);
  }

  // -- the API server's own health (a quiet line: the header is the fleet's) ----------------

  async function loadStatus() {
    try {
      const s = await api("api/v1/status");
      $("st-server").textContent = `served by ${s.triggerer_id} · ` +
        `${s.central_errors} central errors · ${s.conflicts} conflicts`;
      const err = $("st-last-error");
      err.hidden = !s.last_error;
      err.textContent = s.last_error ? `API server's last error: ${s.last_error}` : "";
    } catch (e) {
      $("st-server").textContent = e.status === 401 || e.status === 403
        ? "" : `API server status unavailable: ${e.message}`;
    }
  }

  // -- the fleet: the header and the panel ---------------------------------------------------

  // Every triggerer's figures as its last flush recorded them. Backlog: the keys it had
  // waiting once that flush went out (0: caught up). State: flushing (a flush within a few
  // of its intervals), idle (none since, and nothing was left waiting: a triggerer flushes
  // only what changed) or stalled (none since, with keys left waiting).
  function fillHeader(f) {
    const members = f.triggerers;
    const count = (state) => members.filter((m) => m.state === state).length;
    $("st-triggerers").textContent = members.length
      ? `${members.length} (${count("flushing")} flushing · ${count("idle")} idle · ` +
        `${count("stalled")} stalled)`
      : "none has flushed yet";
    const newest = members.reduce((best, m) =>
      best === null || m.since_last_flush_s < best ? m.since_last_flush_s : best, null);
    $("st-last-flush").textContent = newest === null ? "none yet" : `${seconds(newest)} ago`;
    $("st-backlog").textContent = String(members.reduce((n, m) => n + m.dirty_keys, 0));
    const lags = members.filter((m) => m.state !== "idle").map((m) => m.lag_s);
    $("st-lag").textContent = lags.length ? seconds(Math.max(...lags)) : "–";
    $("st-rate").textContent = f.central_rows_per_s.toFixed(1);
    $("st-stalled").textContent = String(f.stalled);
    $("status").dataset.health = f.stalled ? "stalled" : "ok";
    $("st-updated").textContent = `fleet at ${new Date().toLocaleTimeString()}`;
    $("st-updated").dataset.polls = String(Number($("st-updated").dataset.polls || 0) + 1);
  }

  async function loadFleet() {
    try {
      const f = await api("api/v1/fleet");
      fillHeader(f);
      const body = $("fleet-rows");
      body.replaceChildren();
      for (const m of f.triggerers) {
        const tr = document.createElement("tr");
        tr.dataset.triggerer = m.triggerer;
        tr.className = m.state;
        cell(tr, "triggerer", m.triggerer);
        cell(tr, "host", m.host == null ? "(hidden)" : `${m.host}:${m.pid}`);
        cell(tr, "since", `${seconds(m.since_last_flush_s)} ago`);
        cell(tr, "backlog", String(m.dirty_keys));
        cell(tr, "lag", seconds(m.lag_s));
        cell(tr, "rate", m.rows_per_s.toFixed(1));
        cell(tr, "interval", seconds(m.flush_interval));
        const flag = cell(tr, "flag", "");
        const badge = document.createElement("span");
        badge.className = `badge ${m.state}`;
        badge.textContent = m.state;
        flag.appendChild(badge);
        body.appendChild(tr);
      }
      $("fleet-summary").textContent =
        `${f.triggerers.length} triggerers · ${f.central_rows_per_s.toFixed(1)} rows/s · ` +
        `${f.stalled} stalled · ${f.idle} idle`;
    } catch (e) {
      const text = e.status === 401 || e.status === 403
        ? "enter a valid token" : `unavailable: ${e.message}`;
      $("fleet-summary").textContent = text;
      $("st-updated").textContent = `fleet ${text}`;
    }
  }

  // -- the table -------------------------------------------------------------------------

  function cell(row, cls, text) {
    const td = document.createElement("td");
    td.className = cls;
    td.textContent = text;
    row.appendChild(td);
    return td;
  }

  function fillRow(tr, item) {
    tr.replaceChildren();
    tr.dataset.owner = item.owner;
    tr.dataset.key = item.key;
    cell(tr, "owner", item.owner);
    cell(tr, "key", item.key);
    const v = cell(tr, "value", "");
    const code = document.createElement("code");
    code.textContent = preview(item.value);
    v.appendChild(code);
    cell(tr, "version", String(item.version));
    cell(tr, "updated-at", when(item.updated_at));
    cell(tr, "updated-by", item.updated_by);
    const fs = cell(tr, "flush-state", "");
    const badge = document.createElement("span");
    badge.className = `badge ${item.flush_state}`;
    badge.textContent = item.flush_state;
    fs.appendChild(badge);
    const actions = cell(tr, "actions", "");
    const hist = document.createElement("button");
    hist.type = "button";
    hist.className = "history";
    hist.textContent = "History";
    hist.title = "what this owner's watchers did: watermarks, events, claims and releases";
    hist.addEventListener("click", () => openWatcher(item.owner));
    actions.appendChild(hist);
    if (canWrite) {
      const edit = document.createElement("button");
      edit.type = "button";
      edit.className = "edit";
      edit.textContent = "Edit";
      edit.addEventListener("click", () => openEditor(item));
      actions.appendChild(edit);
    }
    tr.item = item;
  }

  async function loadRows(reset) {
    if (reset) {
      listing += 1;
      nextCursor = null;
      $("rows").replaceChildren();
    }
    const mine = listing;
    const params = new URLSearchParams({ limit: String(PAGE) });
    if (ownerPrefix) params.set("owner_prefix", ownerPrefix);
    if (nextCursor) params.set("cursor", nextCursor);
    try {
      const page = await api(`api/v1/state?${params}`);
      if (mine !== listing) return;  // a newer listing replaced this one meanwhile
      for (const item of page.items) {
        const tr = document.createElement("tr");
        fillRow(tr, item);
        $("rows").appendChild(tr);
      }
      nextCursor = page.next_cursor;
      $("more").hidden = !nextCursor;
      $("empty").hidden = $("rows").children.length > 0;
      $("state-table").dataset.loaded = ownerPrefix;
      if (reset) say(ownerPrefix ? `owners starting with "${ownerPrefix}"` : "all owners");
    } catch (e) {
      if (mine !== listing) return;
      $("more").hidden = true;
      if (e.status === 401) $("token-form").hidden = false;
      say(e.status === 401 ? "this server needs a token: enter it above" : e.message, "error");
    }
  }

  function rowOf(owner, key) {
    for (const tr of $("rows").children) {
      if (tr.dataset.owner === owner && tr.dataset.key === key) return tr;
    }
    return null;
  }

  // -- the watcher view: one owner's history (api/v1/history) -------------------------------

  let watched = null; // the owner shown
  let historyBefore = null; // the next page's cursor
  let watching = 0; // as `listing`: only the newest view's pages reach the table

  function ago(s) {
    return s === null || s === undefined ? "never" : `${seconds(s)} ago`;
  }

  function fillCounts(s) {
    const counts = s.events_last_hour;
    $("w-events").textContent = ["committed", "duplicate", "refused", "rejected"]
      .map((o) => `${counts[o] || 0} ${o}`).join(" · ");
    $("w-since-event").textContent = ago(s.since_event_s);
    $("w-since-mark").textContent = ago(s.since_watermark_s);
    $("w-lag").textContent = s.lag_s === null ? "–" : seconds(s.lag_s);
    $("w-epoch").textContent = s.epoch === null ? "–" : String(s.epoch);
  }

  function historyRow(item) {
    const tr = document.createElement("tr");
    tr.className = item.kind;
    tr.dataset.kind = item.kind;
    tr.dataset.id = String(item.id);
    cell(tr, "at", when(item.at));
    cell(tr, "kind", item.kind);
    cell(tr, "key", item.key || "");
    const what = cell(tr, "what", "");
    if (item.kind === "event") {
      tr.dataset.outcome = item.outcome;
      const badge = document.createElement("span");
      badge.className = `badge ${item.outcome}`;
      badge.textContent = item.outcome;
      what.appendChild(badge);
      if (item.asset_event !== null) {
        const made = document.createElement("span");
        made.className = "asset-event";
        made.textContent = ` asset event ${item.asset_event}`;
        what.appendChild(made);
      }
    } else if (item.kind === "watermark") {
      const code = document.createElement("code");
      code.textContent = `v${item.version} = ${preview(item.value)}`;
      what.appendChild(code);
    } else {
      // a handover: a claim (the owner taken) or a release (the owner left a triggerer)
      const badge = document.createElement("span");
      badge.className = `badge ${item.kind}`;
      badge.textContent = item.kind === "claim" ? "claimed" : "released";
      what.appendChild(badge);
    }
    cell(tr, "epoch", item.epoch === null ? "" : String(item.epoch));
    cell(tr, "triggerer", item.triggerer || "");
    return tr;
  }

  function addMarks(items) {
    // the watermark over time, oldest first: each advance a flush committed
    // (items come newest first: each goes before the ones shown, so older pages go first)
    const marks = items.filter((i) => i.kind === "watermark");
    const list = $("w-marks");
    for (const m of marks) {
      const li = document.createElement("li");
      li.dataset.version = String(m.version);
      li.textContent = `${m.key} v${m.version}: ${preview(m.value)}`;
      li.title = `${when(m.at)} by ${m.triggerer || "?"}`;
      list.insertBefore(li, list.firstChild);
    }
  }

  async function loadHistory(reset) {
    if (reset) {
      watching += 1;
      historyBefore = null;
      $("w-rows").replaceChildren();
      $("w-marks").replaceChildren();
    }
    const mine = watching;
    const params = new URLSearchParams({ owner: watched, limit: String(PAGE) });
    if (historyBefore !== null) params.set("before", String(historyBefore));
    try {
      const page = await api(`api/v1/history?${params}`);
      if (mine !== watching) return;
      if (page.summary) fillCounts(page.summary);
      for (const item of page.items) $("w-rows").appendChild(historyRow(item));
      addMarks(page.items);
      historyBefore = page.next_before;
      $("w-more").hidden = historyBefore === null;
      $("w-empty").hidden = $("w-rows").children.length > 0;
      $("watcher").dataset.loaded = watched;
    } catch (e) {
      if (mine !== watching) return;
      say(`history of ${watched}: ${e.message}`, "error");
    }
  }

  function openWatcher(owner) {
    watched = owner;
    $("w-owner").textContent = owner;
    $("watcher").hidden = false;
    delete $("watcher").dataset.loaded;
    const params = new URLSearchParams(window.location.search);
    params.set("history", owner);
    window.history.replaceState(null, "", `${window.location.pathname}?${params}`);
    loadHistory(true);
    $("watcher").scrollIntoView();
  }

  function closeWatcher() {
    watched = null;
    $("watcher").hidden = true;
    const params = new URLSearchParams(window.location.search);
    params.delete("history");
    const rest = params.toString();
    window.history.replaceState(null, "", window.location.pathname + (rest ? `?${rest}` : ""));
  }

  // -- editing ---------------------------------------------------------------------------

  function openEditor(item) {
    editing = item;
    $("edit-name").textContent = `${item.owner} / ${item.key}`;
    $("edit-version").textContent = String(item.version);
    $("edit-value").value = JSON.stringify(item.value, null, 2);
    $("edit-error").textContent = "";
    $("edit-confirm").hidden = true;
    pendingValue = undefined;
    $("editor").showModal();
    $("edit-value").focus();
  }

  async function save(event) {
    event.preventDefault();
    const item = editing;
    if (!item) return;
    let value;
    try {
      value = JSON.parse($("edit-value").value);
    } catch (e) {
      $("edit-error").textContent = `not valid JSON: ${e.message}`;
      return;
    }
    pendingValue = value;
    $("edit-error").textContent = "";
    $("edit-question").textContent = `Set ${item.owner} / ${item.key} to ${preview(value)}? ` +
      `It is written only if it is still at version ${item.version}.`;
    $("edit-confirm").hidden = false;
    $("edit-confirm-save").focus();
  }

  function back() {
    pendingValue = undefined;
    $("edit-confirm").hidden = true;
    $("edit-error").textContent = "not saved";
  }

  async function confirmSave() {
    const item = editing;
    const value = pendingValue;
    if (!item || value === undefined) return;
    pendingValue = undefined;
    $("edit-confirm").hidden = true;
    const path = `api/v1/state/${encodeName(item.owner)}/${encodeName(item.key)}`;
    try {
      const saved = await api(path, {
        method: "PUT",
        body: JSON.stringify({ value: value, expected_version: item.version }),
      });
      const tr = rowOf(item.owner, item.key);
      if (tr) fillRow(tr, saved);
      $("editor").close();
      editing = null;
      say(`saved ${saved.owner} / ${saved.key}: version ${item.version} → ${saved.version}`,
          "ok");
      loadStatus();
    } catch (e) {
      if (e.status === 409) {
        const actual = e.body.detail && e.body.detail.actual_version;
        $("edit-error").textContent = `not saved: it changed meanwhile` +
          (actual !== undefined ? ` (now at version ${actual})` : "") +
          ". The row shows the current value; edit again.";
        try {
          const fresh = await api(path);
          const tr = rowOf(item.owner, item.key);
          if (tr) fillRow(tr, fresh);
          editing = fresh;
          $("edit-version").textContent = String(fresh.version);
        } catch (_e) { /* deleted meanwhile: the message above stands */ }
      } else {
        $("edit-error").textContent = `not saved: ${e.message}`;
      }
    }
  }

  // -- wiring ----------------------------------------------------------------------------

  async function start() {
    $("filter-form").addEventListener("submit", (event) => {
      event.preventDefault();
      ownerPrefix = $("owner-filter").value.trim();
      loadRows(true);
    });
    $("filter-clear").addEventListener("click", () => {
      $("owner-filter").value = "";
      ownerPrefix = "";
      loadRows(true);
    });
    $("more").addEventListener("click", () => loadRows(false));
    $("w-more").addEventListener("click", () => loadHistory(false));
    $("w-close").addEventListener("click", closeWatcher);
    $("w-refresh").addEventListener("click", () => loadHistory(true));
    $("edit-form").addEventListener("submit", save);
    $("edit-back").addEventListener("click", back);
    $("edit-confirm-save").addEventListener("click", confirmSave);
    $("edit-cancel").addEventListener("click", () => {
      $("editor").close();
      editing = null;
    });
    $("token-form").addEventListener("submit", (event) => {
      event.preventDefault();
      sessionStorage.setItem(TOKEN_KEY, $("token").value.trim());
      $("token").value = "";
      loadStatus();
      loadFleet();
      loadMe().then(() => loadRows(true));
    });
    $("token-clear").addEventListener("click", () => {
      sessionStorage.removeItem(TOKEN_KEY);
      loadRows(true);
    });
    // the token form shows when the server answers 401 (a server with api_tokens and no
    // token in this tab); inside Airflow the session cookie is enough and it stays hidden
    loadStatus();
    loadFleet();
    setInterval(loadStatus, STATUS_EVERY_MS);
    setInterval(loadFleet, STATUS_EVERY_MS);
    await loadMe();  // before the rows: they show an Edit control only to a writer
    loadRows(true);
    // ?history=OWNER: open on that owner's watcher view (a link to share)
    const asked = new URLSearchParams(window.location.search).get("history");
    if (asked) openWatcher(asked);
  }

  takeTokenFromUrl();
  document.addEventListener("DOMContentLoaded", start);
})();
