// The leasehold console: one page, hash routes (#/keys, #/key/K, #/activity).
// Every request carries the viewer's bearer token in an Authorization header
// (kept in sessionStorage); live updates come from /api/watch, read as NDJSON
// with fetch() so the token never goes in a URL.
"use strict";

const TOKEN = "leasehold-console-token";
const state = { me: null, skew: 0, page: null };

function token() { return sessionStorage.getItem(TOKEN) || ""; }

function headers(extra) {
  const h = Object.assign({}, extra || {});
  if (token()) h.Authorization = "Bearer " + token();
  return h;
}

class ApiError extends Error {
  constructor(status, code, message) { super(message); this.status = status; this.code = code; }
}

async function api(path, options) {
  const response = await fetch(path, Object.assign({ headers: headers(), cache: "no-store" }, options || {}));
  let body = null;
  try { body = await response.json(); } catch (_) { body = null; }
  if (!response.ok) {
    const err = (body && body.error) || {};
    if (response.status === 401) showLogin(err.message);
    throw new ApiError(response.status, err.code || "http_" + response.status, err.message || response.statusText);
  }
  if (body && typeof body.now_ms === "number") state.skew = body.now_ms - Date.now();
  return body;
}

function post(path, payload) {
  return api(path, {
    method: "POST",
    headers: headers({ "Content-Type": "application/json" }),
    body: JSON.stringify(payload),
  });
}

// Follows /api/watch?… until `signal` aborts, calling onLine for each JSON
// line; reconnects after a failure (and says so through onStatus).
async function watch(query, signal, onLine, onStatus) {
  let delay = 500;
  while (!signal.aborted) {
    try {
      const response = await fetch("/api/watch?" + query, { headers: headers(), signal, cache: "no-store" });
      if (!response.ok) throw new Error("watch: HTTP " + response.status);
      onStatus && onStatus(true);
      delay = 500;
      const reader = response.body.getReader();
      const decoder = new TextDecoder();
      let buffered = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffered += decoder.decode(value, { stream: true });
        let newline;
        while ((newline = buffered.indexOf("\n")) >= 0) {
          const line = buffered.slice(0, newline);
          buffered = buffered.slice(newline + 1);
          if (line.trim()) onLine(JSON.parse(line));
        }
      }
    } catch (_) {
      if (signal.aborted) return;
    }
    onStatus && onStatus(false);
    await new Promise((resolve) => setTimeout(resolve, delay));
    delay = Math.min(delay * 2, 10000);
  }
}

// --- small DOM helpers -------------------------------------------------

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (name === "class") node.className = value;
    else if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else node.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === undefined || child === null || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function badge(word) { return el("span", { class: "badge " + word }, word); }
function mono(text) { return el("span", { class: "mono" }, text); }
function keyLink(key) { return el("a", { class: "mono", href: "#/key/" + encodeURIComponent(key) }, key); }
function nowServer() { return Date.now() + state.skew; }

function clock(ms) {
  if (!ms) return "—";
  return new Date(ms).toLocaleTimeString([], { hour12: false });
}

function duration(ms) {
  if (ms < 0) ms = 0;
  if (ms < 10000) return (ms / 1000).toFixed(1) + " s";
  const s = Math.round(ms / 1000);
  if (s < 120) return s + " s";
  const m = Math.floor(s / 60);
  if (m < 120) return m + " min " + (s % 60) + " s";
  return Math.floor(m / 60) + " h " + (m % 60) + " min";
}

function countdown(expiresAt) {
  return el("span", { class: "countdown", "data-expires": expiresAt });
}

function tickCountdowns() {
  const now = nowServer();
  for (const node of document.querySelectorAll("[data-expires]")) {
    const left = Number(node.dataset.expires) - now;
    node.textContent = left > 0 ? duration(left) : "expiring…";
    node.classList.toggle("low", left < 3000);
  }
}
setInterval(tickCountdowns, 200);

function stateWord(key) {
  if (key.quarantined) return "quarantined";
  if (key.lease) return "live";
  if (key.recoverable) return "recoverable";
  return "free";
}

function canAdmin(key) {
  const me = state.me;
  return !!me && me.scopes.some((s) => key.startsWith(s.prefix) && s.rights.includes("admin"));
}

// --- pages ---------------------------------------------------------------

function setApp(...nodes) {
  const app = document.getElementById("app");
  app.replaceChildren(...nodes);
}

function showLogin(message) {
  if (state.page) state.page.abort();
  const form = document.getElementById("login-template").content.cloneNode(true);
  setApp(form);
  document.getElementById("login-error").textContent = message && token() ? message : "";
  document.getElementById("login").addEventListener("submit", (event) => {
    event.preventDefault();
    sessionStorage.setItem(TOKEN, document.getElementById("token").value.trim());
    start();
  });
}

function keysPage(params, signal) {
  const prefix = params.get("prefix") || "";
  const filter = params.get("filter") || "all";
  const tokens = [""];
  const rows = new Map();
  const tbody = el("tbody");
  const status = el("span", { class: "muted" });
  const pager = el("div", { class: "pager" });
  const message = el("p", { class: "error" });

  const form = el("form", { class: "toolbar", id: "key-filter" },
    el("label", {}, "Prefix", el("input", { name: "prefix", value: prefix, placeholder: "session:" })),
    el("label", {}, "Show",
      el("select", { name: "filter" },
        ["all", "live", "recoverable", "quarantined"].map((f) =>
          el("option", { value: f, selected: f === filter }, f)))),
    el("button", { type: "submit" }, "Apply"),
    status);
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const data = new FormData(form);
    location.hash = "#/keys?" + new URLSearchParams({ prefix: data.get("prefix"), filter: data.get("filter") });
  });

  function matches(key) {
    if (filter === "all") return true;
    return stateWord(key) === filter;
  }

  function row(key) {
    const lease = key.lease;
    const last = key.last_ended;
    return el("tr", { "data-key": key.key },
      el("td", { class: "key" }, keyLink(key.key)),
      el("td", { class: "state" }, badge(stateWord(key))),
      el("td", { class: "holder", "data-label": "holder" }, lease ? lease.owner : el("span", { class: "muted" }, "—")),
      el("td", { class: "mono fence", "data-label": "fence" }, lease ? String(lease.fence) : "—"),
      el("td", { class: "left", "data-label": "left" }, lease ? countdown(lease.expires_at_ms) : "—"),
      el("td", { class: "wide" }, last ? [badge(last.end), " ", el("span", { class: "muted mono" }, "fence " + last.fence + " · " + clock(last.ended_at_ms))] : "—"));
  }

  function put(key, flash) {
    const old = rows.get(key.key);
    if (!matches(key)) {
      if (old) { old.remove(); rows.delete(key.key); }
      return;
    }
    const fresh = row(key);
    if (flash) fresh.classList.add("flash");
    if (old) old.replaceWith(fresh);
    else {
      const after = [...rows.keys()].sort().find((k) => k > key.key);
      tbody.insertBefore(fresh, after ? rows.get(after) : null);
    }
    rows.set(key.key, fresh);
    tickCountdowns();
  }

  async function load(page) {
    message.textContent = "";
    try {
      const query = new URLSearchParams({ prefix, filter, page_token: tokens[page] || "" });
      const body = await api("/api/keys?" + query);
      tbody.replaceChildren();
      rows.clear();
      body.keys.forEach((k) => put(k, false));
      if (!body.keys.length) tbody.append(el("tr", { class: "empty" }, el("td", { colspan: 6, class: "muted" }, "No keys.")));
      tokens[page + 1] = body.next_page_token;
      pager.replaceChildren(
        el("button", { type: "button", disabled: page === 0, onclick: () => load(page - 1) }, "‹ Previous"),
        el("span", { class: "muted" }, "Page " + (page + 1)),
        el("button", { type: "button", disabled: !body.next_page_token, onclick: () => load(page + 1) }, "Next ›"));
    } catch (err) {
      message.textContent = err.message;
    }
  }

  async function refresh(name) {
    try {
      const body = await api("/api/key?brief=1&key=" + encodeURIComponent(name));
      const empty = tbody.querySelector("tr.empty");
      if (empty && matches(body.key)) empty.remove();
      put(body.key, true);
    } catch (err) {
      if (err.status === 404) { const old = rows.get(name); if (old) { old.remove(); rows.delete(name); } }
    }
  }

  setApp(el("h1", {}, "Keys"), form, message,
    el("section", { class: "card" },
      el("div", { class: "table-wrap" },
        el("table", { id: "keys" },
          el("thead", {}, el("tr", {},
            el("th", {}, "Key"), el("th", {}, "State"), el("th", {}, "Holder"), el("th", {}, "Fence"),
            el("th", {}, "Time left"), el("th", { class: "wide" }, "Last term"))),
          tbody)),
      pager));
  load(0);
  watch(new URLSearchParams({ prefix }), signal, (line) => {
    if (line.type === "event") refresh(line.key);
  }, (up) => { status.textContent = up ? "● live" : "○ reconnecting…"; });
}

function keyPage(name, signal) {
  const live = el("section", { class: "card", id: "live" });
  const history = el("ol", { class: "timeline", id: "history" });
  const calls = el("tbody");
  const events = el("ul", { class: "events", id: "key-events" }, el("li", { class: "muted waiting" }, "Waiting for changes to this key…"));
  const message = el("p", { class: "error", id: "key-error" });

  function liveCard(key) {
    const lease = key.lease;
    const facts = el("dl", { class: "facts" },
      el("dt", {}, "State"), el("dd", {}, badge(stateWord(key))));
    const add = (term, value) => facts.append(el("dt", {}, term), el("dd", {}, value));
    if (lease) {
      add("Holder", lease.owner);
      add("Fence", mono(String(lease.fence)));
      add("Time left", countdown(lease.expires_at_ms));
      add("TTL", duration(lease.ttl_ms));
      add("Since", clock(lease.acquired_at_ms) + " (" + duration(nowServer() - lease.acquired_at_ms) + ")");
    }
    if (key.last_ended) add("Last term", [badge(key.last_ended.end), " fence ", mono(String(key.last_ended.fence)), " by " + key.last_ended.owner + " at " + clock(key.last_ended.ended_at_ms)]);
    const r = key.reservation;
    add("Reservation", r
      ? [badge(r.kind === "handoff" ? "handoff" : "lock-delay"), " after fence " + r.after_fence,
         r.successor ? " for " + r.successor : "", " until ", countdown(r.until_ms)]
      : el("span", { class: "muted" }, "none"));
    const actions = el("div", { class: "actions" });
    if (canAdmin(key.key)) {
      if (lease) {
        actions.append(el("button", {
          type: "button", class: "danger", id: "force-release",
          onclick: async () => {
            if (!confirm("Force-release " + key.key + " fence " + lease.fence + " (held by " + lease.owner + ")? The term ends as suspended.")) return;
            try { await post("/api/force-release", { key: key.key, fence: lease.fence }); } catch (err) { message.textContent = err.message; }
            load();
          },
        }, "Force-release fence " + lease.fence));
      }
      if (key.quarantined) {
        actions.append(el("button", {
          type: "button", id: "unquarantine",
          onclick: async () => {
            try { await post("/api/unquarantine", { key: key.key }); } catch (err) { message.textContent = err.message; }
            load();
          },
        }, "Unquarantine"));
      }
    }
    live.replaceChildren(el("h2", {}, "Live term"), facts, actions);
    tickCountdowns();
  }

  function historyList(entries) {
    if (!entries.length) { history.replaceChildren(el("li", { class: "muted" }, "No ended terms yet.")); return; }
    const longest = Math.max(...entries.map((e) => e.ended_at_ms - e.acquired_at_ms), 10000);
    history.replaceChildren(...entries.map((e) => {
      const bar = el("div", { class: "bar " + e.end });
      bar.style.width = Math.max(2, (100 * (e.ended_at_ms - e.acquired_at_ms)) / longest) + "%";
      return el("li", {},
        el("div", {}, mono("fence " + e.fence)),
        el("div", {},
          el("div", {}, badge(e.end), " ", e.owner, el("span", { class: "muted" },
            " · " + clock(e.acquired_at_ms) + " → " + clock(e.ended_at_ms) + " · " + duration(e.ended_at_ms - e.acquired_at_ms)),
            e.unsettled_tool_calls ? el("span", { class: "badge running" }, e.unsettled_tool_calls + " unsettled") : null,
            e.handed_off ? el("span", { class: "badge released" }, "handed off") : null),
          bar));
    }));
  }

  function callRows(list) {
    if (!list.length) { calls.replaceChildren(el("tr", {}, el("td", { colspan: 6, class: "muted" }, "No tool calls."))); return; }
    calls.replaceChildren(...list.map((c) => el("tr", { class: c.state === "running" ? "unsettled" : "" },
      el("td", { class: "mono" }, c.call_id),
      el("td", {}, c.name),
      el("td", { class: "mono wide" }, c.turn || "—"),
      el("td", {}, badge(c.state === "running" ? "running" : c.state), c.state === "running" ? " unsettled" : ""),
      el("td", { class: "mono" }, String(c.fence) + (c.settled_fence ? " → " + c.settled_fence : "")),
      el("td", { class: "wide muted" }, clock(c.begun_at_ms) + (c.settled_at_ms ? " → " + clock(c.settled_at_ms) : "")))));
  }

  async function load() {
    try {
      const body = await api("/api/key?key=" + encodeURIComponent(name));
      message.textContent = "";
      liveCard(body.key);
      historyList(body.history);
      callRows(body.tool_calls);
    } catch (err) {
      message.textContent = err.status === 404 ? "This key was never acquired (or was forgotten)." : err.message;
    }
  }

  setApp(el("h1", {}, el("a", { href: "#/keys" }, "Keys"), " / ", mono(name)), message,
    el("div", { class: "grid" }, live,
      el("section", { class: "card" }, el("h2", {}, "Watch events"), events)),
    el("section", { class: "card" }, el("h2", {}, "Tool-call ledger"),
      el("div", { class: "table-wrap" }, el("table", { id: "calls" },
        el("thead", {}, el("tr", {}, el("th", {}, "Call"), el("th", {}, "Tool"), el("th", { class: "wide" }, "Turn"),
          el("th", {}, "State"), el("th", {}, "Fence"), el("th", { class: "wide" }, "When"))), calls))),
    el("section", { class: "card" }, el("h2", {}, "History"), history));
  load();
  // Tool-call begins and settlements are not Watch events: look again now
  // and then while the page is open.
  const poll = setInterval(load, 3000);
  signal.addEventListener("abort", () => clearInterval(poll));
  watch(new URLSearchParams({ key: name }), signal, (line) => {
    if (line.type !== "event") return;
    const waiting = events.querySelector(".waiting");
    if (waiting) waiting.remove();
    events.prepend(el("li", {}, el("span", { class: "when" }, clock(line.at_ms)), badge(line.kind), mono("fence " + line.fence), line.owner));
    load();
  });
}

function activityPage(params, signal) {
  const prefix = params.get("prefix") || "";
  const SPAN_S = 120, BUCKET_S = 2;
  const counts = { granted: new Map(), released: new Map(), expired: new Map() };
  const events = el("ul", { class: "events", id: "activity-events" });
  const canvas = el("canvas", { class: "rate", id: "rate", width: 1000, height: 160 });
  const health = el("dl", { class: "facts", id: "health" });
  const status = el("span", { class: "muted" });
  const form = el("form", { class: "toolbar" },
    el("label", {}, "Prefix", el("input", { name: "prefix", value: prefix, placeholder: "(every key you may read)" })),
    el("button", { type: "submit" }, "Watch"), status);
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    location.hash = "#/activity?" + new URLSearchParams({ prefix: new FormData(form).get("prefix") });
  });

  function draw() {
    const ctx = canvas.getContext("2d");
    const width = canvas.clientWidth || 1000, height = canvas.clientHeight || 160;
    const ratio = window.devicePixelRatio || 1;
    canvas.width = width * ratio; canvas.height = height * ratio;
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    const styles = getComputedStyle(document.documentElement);
    const colors = { granted: styles.getPropertyValue("--ok"), released: styles.getPropertyValue("--accent"), expired: styles.getPropertyValue("--warn") };
    const now = Math.floor(Date.now() / 1000 / BUCKET_S);
    const buckets = SPAN_S / BUCKET_S;
    let max = 1;
    for (const series of Object.values(counts)) for (const [b, n] of series) if (b > now - buckets) max = Math.max(max, n);
    ctx.clearRect(0, 0, width, height);
    ctx.strokeStyle = styles.getPropertyValue("--line");
    ctx.lineWidth = 1;
    for (let i = 0; i <= 4; i++) { const y = 8 + ((height - 24) * i) / 4; ctx.beginPath(); ctx.moveTo(0, y); ctx.lineTo(width, y); ctx.stroke(); }
    ctx.fillStyle = styles.getPropertyValue("--muted");
    ctx.font = "11px sans-serif";
    ctx.fillText(max + " / " + BUCKET_S + " s", 4, 18);
    ctx.fillText("−" + SPAN_S + " s", 4, height - 4);
    ctx.fillText("now", width - 26, height - 4);
    const kinds = Object.keys(counts);
    const slot = width / buckets;
    const bar = Math.max(1, (slot - 2) / kinds.length);
    kinds.forEach((kind, k) => {
      ctx.fillStyle = colors[kind];
      for (let i = 0; i < buckets; i++) {
        const n = counts[kind].get(now - buckets + 1 + i) || 0;
        if (!n) continue;
        const h = ((height - 24) * n) / max;
        ctx.fillRect(i * slot + 1 + k * bar, height - 16 - h, bar, h);
      }
    });
  }

  async function loadHealth() {
    try {
      const info = await api("/api/info");
      const g = info.gauges || {};
      const rows = [
        ["Server", "leasehold " + info.version + " (protocol " + info.protocol + ")"],
        ["Backend", info.backend],
        ["Serving", [el("span", { class: "status-dot " + (info.serving ? "up" : "down") }), info.serving ? "yes" : "no"]],
      ];
      if ("database_up" in g) rows.push(["Database", [el("span", { class: "status-dot " + (g.database_up ? "up" : "down") }), g.database_up ? "reachable" : "unreachable"]]);
      else rows.push(["Database", [el("span", { class: "status-dot up" }), "in-process (SQLite)"]]);
      for (const [name, label] of [["leases_live", "Live leases"], ["keys", "Keys"], ["waiters", "Waiting acquires"], ["watchers", "Watchers"], ["keys_quarantined", "Quarantined"], ["tool_calls_unsettled", "Unsettled tool calls"], ["revision", "Revision"]]) {
        if (name in g) rows.push([label, mono(String(g[name]))]);
      }
      rows.push(["Console watches", mono(String(info.console_watchers))]);
      health.replaceChildren(...rows.flatMap(([t, d]) => [el("dt", {}, t), el("dd", {}, d)]));
    } catch (err) {
      health.replaceChildren(el("dt", {}, "Error"), el("dd", { class: "error" }, err.message));
    }
  }

  setApp(el("h1", {}, "Activity"), form,
    el("section", { class: "card" }, el("h2", {}, "Grants, releases and expiries"), canvas,
      el("div", { class: "legend" }, el("span", { class: "granted" }, "granted"), el("span", { class: "released" }, "released / suspended"), el("span", { class: "expired" }, "expired"))),
    el("div", { class: "grid" },
      el("section", { class: "card" }, el("h2", {}, "Events"), events),
      el("section", { class: "card" }, el("h2", {}, "Server health"), health)));
  draw();
  loadHealth();
  const timers = [setInterval(draw, 1000), setInterval(loadHealth, 5000)];
  signal.addEventListener("abort", () => timers.forEach(clearInterval));
  watch(new URLSearchParams({ prefix }), signal, (line) => {
    if (line.type !== "event") return;
    const kind = line.kind === "suspended" ? "released" : line.kind;
    if (counts[kind]) {
      const b = Math.floor(Date.now() / 1000 / BUCKET_S);
      counts[kind].set(b, (counts[kind].get(b) || 0) + 1);
    }
    events.prepend(el("li", {}, el("span", { class: "when" }, clock(line.at_ms)), badge(line.kind), keyLink(line.key), mono("fence " + line.fence), line.owner));
    while (events.children.length > 200) events.lastChild.remove();
    draw();
  }, (up) => { status.textContent = up ? "● live" : "○ reconnecting…"; });
}

// --- routing ---------------------------------------------------------------

function route() {
  if (!state.me) return;
  if (state.page) state.page.abort();
  state.page = new AbortController();
  const hash = location.hash.slice(1) || "/keys";
  const [path, query] = hash.split("?");
  const params = new URLSearchParams(query || "");
  const section = path.startsWith("/key/") ? "keys" : path.startsWith("/activity") ? "activity" : "keys";
  for (const link of document.querySelectorAll("[data-nav]")) link.classList.toggle("active", link.dataset.nav === section);
  if (path.startsWith("/key/")) keyPage(decodeURIComponent(path.slice(5)), state.page.signal);
  else if (path.startsWith("/activity")) activityPage(params, state.page.signal);
  else keysPage(params, state.page.signal);
}

async function start() {
  try {
    state.me = await api("/api/me");
  } catch (err) {
    if (err.status !== 401) setApp(el("p", { class: "error" }, err.message));
    return;
  }
  const who = document.getElementById("who");
  who.replaceChildren(...(state.me.auth
    ? ["signed in as ", mono(state.me.principal), state.me.admin ? " (admin)" : ""]
    : ["no --auth: every viewer may do everything"]));
  document.getElementById("signout").hidden = !state.me.auth;
  route();
}

document.addEventListener("DOMContentLoaded", () => {
  window.addEventListener("hashchange", route);
  document.getElementById("signout").addEventListener("click", () => {
    sessionStorage.removeItem(TOKEN);
    state.me = null;
    showLogin();
  });
  start();
});
