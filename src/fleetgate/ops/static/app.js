// fleetgate status page: polls /admin/status with the admin key (sessionStorage) and renders it.
"use strict";
(function () {
  const KEY = "fleetgate.adminKey";
  const POLL_MS = 1500;
  const $ = (id) => document.getElementById(id);
  let timer = null;

  // A ?key= in the address is moved to sessionStorage and removed from the address bar and history.
  const params = new URLSearchParams(window.location.search);
  if (params.has("key")) {
    sessionStorage.setItem(KEY, params.get("key"));
    params.delete("key");
    const rest = params.toString();
    history.replaceState(null, "", window.location.pathname + (rest ? "?" + rest : ""));
  }

  function el(tag, cls, text) {
    const node = document.createElement(tag);
    if (cls) node.className = cls;
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }
  const num = (v, d = 1) => (v === null || v === undefined ? "–" : Number(v).toFixed(d));
  const pct = (v) => (v === null || v === undefined ? "–" : (100 * v).toFixed(1) + "%");
  const secs = (v) => (v === null || v === undefined ? "–" : v < 1 ? (1000 * v).toFixed(0) + " ms" : v.toFixed(2) + " s");

  function bar(fraction, label) {
    const wrap = el("span");
    const b = el("span", "bar" + (fraction > 0.9 ? " hot" : ""));
    const fill = el("span");
    fill.style.width = Math.max(0, Math.min(1, fraction || 0)) * 100 + "%";
    b.appendChild(fill);
    wrap.appendChild(b);
    wrap.appendChild(document.createTextNode(label));
    return wrap;
  }

  function row(cells) {
    const tr = el("tr");
    for (const c of cells) {
      const td = el("td");
      if (c instanceof Node) td.appendChild(c);
      else td.textContent = c === null || c === undefined ? "–" : String(c);
      tr.appendChild(td);
    }
    return tr;
  }

  function fill(tableId, rows, empty) {
    const body = $(tableId).querySelector("tbody");
    body.replaceChildren(...rows);
    if (!rows.length) {
      const tr = el("tr");
      const td = el("td", "muted", empty);
      td.colSpan = 12;
      tr.appendChild(td);
      body.appendChild(tr);
    }
  }

  function attainment(v) {
    if (v === null || v === undefined) return el("span", "muted", "–");
    return el("span", v >= 0.99 ? "good" : v >= 0.9 ? "meh" : "poor", pct(v));
  }

  function renderReplicas(replicas) {
    fill("replicas", replicas.map((r) => {
      const state = r.draining ? "draining" : r.health;
      return row([
        el("strong", "", r.name), r.deployment, el("span", "badge " + state, state),
        bar(r.mu_load, pct(r.mu_load)),
        r.inflight_requests + " req · " + num(r.inflight_mu) + " MU",
        pct(r.cache_hit_rate), pct(r.kv_usage), secs(r.ttft_p95_s), r.completed + " / " + r.failed,
      ]);
    }), "No replicas.");
  }

  function renderDeployments(deps) {
    fill("deployments", deps.map((d) => row([
      el("strong", "", d.model), d.routable_replicas + " / " + d.replicas + " routable", num(d.capacity_mu_per_min),
      num(d.reserved_mu_per_min),
      bar(d.capacity_mu_per_min ? d.used_mu_per_min / d.capacity_mu_per_min : 0, num(d.used_mu_per_min)),
      secs(d.ttft_p50_s) + " / " + secs(d.ttft_p95_s), num(d.otps_p50), pct(d.error_rate), pct(d.rejection_rate),
    ])), "No deployments.");
  }

  function renderTenants(tenants) {
    fill("tenants", tenants.map((t) => {
      const reserved = t.reserved_mu_per_min;
      const used = reserved > 0 ? bar(t.used_mu_per_min / reserved, num(t.used_mu_per_min)) : num(t.used_mu_per_min);
      const att = el("span");
      att.appendChild(attainment(t.slo_attainment));
      att.appendChild(el("span", "muted", "  (TTFT ≤ " + secs(t.ttft_target_s) + ")"));
      return row([
        el("strong", "", t.name), t.priority, num(reserved), used, secs(t.ttft_p50_s) + " / " + secs(t.ttft_p95_s),
        att, num(t.otps_p50), pct(t.error_rate), pct(t.rejection_rate), t.requests,
      ]);
    }), "No tenants yet.");
  }

  const SVG = "http://www.w3.org/2000/svg";
  function svg(tag, attrs) {
    const n = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs)) n.setAttribute(k, v);
    return n;
  }

  function chart(history) {
    const W = 900, H = 160, P = 28;
    const root = svg("svg", { viewBox: `0 0 ${W} ${H}`, class: "chart", preserveAspectRatio: "none" });
    if (!history.length) return root;
    const t0 = Math.min(...history.map((h) => h.t)), t1 = 0;
    const ymax = Math.max(1, ...history.map((h) => Math.max(h.desired, h.ready))) + 1;
    const x = (t) => P + ((t - t0) / Math.max(1e-9, t1 - t0)) * (W - 2 * P);
    const y = (v) => H - P - (v / ymax) * (H - 2 * P);
    for (let v = 0; v <= ymax; v++) {
      root.appendChild(svg("line", { x1: P, x2: W - P, y1: y(v), y2: y(v), class: "grid" }));
      const label = svg("text", { x: 4, y: y(v) + 4 });
      label.textContent = String(v);
      root.appendChild(label);
    }
    const path = (key, scale) => history.map((h, i) => (i ? "L" : "M") + x(h.t).toFixed(1) + " " +
      y(scale(h[key])).toFixed(1)).join(" ");
    root.appendChild(svg("path", { d: path("utilisation", (u) => Math.min(u === null ? ymax : u, 1) * ymax), class: "util" }));
    root.appendChild(svg("path", { d: path("ready", (v) => v), class: "ready" }));
    root.appendChild(svg("path", { d: path("desired", (v) => v), class: "desired" }));
    const left = svg("text", { x: P, y: H - 6 });
    left.textContent = Math.round(t0) + " s";
    const right = svg("text", { x: W - P - 20, y: H - 6 });
    right.textContent = "now";
    root.appendChild(left);
    root.appendChild(right);
    return root;
  }

  function renderAutoscalers(list) {
    const box = $("autoscalers");
    if (!list.length) {
      box.replaceChildren(el("p", "muted", "No autoscaler runs in this gateway (replica counts are fixed)."));
      return;
    }
    const parts = [];
    for (const a of list) {
      parts.push(el("h3", "", a.deployment + " · desired " + a.desired));
      const legend = el("div", "legend");
      legend.append(el("span", "d", "— desired"), el("span", "r", "- - ready"), el("span", "u", "— utilisation (0..1)"));
      parts.push(legend, chart(a.history));
      const recent = a.decisions.slice(-6).reverse();
      const ul = el("ul", "muted");
      for (const d of recent) {
        ul.appendChild(el("li", "", Math.round(-d.t) + " s ago: " + d.from + " → " + d.to +
          " replicas (utilisation " + pct(d.utilisation) + ")"));
      }
      if (!recent.length) ul.appendChild(el("li", "", "no scaling decisions in the recorded history"));
      parts.push(ul);
    }
    box.replaceChildren(...parts);
  }

  // A pool over time: capacity, sold and used MU/min, one point per allocator decision (/admin/capacity).
  const SERIES = [["capacity_mu_per_min", "capacity"], ["sold_mu_per_min", "sold"], ["used_mu_per_min", "used"]];
  function poolChart(pool) {
    const W = 900, H = 160, P = 28;
    const history = pool.history || [];
    const root = svg("svg", { viewBox: `0 0 ${W} ${H}`, class: "chart pool", "data-pool": pool.pool,
      "data-points": String(history.length), preserveAspectRatio: "none" });
    if (!history.length) return root;
    const t0 = Math.min(...history.map((h) => h.t)), t1 = 0;
    const ymax = 1.1 * Math.max(1, ...history.map((h) => Math.max(...SERIES.map(([k]) => h[k] || 0))));
    const x = (t) => P + ((t - t0) / Math.max(1e-9, t1 - t0)) * (W - 2 * P);
    const y = (v) => H - P - (v / ymax) * (H - 2 * P);
    for (const v of [0, ymax / 2, ymax]) {
      root.appendChild(svg("line", { x1: P, x2: W - P, y1: y(v), y2: y(v), class: "grid" }));
      const label = svg("text", { x: 2, y: y(v) + 4 });
      label.textContent = v.toFixed(0);
      root.appendChild(label);
    }
    for (const [key, cls] of SERIES) {
      const d = history.map((h, i) => (i ? "L" : "M") + x(h.t).toFixed(1) + " " + y(h[key] || 0).toFixed(1)).join(" ");
      root.appendChild(svg("path", { d, class: cls, "data-series": cls, "data-last": String(history[history.length - 1][key] || 0) }));
    }
    const left = svg("text", { x: P, y: H - 6 });
    left.textContent = Math.round(t0) + " s";
    const right = svg("text", { x: W - P - 20, y: H - 6 });
    right.textContent = "now";
    root.append(left, right);
    return root;
  }

  // Latency headroom per tenant class (admission's, where it reports it), else a placeholder.
  function latencyCell(dep) {
    const classes = dep && dep.latency && dep.latency.classes;
    if (!classes) return el("span", "muted", "not reported");
    const parts = [];
    const target = (v, sign, fmt) => (v === null || v === undefined ? "" : " (" + sign + " " + fmt(v) + ")");
    for (const [cls, r] of Object.entries(classes)) {
      parts.push(cls + ": TTFT p95 " + secs(r.ttft_p95_s) + target(r.ttft_p95_s_target, "≤", secs) +
        ", OTPS p10 " + num(r.otps_p10) + target(r.otps_p10_target, "≥", num));
    }
    return el("span", "latency", parts.join(" · "));
  }

  function renderPools(cap) {
    const box = $("pools");
    const pools = (cap && cap.pools) || [];
    if (!pools.length) {
      box.replaceChildren(el("p", "muted", "No GPU pools configured."));
      return;
    }
    const byName = {};
    for (const d of (cap.deployments || [])) byName[d.deployment] = d;
    const parts = [];
    for (const p of pools) {
      if (!p.decided) {
        parts.push(el("h3", "", p.pool + " · " + p.gpus + " GPUs"),
          el("p", "muted", "No allocation to show yet: the pool's leader has not decided, or its published " +
            "picture has not reached this gateway (it needs the shared Redis store)."));
        continue;
      }
      const head = el("h3", "pool-head", p.pool + " · " + p.gpus_used + " / " + p.gpus + " GPUs in use (" +
        p.lent_replicas + " lent) · capacity " + num(p.capacity_mu_per_min) + " · sold " + num(p.sold_mu_per_min) +
        " · used " + num(p.used_mu_per_min) + " MU/min" + (p.used_scope === "fleet" ? " (every gateway)" : " (this gateway)"));
      head.dataset.used = String(p.used_mu_per_min);
      const legend = el("div", "legend");
      legend.append(el("span", "c", "— capacity"), el("span", "s", "- - sold"), el("span", "g", "— used (MU/min)"));
      const table = el("table", "pool-members");
      const thead = el("thead");
      thead.appendChild(row(["Deployment", "Replicas (lent)", "Floor", "Demand", "Capacity", "Sold", "Guaranteed",
        "Used", "Reclaimed", "Latency headroom"].map((h) => el("strong", "", h))));
      const tbody = el("tbody");
      for (const d of p.deployments) {
        tbody.appendChild(row([el("strong", "", d.deployment), d.replicas + " (" + d.lent_replicas + ")",
          d.floor_replicas, d.demand_replicas, num(d.capacity_mu_per_min), num(d.sold_mu_per_min),
          num(d.guaranteed_mu_per_min), num(d.used_mu_per_min), d.reclaimed_replicas, latencyCell(byName[d.deployment])]));
      }
      table.append(thead, tbody);
      parts.push(head, legend, poolChart(p), table);
    }
    box.replaceChildren(...parts);
  }

  async function pollCapacity(headers) {
    try {
      const resp = await fetch("/admin/capacity", { headers, cache: "no-store" });
      renderPools(resp.ok ? await resp.json() : null);
    } catch (err) {
      renderPools(null);
    }
  }

  function render(s) {
    renderReplicas(s.replicas);
    renderDeployments(s.deployments);
    renderTenants(s.tenants);
    renderAutoscalers(s.autoscalers || []);
    const healthy = s.replicas.filter((r) => r.health === "healthy" && !r.draining).length;
    $("summary").textContent = s.replicas.length + " replicas (" + healthy + " healthy) · " + s.tenants.length +
      " tenants · " + s.requests_total + " requests seen";
    $("updated").textContent = "updated " + new Date(s.generated_at * 1000).toLocaleTimeString();
    $("footer").textContent = "Figures cover the last " + s.window_s + " s (sliding window). MU = model units.";
  }

  function showLogin(message) {
    clearTimeout(timer);
    $("main").hidden = true;
    $("logout").hidden = true;
    $("login").hidden = false;
    $("login-error").textContent = message || "";
    $("summary").textContent = "signed out";
  }

  async function poll() {
    const key = sessionStorage.getItem(KEY);
    const headers = key ? { Authorization: "Bearer " + key } : {};
    try {
      const resp = await fetch("/admin/status", { headers, cache: "no-store" });
      if (resp.status === 401 || resp.status === 403) {
        sessionStorage.removeItem(KEY);
        showLogin(key ? "That key is not the admin key." : "");
        return;
      }
      if (!resp.ok) throw new Error("HTTP " + resp.status);
      render(await resp.json());
      await pollCapacity(headers);
      $("login").hidden = true;
      $("main").hidden = false;
      $("logout").hidden = !key;
    } catch (err) {
      $("updated").textContent = "update failed: " + err.message;
    }
    timer = setTimeout(poll, POLL_MS);
  }

  $("login-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    sessionStorage.setItem(KEY, $("key").value);
    $("key").value = "";
    poll();
  });
  $("logout").addEventListener("click", () => {
    sessionStorage.removeItem(KEY);
    showLogin("");
  });
  poll();
})();
