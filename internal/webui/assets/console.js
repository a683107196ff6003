// The lmcache web console: polls the service's own JSON and /metrics
// routes, renders tables, and charts rates it computes from the counters.
// Plain script, no build step; uPlot is the only library.
"use strict";
(function () {
  const svc = document.documentElement.dataset.service;
  const params = new URLSearchParams(location.search);
  const every = Math.max(200, Number(params.get("interval")) || 2000);
  const KEY = "lmcache-token";
  const main = document.getElementById("main");
  const keep = 300; // chart points
  // state is read by the browser tests (and is handy in a devtools console).
  const state = window.lmcacheConsole = { service: svc, ticks: 0, charts: {}, errors: {} };

  const authForm = document.getElementById("auth");
  const authState = document.getElementById("auth-state");
  authForm.addEventListener("submit", function (e) {
    e.preventDefault();
    sessionStorage.setItem(KEY, document.getElementById("token").value);
    tick();
  });

  async function get(path, text) {
    const headers = {};
    const tok = sessionStorage.getItem(KEY);
    if (tok) headers.Authorization = "Bearer " + tok;
    const r = await fetch(path, { headers: headers, cache: "no-store" });
    if (r.status === 401) throw new Error("401: enter the bearer token above");
    if (!r.ok) throw new Error("HTTP " + r.status);
    return text ? r.text() : r.json();
  }

  // parseMetrics reads Prometheus text: sums[name] adds every labelled
  // sample of a family, series[name] keeps [labels, value] pairs.
  function parseMetrics(text) {
    const sums = {}, series = {};
    for (const line of text.split("\n")) {
      const m = /^([A-Za-z_:][\w:]*)(\{[^}]*\})?\s+(\S+)/.exec(line);
      if (!m) continue;
      const v = Number(m[3]);
      if (!Number.isFinite(v)) continue;
      sums[m[1]] = (sums[m[1]] || 0) + v;
      (series[m[1]] = series[m[1]] || []).push([m[2] || "", v]);
    }
    return { sums: sums, series: series };
  }

  // rates turns counter sums into per-second rates since the previous poll
  // (a reset, counter lower than before, reads as 0).
  let prev = null;
  function rates(m, now) {
    const p = prev;
    prev = { t: now, sums: m.sums };
    return function (name) {
      if (!p) return 0;
      const d = (m.sums[name] || 0) - (p.sums[name] || 0);
      const dt = (now - p.t) / 1000;
      return d > 0 && dt > 0 ? d / dt : 0;
    };
  }

  // section returns the body element of a titled panel, created once.
  function section(id, title) {
    let s = document.getElementById(id);
    if (!s) {
      s = document.createElement("section");
      s.id = id;
      s.innerHTML = "<h2></h2><div class=\"body\"></div>";
      s.querySelector("h2").textContent = title;
      main.appendChild(s);
    }
    return s.querySelector(".body");
  }

  function el(tag, text, cls) {
    const e = document.createElement(tag);
    if (text !== undefined) e.textContent = text;
    if (cls) e.className = cls;
    return e;
  }

  // cell: a string, or {k, v, text, cls}; numbers keep their raw value in
  // data-value so the display can round.
  function cell(c) {
    if (c === null || typeof c !== "object") return el("td", c === undefined || c === null ? "" : String(c));
    const td = el("td", c.text !== undefined ? c.text : String(c.v), c.cls || (typeof c.v === "number" ? "num" : ""));
    if (c.k) td.dataset.k = c.k;
    if (c.v !== undefined) td.dataset.value = String(c.v);
    return td;
  }

  function table(body, id, head, rows) {
    const t = el("table");
    t.id = id;
    const tr = el("tr");
    head.forEach(function (h) { tr.appendChild(el("th", h)); });
    t.appendChild(el("thead")).appendChild(tr);
    const tb = t.appendChild(el("tbody"));
    rows.forEach(function (r) {
      const row = el("tr");
      if (r.id !== undefined) row.dataset.id = r.id;
      r.cells.forEach(function (c) { row.appendChild(cell(c)); });
      tb.appendChild(row);
    });
    body.replaceChildren(t);
  }

  function facts(body, id, pairs) {
    const dl = el("dl");
    dl.id = id;
    pairs.forEach(function (p) {
      dl.appendChild(el("dt", p[0]));
      const dd = dl.appendChild(el("dd", p[2] !== undefined ? p[2] : String(p[1])));
      dd.dataset.k = p[0];
      dd.dataset.value = String(p[1]);
    });
    body.replaceChildren(dl);
  }

  function fail(body, what, err) {
    state.errors[what] = String(err.message || err);
    body.replaceChildren(el("p", what + ": " + state.errors[what], "err"));
  }

  function bytes(n) {
    const u = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0;
    while (Math.abs(n) >= 1024 && i < u.length - 1) { n /= 1024; i++; }
    return (i ? n.toFixed(1) : String(n)) + " " + u[i];
  }
  function num(n, d) { return Number(n).toFixed(d === undefined ? 2 : d); }
  function health(ok) { return { v: ok ? "ok" : "unhealthy", cls: ok ? "ok" : "bad" }; }

  // chart appends one point per series to a uPlot chart made on first use.
  function chart(id, title, names, values, now) {
    let c = state.charts[id];
    if (!c) {
      const body = section("chart-" + id, title);
      const series = [{}].concat(names.map(function (n, i) {
        return { label: n, stroke: ["#1f6feb", "#d9480f", "#2f9e44", "#9c36b5"][i % 4], width: 2 };
      }));
      const data = [[]].concat(names.map(function () { return []; }));
      // Byte charts label their axis in KiB/MiB/GiB; a wide axis keeps the
      // labels whole.
      const fmt = /bytes/.test(title) ? bytes : function (v) { return String(Math.round(v * 100) / 100); };
      const axes = [{}, { size: 80, values: function (u, vs) { return vs.map(fmt); } }];
      c = state.charts[id] = new uPlot({ width: 520, height: 180, series: series, axes: axes }, data, body);
    }
    const d = c.data.map(function (a) { return a.slice(-keep + 1); });
    d[0].push(now / 1000);
    values.forEach(function (v, i) { d[i + 1].push(v); });
    c.setData(d);
  }

  // loops shows /periodic-threads with /periodic-threads-health's verdict:
  // a critical or high loop that runs but does not tick is "stuck".
  function loops(res, hres) {
    const body = section("loops", "Periodic threads");
    if (res.status !== "fulfilled") return fail(body, "/periodic-threads", res.reason);
    const h = hres.status === "fulfilled" ? hres.value : null, stuck = {};
    if (h) h.unhealthy_threads.forEach(function (u) { stuck[u.name] = true; });
    table(body, "loops-table", ["thread", "level", "health", "running", "active", "last run (s ago)", "runs", "failed"],
      res.value.threads.map(function (t) {
        // A one-shot loop (the startup resync) stops when done, so
        // "not running" is a state, not a fault; failures are.
        return { id: t.name, cells: [t.name, t.level,
          h ? (stuck[t.name] ? { k: "health", v: "stuck", cls: "bad" } : { k: "health", v: "ok", cls: "ok" }) : { k: "health", v: "?" },
          t.is_running ? "yes" : "no", t.is_active ? "yes" : "no",
          { k: "last_run_ago", v: t.last_run_ago, text: t.last_run_ago === null ? "never" : num(t.last_run_ago) },
          { k: "total_runs", v: t.total_runs }, { k: "failed_runs", v: t.failed_runs, cls: t.failed_runs ? "num bad" : "num" }] };
      }));
    const f = body.appendChild(el("div"));
    if (!h) return fail(f, "/periodic-threads-health", hres.reason);
    facts(f, "loops-health", [["threads_healthy", h.healthy, h.healthy ? "yes" : "no"], ["unhealthy_count", h.unhealthy_count]]);
  }

  function metricsOr(body, res) {
    if (res.status === "fulfilled") return parseMetrics(res.value);
    fail(body, "/metrics", res.reason);
    return null;
  }

  async function coordinator(now) {
    const r = await Promise.allSettled([get("/instances"), get("/quota"), get("/quota/config"), get("/periodic-threads"), get("/metrics", true), get("/ui/api/fleet"), get("/periodic-threads-health")]);
    // fleet: the console's own route (heartbeat ages, watermarks, prefetches).
    const fleet = r[5].status === "fulfilled" ? r[5].value : null;
    const age = {}, salts = {}, l1 = {};
    if (fleet) {
      fleet.instances.forEach(function (i) { age[i.instance_id] = i.heartbeat_age_seconds; l1[i.instance_id] = i.l1_reported; });
      fleet.salts.forEach(function (s) { salts[s.cache_salt] = s; });
    }
    const timeout = fleet ? fleet.instance_timeout : null;
    let body = section("fleet", "Fleet");
    if (r[0].status !== "fulfilled") fail(body, "/instances", r[0].reason);
    else table(body, "fleet-table", ["instance", "address", "mq port", "registered", "last heartbeat", "L1 used", "L1 keys", "event seq", "stream"],
      r[0].value.instances.map(function (i) {
        const es = i.event_stream;
        const a = age[i.instance_id];
        const late = a !== undefined && timeout && a > timeout / 2;
        // L1 figures come only from tier "l1" facts on POST /events, which
        // lmcache-go servers do not send: without one, 0 means unknown.
        const rep = l1[i.instance_id];
        return { id: i.instance_id, cells: [{ k: "instance_id", v: i.instance_id }, i.ip + ":" + i.http_port, { k: "mq_port", v: i.mq_port },
          new Date(i.registration_time * 1000).toISOString().replace("T", " ").slice(0, 19),
          { k: "last_heartbeat_time", v: i.last_heartbeat_time, text: a === undefined ? "?" : num(a, 1) + " s ago", cls: late ? "num bad" : "num" },
          rep ? { k: "l1_used_bytes", v: i.l1_used_bytes, text: bytes(i.l1_used_bytes) } : { k: "l1_used_bytes", v: "", text: "not reported", cls: "dim" },
          rep ? { k: "l1_keys", v: i.l1_keys } : { k: "l1_keys", v: "", text: "not reported", cls: "dim" },
          { k: "last_seq", v: es ? es.last_seq : "", text: es ? String(es.last_seq) : "none yet" },
          es ? (es.gap_detected ? { v: "gap", cls: "bad" } : { v: "ok", cls: "ok" }) : ""] };
      }));
    body = section("quota", "Quotas and usage (L2)" + (fleet ? ", eviction at " + num(100 * fleet.trigger_watermark, 0) + " % of the limit" : ""));
    if (r[1].status !== "fulfilled") fail(body, "/quota", r[1].reason);
    else {
      const def = r[2].status === "fulfilled" ? r[2].value.default_limit_gb : null;
      const rows = r[1].value.by_cache_salt.map(function (s) {
        const lim = s.quota_exists ? s.quota_limit_gb : def;
        const pct = lim ? 100 * s.usage_gb / lim : null;
        const w = salts[s.cache_salt];
        const starts = w && w.eviction_starts_bytes !== null ? w.eviction_starts_bytes : null;
        return { id: s.cache_salt, cells: [{ k: "cache_salt", v: s.cache_salt, text: s.cache_salt || "(empty)" },
          { k: "quota_limit_gb", v: lim === null ? "" : lim, text: lim === null ? "none" : num(lim, 6) + (s.quota_exists ? "" : " (default)") },
          { k: "usage_gb", v: s.usage_gb, text: num(s.usage_gb, 6) },
          { k: "used_pct", v: pct === null ? "" : pct, text: pct === null ? "" : num(pct, 1) + " %", cls: pct !== null && pct > 100 ? "num bad" : "num" },
          { k: "eviction_starts_bytes", v: starts === null ? "" : starts, text: starts === null ? (w ? "exempt" : "") : bytes(starts) },
          w ? (w.over_watermark ? { k: "over_watermark", v: "yes", cls: "bad" } : { k: "over_watermark", v: "no", cls: "ok" }) : ""] };
      });
      rows.push({ id: "_total", cells: ["total", def === null ? "default: none" : "default: " + num(def, 6), { k: "total_gb", v: r[1].value.total_gb, text: num(r[1].value.total_gb, 6) }, "", "", ""] });
      table(body, "quota-table", ["cache salt", "limit (GB)", "usage (GB)", "used", "eviction starts at", "evicting"], rows);
    }
    body = section("prefetches", "Warm prefetches in flight (relayed by this coordinator)");
    if (r[5].status !== "fulfilled") fail(body, "/ui/api/fleet", r[5].reason);
    else {
      const p = fleet.prefetches;
      facts(body, "prefetch-facts", [["in_flight", p.in_flight], ["submitted", p.submitted], ["completed", p.completed], ["forgotten", p.forgotten]]);
      if (p.jobs.length) {
        const t = el("div");
        body.appendChild(t);
        table(t, "prefetch-table", ["instance", "request", "age (s)"], p.jobs.map(function (j) {
          return { id: j.instance_id + "/" + j.request_id, cells: [j.instance_id, j.request_id, { k: "age_seconds", v: j.age_seconds, text: num(j.age_seconds, 1) }] };
        }));
      }
    }
    loops(r[3], r[6]);
    body = section("coord-metrics", "Pins, keys and eviction");
    const m = metricsOr(body, r[4]);
    if (!m) return;
    const g = function (n) { return m.sums["lmcache_coordinator_" + n] || 0; };
    const rate = rates(m, now);
    facts(body, "coord-facts", [
      ["registered_instances", g("registered_instances")],
      ["tracked_keys", g("tracked_keys")],
      ["tracked_bytes", g("tracked_bytes"), bytes(g("tracked_bytes"))],
      ["active_pins", g("active_pins")],
      ["eviction_cycles_total", g("eviction_cycles_total")],
      ["eviction_keys_dispatched_total", g("eviction_keys_dispatched_total")],
      ["eviction_dispatch_failures_total", g("eviction_dispatch_failures_total")],
    ]);
    chart("usage", "Tracked L2 bytes", ["bytes"], [g("tracked_bytes")], now);
    chart("eviction", "Eviction and events (per second)", ["keys evicted/s", "events ingested/s"],
      [rate("lmcache_coordinator_eviction_keys_dispatched_total"), rate("lmcache_coordinator_events_ingested_total")], now);
  }

  async function server(now) {
    const r = await Promise.allSettled([get("/status"), get("/config/adapters"), get("/quota"), get("/periodic-threads"), get("/metrics", true), get("/periodic-threads-health")]);
    let body = section("engine", "Engine");
    const st = r[0].status === "fulfilled" ? r[0].value : null;
    if (!st) fail(body, "/status", r[0].reason);
    else {
      const sm = st.storage_manager || {}, l1 = sm.l1_manager || {}, ev = sm.l1_eviction_controller || {}, pf = sm.prefetch_controller || {};
      // Models: the layouts in force (--register-model or a worker's) and
      // the workers' cache contexts, as "name (world N)".
      const models = {};
      (st.model_layouts || []).concat(Object.values(st.cache_context_meta || {})).forEach(function (m) {
        models[m.model_name + " (world " + m.world_size + ")"] = true;
      });
      const names = Object.keys(models).sort();
      facts(body, "engine-facts", [
        ["is_healthy", st.is_healthy, st.is_healthy ? "ok" : "unhealthy"],
        ["l1_used_bytes", l1.memory_used_bytes, bytes(l1.memory_used_bytes)],
        ["l1_total_bytes", l1.memory_total_bytes, bytes(l1.memory_total_bytes)],
        ["l1_usage_ratio", l1.memory_usage_ratio, num(100 * l1.memory_usage_ratio, 1) + " %"],
        ["l1_objects", l1.total_object_count],
        ["l1_eviction_watermark", ev.trigger_watermark],
        ["l2_adapters", sm.num_l2_adapters],
        ["active_prefetch_jobs", st.active_prefetch_jobs, st.active_prefetch_jobs + " of " + pf.max_in_flight],
        ["registered_gpu_ids", (st.registered_gpu_ids || []).length, (st.registered_gpu_ids || []).join(", ") || "none"],
        ["models", names.length, names.join(", ") || "none"],
        ["active_sessions", st.active_sessions],
      ]);
      body = section("controllers", "Controllers");
      const ctl = Object.keys(sm).filter(function (k) { return sm[k] && typeof sm[k] === "object" && "is_healthy" in sm[k]; });
      table(body, "controllers-table", ["part", "health", "thread"], ctl.map(function (k) {
        return { id: k, cells: [k, health(sm[k].is_healthy), "thread_alive" in sm[k] ? health(sm[k].thread_alive) : ""] };
      }));
    }
    body = section("adapters", "L2 adapters");
    if (r[1].status !== "fulfilled") fail(body, "/config/adapters", r[1].reason);
    else {
      const live = st && st.storage_manager ? st.storage_manager.l2_adapters || [] : [];
      table(body, "adapters-table", ["#", "type", "tier", "primary", "health", "breaker", "detail"], r[1].value.adapters.map(function (a) {
        const s = live[a.index] || {};
        // Only adapters with a circuit breaker (S3) report breaker_state.
        const b = s.breaker_state;
        const detail = Object.keys(s).filter(function (k) { return k !== "is_healthy" && k !== "breaker_state" && typeof s[k] !== "object"; })
          .map(function (k) { return k + "=" + s[k]; }).join(" ");
        return { id: String(a.index), cells: [a.index, a.type_name, a.tier, a.primary ? "yes" : "", "is_healthy" in s ? health(s.is_healthy) : "",
          b === undefined ? { k: "breaker_state", v: "", text: "no breaker", cls: "dim" } : { k: "breaker_state", v: b, cls: b === "closed" ? "ok" : "bad" }, detail] };
      }));
    }
    body = section("quota", "Quotas and usage");
    if (r[2].status !== "fulfilled") fail(body, "/quota", r[2].reason);
    else table(body, "quota-table", ["cache salt", "limit (GB)", "usage (GB)"], Object.keys(r[2].value.users).sort().map(function (k) {
      const u = r[2].value.users[k];
      return { id: k, cells: [k, { k: "limit_gb", v: u.limit_gb, text: num(u.limit_gb, 6) }, { k: "current_usage_gb", v: u.current_usage_gb, text: num(u.current_usage_gb, 6) }] };
    }));
    loops(r[3], r[5]);
    body = section("server-metrics", "Hits and throughput");
    const m = metricsOr(body, r[4]);
    if (!m) return;
    const P = "lmcache_mp_";
    const g = function (n) { return m.sums[P + n] || 0; };
    const rate = rates(m, now);
    const req = g("lookup_requested_tokens_total"), hit = g("lookup_hit_tokens_total");
    facts(body, "server-facts", [
      ["lookup_requested_tokens_total", req],
      ["lookup_hit_tokens_total", hit],
      ["hit_ratio", req ? hit / req : 0, req ? num(100 * hit / req, 1) + " %" : "no lookups"],
      ["l1_write_chunks_total", g("l1_write_chunks_total")],
      ["l1_read_chunks_total", g("l1_read_chunks_total")],
      ["l2_usage_bytes", g("l2_usage_bytes"), bytes(g("l2_usage_bytes"))],
    ]);
    chart("occupancy", "L1 and L2 occupancy (bytes)", ["L1", "L2"], [g("l1_memory_usage_bytes"), g("l2_usage_bytes")], now);
    chart("throughput", "Store and retrieve (chunks per second)", ["stored/s", "read/s"],
      [rate(P + "l1_write_chunks_total"), rate(P + "l1_read_chunks_total")], now);
    const dr = rate(P + "lookup_requested_tokens_total");
    chart("hits", "Lookup hit ratio (per poll)", ["hit ratio"], [dr ? rate(P + "lookup_hit_tokens_total") / dr : 0], now);
  }

  let running = false;
  async function tick() {
    if (running) return;
    running = true;
    state.errors = {};
    const now = Date.now();
    try {
      await (svc === "coordinator" ? coordinator(now) : server(now));
      const denied = Object.values(state.errors).some(function (e) { return e.startsWith("401"); });
      authState.textContent = denied ? "token needed" : (sessionStorage.getItem(KEY) ? "token set" : "");
      authState.className = denied ? "bad" : "";
      document.getElementById("updated").textContent = "updated " + new Date(now).toLocaleTimeString();
      state.ticks++;
    } finally {
      running = false;
    }
  }
  tick();
  setInterval(tick, every);
})();
