// sluice status page: reads v1/stats every 2 s with the API token and draws
// one row per subscriber, with sparklines of what this tab has seen.
// Plain JS, no build step; it talks to its own origin only.
"use strict";

(function () {
  const REFRESH_MS = 2000;
  const HISTORY_MS = 5 * 60 * 1000; // as long as the stats window
  const SUBSCRIBERS_EVERY_MS = 10 * 1000;
  const TOKEN_KEY = "sluice.apiToken";
  // Relative to the page at status, so a proxy's path prefix is kept.
  const STATS_URL = "v1/stats";
  const SUBSCRIBERS_URL = "v1/subscribers?limit=1000";
  // The SVG namespace is a name, never fetched.
  const SVG_NS = "http://www.w3.org/2000/svg";
  const SPARK_W = 96;
  const SPARK_H = 22;
  const SPARK_PAD = 2;

  const $ = (id) => document.getElementById(id);

  const state = {
    token: null,
    timer: 0,
    // Bumped at every login and logout, so an answer to an older token is dropped.
    generation: 0,
    refreshes: 0,
    lastOK: null,
    rows: new Map(), // subscriber id -> row (DOM nodes and history)
    subs: new Map(), // subscriber id -> {perSecond, paused}, from v1/subscribers
    subsFetchedAt: -Infinity,
  };

  class Unauthorized extends Error {}

  // --- the token ------------------------------------------------------------

  // takeTokenFromFragment moves a token given as status#token=… into
  // sessionStorage and drops the fragment, so it stays out of the history
  // and of bookmarks. Fragments never reach the server or a Referer.
  function takeTokenFromFragment() {
    const m = /(?:^|&)token=([^&]*)/.exec(location.hash.slice(1));
    if (!m) return;
    let token = m[1];
    try {
      token = decodeURIComponent(token);
    } catch (_) {
      // not percent-encoded: use it as it is
    }
    if (token) sessionStorage.setItem(TOKEN_KEY, token);
    history.replaceState(null, "", location.pathname + location.search);
  }

  function login(token) {
    sessionStorage.setItem(TOKEN_KEY, token);
    state.token = token;
    state.generation++;
    clearTimeout(state.timer);
    $("login").hidden = true;
    $("login-error").hidden = true;
    $("forget").hidden = false;
    document.body.dataset.state = "connecting";
    setLive("connecting", "connecting…");
    refresh();
  }

  function logout(message) {
    sessionStorage.removeItem(TOKEN_KEY);
    state.token = null;
    state.generation++;
    clearTimeout(state.timer);
    document.body.dataset.state = "login";
    $("board").hidden = true;
    $("totals").hidden = true;
    $("problem").hidden = true;
    $("forget").hidden = true;
    $("login").hidden = false;
    const err = $("login-error");
    err.textContent = message || "";
    err.hidden = !message;
    setLive("off", "not connected");
    const input = $("token");
    input.value = "";
    input.focus();
  }

  // --- the API --------------------------------------------------------------

  async function getJSON(url) {
    const resp = await fetch(url, {
      headers: { Authorization: "Bearer " + state.token, Accept: "application/json" },
      cache: "no-store",
      credentials: "omit",
    });
    if (resp.status === 401) throw new Unauthorized("401");
    if (!resp.ok) {
      let msg = "HTTP " + resp.status;
      try {
        const body = await resp.json();
        if (body && body.error && body.error.message) msg += ": " + body.error.message;
      } catch (_) {
        // not the API's JSON error: the status says enough
      }
      throw new Error(msg);
    }
    return resp.json();
  }

  // loadSubscribers reads every subscriber's allowed rate and manual pause.
  // The list also carries secrets: only the two fields are kept.
  async function loadSubscribers() {
    const out = new Map();
    let url = SUBSCRIBERS_URL;
    for (let page = 0; page < 1000; page++) {
      const body = await getJSON(url);
      for (const s of body.data || []) {
        out.set(s.id, { perSecond: s.rate ? s.rate.per_second : null, paused: !!s.paused });
      }
      if (!body.next_cursor) break;
      url = SUBSCRIBERS_URL + "&cursor=" + encodeURIComponent(body.next_cursor);
    }
    state.subs = out;
    state.subsFetchedAt = performance.now();
  }

  // needSubscribers tells whether the stats lack rates or pauses that only
  // v1/subscribers has, and the copy we hold is missing one or is old.
  function needSubscribers(list) {
    const lacking = list.some((s) => !("rate" in s) || !("paused" in s));
    if (!lacking) return false;
    if (performance.now() - state.subsFetchedAt > SUBSCRIBERS_EVERY_MS) return true;
    return list.some((s) => !state.subs.has(s.subscriber_id));
  }

  async function refresh() {
    const gen = state.generation;
    try {
      const stats = await getJSON(STATS_URL);
      const list = stats.subscribers || [];
      if (needSubscribers(list)) {
        try {
          await loadSubscribers();
        } catch (e) {
          if (e instanceof Unauthorized) throw e;
          // keep the rates we had; the stats are still worth showing
        }
      }
      if (gen !== state.generation) return;
      render(stats);
    } catch (e) {
      if (gen !== state.generation) return;
      if (e instanceof Unauthorized) {
        logout("The token was refused (401). Enter the API token again.");
        return;
      }
      showProblem(e);
    }
    if (gen === state.generation) state.timer = setTimeout(refresh, REFRESH_MS);
  }

  function showProblem(e) {
    document.body.dataset.state = "error";
    const p = $("problem");
    let msg = "Cannot read v1/stats (" + (e && e.message ? e.message : String(e)) + "); retrying every 2 s.";
    if (state.lastOK) msg += " The numbers below are from " + clock(state.lastOK) + ".";
    p.textContent = msg;
    p.hidden = false;
    setLive("stale", state.lastOK ? "stale since " + clock(state.lastOK) : "no answer");
  }

  function setLive(kind, text) {
    $("live-dot").dataset.kind = kind;
    $("updated").textContent = text;
  }

  // --- drawing --------------------------------------------------------------

  function render(stats) {
    const t = performance.now();
    const now = new Date();
    state.refreshes++;
    state.lastOK = now;
    document.body.dataset.state = "live";
    document.body.dataset.refreshes = String(state.refreshes);
    $("problem").hidden = true;
    $("board").hidden = false;
    $("totals").hidden = false;
    setLive("live", "updated " + clock(now));

    const list = stats.subscribers || [];
    const tbody = $("rows");
    const seen = new Set();
    let prev = null;
    for (const s of list) {
      const id = s.subscriber_id;
      seen.add(id);
      let row = state.rows.get(id);
      if (!row) {
        row = createRow(id);
        state.rows.set(id, row);
      }
      const sub = state.subs.get(id) || {};
      const allowed = s.rate ? s.rate.per_second : sub.perSecond;
      const paused = "paused" in s ? !!s.paused : !!sub.paused;

      // current rate = sent deliveries per second since the last refresh
      const last = row.history[row.history.length - 1];
      let rate = null;
      if (last && t > last.t) rate = Math.max(0, s.sent - last.sent) / ((t - last.t) / 1000);
      row.history.push({
        t: t,
        sent: s.sent,
        pending: s.pending,
        dead: s.dead,
        success: s.success_rate,
        p99: s.p99_ms,
        rate: rate,
      });
      while (row.history.length > 1 && t - row.history[0].t > HISTORY_MS) row.history.shift();

      updateRow(row, s, { rate: rate, allowed: allowed, paused: paused, now: now });

      const want = prev ? prev.nextSibling : tbody.firstChild;
      if (row.tr !== want) tbody.insertBefore(row.tr, want);
      prev = row.tr;
    }
    for (const [id, row] of state.rows) {
      if (!seen.has(id)) {
        row.tr.remove();
        state.rows.delete(id);
      }
    }
    $("empty").hidden = list.length > 0;

    const tot = stats.totals || {};
    $("total-pending").textContent = count(tot.pending);
    $("total-inflight").textContent = count(tot.inflight);
    $("total-sent").textContent = count(tot.sent);
    $("total-dead").textContent = count(tot.dead);
    $("total-success").textContent = percent(tot.success_rate);
    $("total-dead").dataset.kind = tot.dead > 0 ? "warn" : "";
    if (stats.window_seconds) $("window").textContent = duration(stats.window_seconds * 1000);
  }

  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text != null) e.textContent = text;
    return e;
  }

  function createRow(id) {
    const tr = el("tr");
    tr.dataset.subscriber = id;
    const c = {};
    const name = el("td", "name");
    name.append(el("span", "id", id));
    c.detail = el("span", "detail muted");
    name.append(c.detail);
    tr.append(name);

    c.breaker = el("span", "badge");
    tr.append(cellWith(c.breaker));
    c.paused = el("span", "paused");
    tr.append(cellWith(c.paused));

    for (const key of ["success", "p99", "pending", "dead", "rate"]) {
      const td = el("td", "num metric");
      const value = el("span", "value");
      const spark = makeSpark();
      td.append(value, spark.svg);
      tr.append(td);
      c[key] = { td: td, value: value, spark: spark };
    }
    c.sent = el("span", "value");
    const sentTd = cellWith(c.sent);
    sentTd.className = "num";
    tr.append(sentTd);
    return { tr: tr, cells: c, history: [] };
  }

  function cellWith(child) {
    const td = el("td");
    td.append(child);
    return td;
  }

  function updateRow(row, s, x) {
    const c = row.cells;
    const tr = row.tr;
    tr.dataset.sent = String(s.sent);
    tr.dataset.pending = String(s.pending);
    tr.dataset.dead = String(s.dead);
    tr.dataset.breaker = s.breaker;
    tr.dataset.allowed = x.allowed == null ? "" : String(x.allowed);
    tr.dataset.health = health(s, x.paused);

    c.detail.textContent = count(s.inflight) + " in flight · " + tokens(s.tokens) + " tokens";

    c.breaker.textContent = s.breaker === "half_open" ? "half-open" : s.breaker;
    c.breaker.dataset.kind = s.breaker === "open" ? "bad" : s.breaker === "closed" ? "ok" : "warn";

    if (s.paused_until) {
      const until = new Date(s.paused_until);
      c.paused.textContent = clock(until) + " (in " + duration(until - x.now) + ")";
      c.paused.title = "Retry-After: paused until " + until.toString();
      c.paused.dataset.kind = "warn";
    } else if (x.paused) {
      c.paused.textContent = "paused";
      c.paused.title = "paused by an operator (PATCH paused: false resumes it)";
      c.paused.dataset.kind = "warn";
    } else {
      c.paused.textContent = "–";
      c.paused.title = "";
      c.paused.dataset.kind = "";
    }

    const h = row.history;
    c.success.value.textContent = percent(s.success_rate);
    c.success.td.dataset.kind = s.success_rate == null ? "" : s.success_rate < 0.9 ? "bad" : s.success_rate < 0.99 ? "warn" : "ok";
    drawSpark(c.success.spark, h, "success", { min: 0, max: 1, label: "success rate" , fmt: percent });

    c.p99.value.textContent = millis(s.p99_ms);
    drawSpark(c.p99.spark, h, "p99", { label: "p99", fmt: millis });

    c.pending.value.textContent = count(s.pending);
    drawSpark(c.pending.spark, h, "pending", { label: "backlog", fmt: count });

    c.dead.value.textContent = count(s.dead);
    c.dead.td.dataset.kind = s.dead > 0 ? "warn" : "";
    drawSpark(c.dead.spark, h, "dead", { label: "dead letters", fmt: count });

    c.rate.value.textContent = perSecond(x.rate) + " / " + (x.allowed == null ? "?" : perSecond(x.allowed)) + " /s";
    c.rate.td.dataset.kind = x.rate != null && x.allowed != null && x.rate > x.allowed * 1.05 ? "bad" : "";
    drawSpark(c.rate.spark, h, "rate", { label: "sent per second", fmt: perSecond, limit: x.allowed });

    c.sent.textContent = count(s.sent);
  }

  // health is the row's colour: bad when the breaker is open or deliveries
  // fail; warn when something holds them back (a pause the subscriber asked
  // for with Retry-After, or an operator's), or dead letters wait.
  function health(s, paused) {
    if (s.breaker === "open") return "bad";
    if (s.paused_until || paused) return "warn";
    if (s.success_rate != null && s.success_rate < 0.9) return "bad";
    if (s.breaker === "half_open" || s.dead > 0) return "warn";
    if (s.success_rate != null && s.success_rate < 0.99) return "warn";
    return "ok";
  }

  function svg(tag, attrs) {
    const e = document.createElementNS(SVG_NS, tag);
    for (const k in attrs) e.setAttribute(k, attrs[k]);
    return e;
  }

  function makeSpark() {
    const root = svg("svg", {
      class: "spark",
      width: SPARK_W,
      height: SPARK_H,
      viewBox: "0 0 " + SPARK_W + " " + SPARK_H,
      role: "img",
    });
    const title = svg("title", {});
    const limit = svg("line", { class: "limit", x1: 0, x2: SPARK_W, visibility: "hidden" });
    const area = svg("path", { class: "area" });
    const line = svg("path", { class: "line" });
    const dot = svg("circle", { class: "dot", r: 1.8, visibility: "hidden" });
    root.append(title, area, limit, line, dot);
    return { svg: root, title: title, limit: limit, area: area, line: line, dot: dot };
  }

  // drawSpark plots hist[key] against time over the span this tab has seen;
  // a null value (no attempt in the window, the first refresh's rate) leaves a gap.
  function drawSpark(sp, hist, key, o) {
    const vals = hist.map((h) => h[key]).filter((v) => v != null);
    const t1 = hist.length ? hist[hist.length - 1].t : 0;
    const t0 = hist.length ? hist[0].t : 0;
    const span = Math.max(t1 - t0, REFRESH_MS);
    const lo = o.min != null ? o.min : 0;
    let hi = o.max != null ? o.max : Math.max(lo, ...vals, o.limit != null ? o.limit : lo);
    if (!(hi > lo)) hi = lo + 1;
    const x = (t) => SPARK_W - SPARK_PAD - ((t1 - t) / span) * (SPARK_W - 2 * SPARK_PAD);
    const y = (v) => SPARK_PAD + (1 - (v - lo) / (hi - lo)) * (SPARK_H - 2 * SPARK_PAD);
    const base = (SPARK_H - SPARK_PAD).toFixed(1);

    let line = "";
    let area = "";
    let seg = null; // the open segment's first x, for closing its area
    let lastX = 0;
    let lastY = 0;
    for (const h of hist) {
      const v = h[key];
      if (v == null) {
        if (seg != null) area += "L" + lastX + " " + base + "Z";
        seg = null;
        continue;
      }
      lastX = x(h.t).toFixed(1);
      lastY = y(v).toFixed(1);
      if (seg == null) {
        seg = lastX;
        line += "M" + lastX + " " + lastY;
        area += "M" + lastX + " " + base + "L" + lastX + " " + lastY;
      } else {
        line += "L" + lastX + " " + lastY;
        area += "L" + lastX + " " + lastY;
      }
    }
    if (seg != null) area += "L" + lastX + " " + base + "Z";
    sp.line.setAttribute("d", line);
    sp.area.setAttribute("d", area);

    const last = hist.length ? hist[hist.length - 1][key] : null;
    if (last != null) {
      sp.dot.setAttribute("cx", lastX);
      sp.dot.setAttribute("cy", lastY);
      sp.dot.setAttribute("visibility", "visible");
    } else {
      sp.dot.setAttribute("visibility", "hidden");
    }
    if (o.limit != null && o.limit <= hi) {
      const ly = y(o.limit).toFixed(1);
      sp.limit.setAttribute("y1", ly);
      sp.limit.setAttribute("y2", ly);
      sp.limit.setAttribute("visibility", "visible");
    } else {
      sp.limit.setAttribute("visibility", "hidden");
    }
    let text = o.label + " over the last " + duration(span);
    if (vals.length) text += ": " + o.fmt(Math.min(...vals)) + " to " + o.fmt(Math.max(...vals));
    if (o.limit != null) text += " (allowed " + o.fmt(o.limit) + ")";
    sp.title.textContent = text;
    sp.svg.setAttribute("aria-label", text);
  }

  // --- formatting -----------------------------------------------------------

  function count(n) {
    return n == null ? "–" : Number(n).toLocaleString("en-US");
  }

  function percent(v) {
    if (v == null) return "–";
    if (v >= 1) return "100%";
    // floor, so 99.96% never shows as a perfect 100%
    return (Math.floor(v * 1000) / 10).toFixed(1) + "%";
  }

  function millis(ms) {
    if (ms == null) return "–";
    if (ms < 1000) return Math.round(ms) + " ms";
    if (ms < 60000) return (ms / 1000).toFixed(ms < 10000 ? 2 : 1) + " s";
    return (ms / 60000).toFixed(1) + " min";
  }

  function perSecond(v) {
    if (v == null) return "–";
    if (v < 10) return v.toFixed(1);
    return Math.round(v).toLocaleString("en-US");
  }

  function tokens(v) {
    return v == null ? "–" : v < 10 ? v.toFixed(1) : Math.floor(v).toLocaleString("en-US");
  }

  function duration(ms) {
    let s = Math.max(0, Math.round(ms / 1000));
    if (s < 60) return s + "s";
    const h = Math.floor(s / 3600);
    const m = Math.floor((s % 3600) / 60);
    s %= 60;
    if (h > 0) return h + "h " + m + "m";
    return m + "m" + (s ? " " + s + "s" : "");
  }

  function clock(d) {
    const p = (n) => String(n).padStart(2, "0");
    return p(d.getHours()) + ":" + p(d.getMinutes()) + ":" + p(d.getSeconds());
  }

  // --- start ----------------------------------------------------------------

  function start() {
    $("login-form").addEventListener("submit", (ev) => {
      ev.preventDefault();
      const token = $("token").value.trim();
      if (token) login(token);
    });
    $("forget").addEventListener("click", () => logout(""));

    takeTokenFromFragment();
    const token = sessionStorage.getItem(TOKEN_KEY);
    if (token) login(token);
    else logout("");
  }

  start();
})();
