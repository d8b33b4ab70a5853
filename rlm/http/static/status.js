// rlm status page: polls GET /v1/partitions and /v1/history, draws per-partition offset bars and
// an SVG chart. No libraries. Every rendered number is also a data-* attribute (tests read them).
//
// Token: open /?token=T once — it is moved to sessionStorage (this tab only), removed from the
// address bar and sent as "Authorization: Bearer T". Without one, a 401 shows a token form.
// ?refresh=N sets the refresh interval in seconds (default 5).
(function () {
  "use strict";
  const KEY = "rlm.token";
  const params = new URLSearchParams(location.search);
  if (params.has("token")) {
    sessionStorage.setItem(KEY, params.get("token"));
    params.delete("token");
    const rest = params.toString();
    history.replaceState(null, "", location.pathname + (rest ? "?" + rest : "") + location.hash);
  }
  const refreshS = Math.max(1, Number(params.get("refresh")) || 5);
  const $ = (sel) => document.querySelector(sel);
  const body = document.body;
  $("#interval").textContent = String(refreshS);

  // ---- formatting ------------------------------------------------------------------------
  const nf = new Intl.NumberFormat("en-US");
  const fmtNum = (n) => (n === null || n === undefined ? "–" : nf.format(n));
  function fmtBytes(n) {
    if (n === null || n === undefined) return "–";
    const units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let i = 0; let v = Number(n);
    while (Math.abs(v) >= 1024 && i < units.length - 1) { v /= 1024; i++; }
    return (i === 0 ? String(Math.round(v)) : v.toFixed(v < 10 ? 2 : v < 100 ? 1 : 0)) + " " + units[i];
  }
  function fmtAge(ms) {
    if (!ms) return "0 s";
    const s = ms / 1000;
    if (s < 60) return Math.round(s) + " s";
    if (s < 3600) return Math.floor(s / 60) + " min " + (Math.round(s % 60) ? Math.round(s % 60) + " s" : "");
    if (s < 86400) return Math.floor(s / 3600) + " h " + Math.round((s % 3600) / 60) + " min";
    return Math.floor(s / 86400) + " d " + Math.round((s % 86400) / 3600) + " h";
  }
  // A retention limit of one tier (docs/topic-policy.md §1): time and/or size, -1 = unlimited.
  function fmtLimit(ms, bytes) {
    const parts = [];
    if (typeof ms === "number" && ms >= 0) parts.push(fmtAge(ms).trim().replace(/ 0 (h|min|s)$/, ""));
    if (typeof bytes === "number" && bytes >= 0) parts.push(fmtBytes(bytes));
    return parts.length ? parts.join(" / ") : "unlimited";
  }
  const fmtTime = (ms, seconds) => new Date(ms).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit",
    second: seconds ? "2-digit" : undefined, hourCycle: "h23" });
  function el(tag, attrs, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined) continue;
      if (k === "class") e.className = v; else if (k === "text") e.textContent = v; else e.setAttribute(k, v);
    }
    for (const c of children) if (c !== null && c !== undefined) e.append(c);
    return e;
  }

  // ---- API ---------------------------------------------------------------------------------
  class Unauthorized extends Error {}
  async function api(path) {
    const token = sessionStorage.getItem(KEY);
    const headers = { Accept: "application/json" };
    if (token) headers.Authorization = "Bearer " + token;
    const resp = await fetch(path, { headers, cache: "no-store" });
    if (resp.status === 401) throw new Unauthorized(token ? "the token was rejected" : "no token given");
    if (!resp.ok) {
      let reason = resp.statusText;
      try { reason = (await resp.json()).error.reason; } catch (_) { /* not JSON */ }
      throw new Error(path + ": HTTP " + resp.status + " " + reason);
    }
    return resp.json();
  }

  // ---- ranges of one partition's offset space (all half-open [start, end)) -------------------
  // remote = [remote_log_start_offset, highest_tiered_offset + 1); local = [local_log_start_offset,
  // log_end_offset). Offsets in both tiers may be deleted locally; local offsets past the remote
  // end are waiting to be copied up to eligible_end_offset and not yet eligible after it. Waiting
  // offsets may start below the local start (pending_start_offset): segments the broker deleted
  // that a pin on sight still holds — waiting, not lost.
  function ranges(r) {
    const out = [];
    const add = (kind, s, e) => { if (s !== null && e !== null && e > s) out.push({ kind, start: s, end: e }); };
    const remote = r.highest_tiered_offset >= 0 && r.remote_log_start_offset !== null
      ? [r.remote_log_start_offset, r.highest_tiered_offset + 1] : null;
    const local = r.local_log_start_offset !== null && r.log_end_offset !== null
      ? [r.local_log_start_offset, r.log_end_offset] : null;
    const pinned = local && r.pending_start_offset !== null && r.pending_start_offset !== undefined
      && r.pending_start_offset < local[0] ? r.pending_start_offset : null;
    if (remote && local) {
      add("local-only", local[0], Math.min(local[1], remote[0]));          // expired remotely
      add("remote-only", remote[0], Math.min(remote[1], local[0]));
      add("gap", remote[1], pinned !== null ? Math.min(pinned, local[0]) : local[0]); // deleted before tiered
      add("both", Math.max(remote[0], local[0]), Math.min(remote[1], local[1]));
    } else if (remote) {
      add("remote-only", remote[0], remote[1]);
    }
    if (local) {
      const from = pinned !== null ? pinned : remote ? Math.max(local[0], remote[1]) : local[0];
      const elig = r.eligible_end_offset === null || r.eligible_end_offset === undefined ? from : r.eligible_end_offset;
      const mid = Math.min(Math.max(elig, from), local[1]);
      add("pending", from, mid);
      add("not-eligible", mid, local[1]);
    }
    return carveGaps(out, r.gaps);
  }

  // Recorded gaps (docs/visibility.md, "Gaps"): offsets the broker deleted before they were
  // tiered, cut out of whatever range holds them (a hole between remote segments included).
  function carveGaps(out, gaps) {
    let rs = out;
    for (const g of gaps || []) {
      const s = g.first_offset, e = g.last_offset + 1, next = [];
      for (const x of rs) {
        if (x.kind === "gap" || e <= x.start || s >= x.end) { next.push(x); continue; }
        if (x.start < s) next.push({ kind: x.kind, start: x.start, end: s });
        if (e < x.end) next.push({ kind: x.kind, start: e, end: x.end });
      }
      if (!next.some((x) => x.kind === "gap" && x.start <= s && x.end >= e)) next.push({ kind: "gap", start: s, end: e });
      rs = next.sort((a, b) => a.start - b.start);
    }
    return rs;
  }

  function partitionRow(r) {
    const rs = ranges(r);
    const lo = rs.length ? rs[0].start : 0;
    const hi = rs.length ? rs[rs.length - 1].end : 0;
    const bar = el("div", { class: "bar", role: "img",
      "aria-label": rs.map((x) => x.kind + " " + x.start + "–" + (x.end - 1)).join(", ") || "empty" });
    const names = { "remote-only": "remote only", both: "in both tiers (safe to delete locally)",
      pending: "waiting to copy", "not-eligible": "not yet eligible", gap: "deleted locally before tiered",
      "local-only": "local only (expired remotely)" };
    for (const x of rs) {
      bar.append(el("div", { class: "seg", "data-range": x.kind, "data-start": x.start, "data-end": x.end,
        style: "flex-grow:" + (x.end - x.start),
        title: names[x.kind] + ": offsets " + fmtNum(x.start) + " – " + fmtNum(x.end - 1) +
          " (" + fmtNum(x.end - x.start) + ")" }));
    }
    if (r.high_watermark !== null && hi > lo && r.high_watermark >= lo && r.high_watermark <= hi) {
      const pct = ((r.high_watermark - lo) / (hi - lo)) * 100;
      bar.append(el("div", { class: "hw", style: "left:calc(" + pct.toFixed(3) + "% - 1px)",
        title: "high watermark " + fmtNum(r.high_watermark) }));
    }
    const tiered = r.highest_tiered_offset >= 0 ? "safe to delete ≤ " + fmtNum(r.highest_tiered_offset) : "nothing tiered yet";
    const offsets = el("div", { class: "offsets" },
      el("span", { text: fmtNum(lo) }),
      el("span", { class: "mid", text: tiered + (r.high_watermark !== null ? " · HW " + fmtNum(r.high_watermark) : "") }),
      el("span", { text: "LEO " + fmtNum(r.log_end_offset) }));

    const lagSegs = r.copy_lag_segments || 0;
    const lag = el("div", { class: "lag" },
      el("div", { class: "big", text: lagSegs ? fmtBytes(r.copy_lag_bytes) : "up to date" }),
      el("div", { class: "small", text: lagSegs
        ? lagSegs + (lagSegs === 1 ? " segment" : " segments") + " · waiting " + fmtAge(r.copy_lag_age_ms)
          + (r.pinned_segments ? " · " + r.pinned_segments + " pinned" : "")
          + (r.retention_margin_ms !== null && r.retention_margin_ms !== undefined ? " · broker deletes "
            + (r.retention_margin_ms < 0 ? "now" : "in " + fmtAge(r.retention_margin_ms)) : "")
          + (r.pin_refused_offset !== null && r.pin_refused_offset !== undefined ? " · not pinned from "
            + fmtNum(r.pin_refused_offset) : "")
        : "" }));

    const quarantined = Object.keys(r.quarantined || {}).map(Number).sort((a, b) => a - b);
    // r.quarantine (docs/broker-files.md): the file, byte position and cause of each quarantine.
    const q = (r.quarantine || [])[0] || null;
    const where = q ? q.file.split("/").pop() + (q.position !== null ? " @ byte " + fmtNum(q.position) : "")
      + " (" + q.cause.replace("_", " ") + ")" : "";
    const gaps = r.gaps || [];
    const gapText = gaps.map((g) => fmtNum(g.first_offset) + " – " + fmtNum(g.last_offset)).join(", ");
    const problem = r.last_error || (quarantined.length ? r.quarantined[String(quarantined[0])] : null)
      || (gaps.length ? "offsets " + gapText + " were deleted by the broker before they were tiered: "
        + "not available in any tier" : null);
    const headline = quarantined.length
      ? "Quarantined: segment " + quarantined.map(fmtNum).join(", ") + (where ? " · " + where : "")
      : !r.last_error && gaps.length ? "Gap: " + gapText : "Copy failing";
    // docs/topic-policy.md: a partition the topic policy leaves alone says why; a compacted
    // (archived) one names the local segments the cleaner rewrote after tiering.
    const excluded = r.tiered === false;
    const rewrites = (r.compaction || []).length;
    const status = el("div", { class: "status" }, problem
      ? el("div", {}, el("div", { class: "err", text: headline }),
        el("div", { class: "errmsg", title: problem, text: problem.replace(/^\/\S*?: /, "") }))
      : excluded
        ? el("div", {}, el("div", { class: "muted", text: "Not tiered" }),
          el("div", { class: "errmsg", title: r.excluded_reason || "", text: r.excluded_reason || "" }))
        : el("span", { class: "ok", text: rewrites ? "OK · compacted after tiering: " + rewrites
          + (rewrites === 1 ? " segment" : " segments") : "OK" }));

    // docs/cluster.md: this node's role; a follower shows who copies and how far its index lags.
    const cluster = r.leadership_source && r.leadership_source !== "always";
    const roleText = !cluster ? "" : r.role === "leader" ? "leader"
      : (r.role === "follower" ? "follower of node " + r.leader : "leader unknown")
        + (r.sync_lag_offsets ? " · index " + fmtNum(r.sync_lag_offsets) + " behind the store" : "");
    // docs/topic-policy.md §4: what each tier keeps — local = the broker's configs, remote = rlm's.
    const pol = r.policy || null;
    const v = (s) => (s ? s.value : null);
    const retention = pol && !excluded ? el("span", { class: "ret",
      text: "keeps: local " + fmtLimit(v(pol.local_retention_ms), v(pol.local_retention_bytes))
        + " · remote " + fmtLimit(v(pol.retention_ms), v(pol.retention_bytes)),
      title: [["local by time", pol.local_retention_ms], ["local by size", pol.local_retention_bytes],
        ["remote by time", pol.retention_ms], ["remote by size", pol.retention_bytes]]
        .filter((x) => x[1]).map((x) => x[0] + ": " + x[1].value + " — " + x[1].from).join("\n") }) : null;
    const name = el("div", { class: "name" }, r.topic, el("span", { class: "p", text: " / " + r.partition }),
      el("span", { class: "sz", text: fmtBytes(r.remote_bytes) + " remote · " + fmtBytes(r.local_bytes) + " local" }),
      retention, cluster ? el("span", { class: "role", "data-role": r.role, text: roleText }) : null);
    return el("div", {
      class: "partition", "data-topic": r.topic, "data-partition": r.partition,
      "data-state": problem ? "error" : excluded ? "excluded" : lagSegs ? "lagging" : "ok",
      "data-excluded-reason": excluded ? r.excluded_reason : null, "data-compacted-segments": rewrites,
      "data-log-start": r.log_start_offset, "data-local-start": r.local_log_start_offset,
      "data-log-end": r.log_end_offset, "data-hw": r.high_watermark,
      "data-remote-start": r.remote_log_start_offset, "data-highest-tiered": r.highest_tiered_offset,
      "data-eligible-end": r.eligible_end_offset, "data-lag-bytes": r.copy_lag_bytes,
      "data-lag-segments": lagSegs, "data-lag-age-ms": r.copy_lag_age_ms, "data-error": problem,
      "data-quarantine-file": q ? q.file : null, "data-quarantine-position": q ? q.position : null,
      "data-quarantine-cause": q ? q.cause : null,
      "data-gaps": gaps.length ? gaps.map((g) => g.first_offset + "-" + g.last_offset).join(",") : null,
      "data-role": r.role || null, "data-leader": r.leader, "data-sync-lag": r.sync_lag_offsets,
      "data-diverged-from": r.diverged_from_offset,
      "data-local-retention-ms": pol ? v(pol.local_retention_ms) : null,
      "data-local-retention-bytes": pol ? v(pol.local_retention_bytes) : null,
      "data-retention-ms": pol ? v(pol.retention_ms) : null,
      "data-retention-bytes": pol ? v(pol.retention_bytes) : null,
      "data-pinned-segments": r.pinned_segments, "data-pinned-bytes": r.pinned_bytes,
      "data-pin-refused-offset": r.pin_refused_offset,
      "data-retention-margin-ms": r.retention_margin_ms, "data-retention-deadline-ms": r.retention_deadline_ms,
    }, name, el("div", {}, bar, offsets), lag, status);
  }

  function card(key, value, sub, state) {
    const c = document.querySelector('[data-total="' + key + '"]');
    c.querySelector(".value").textContent = value;
    c.querySelector(".sub").textContent = sub || "";
    if (state) c.setAttribute("data-state", state); else c.removeAttribute("data-state");
    return c;
  }

  // docs/topic-policy.md §8: the smallest margin before the broker's retention may delete a
  // segment not yet tiered; "warn" below tiering.deadline_warn_ms, "bad" once overdue.
  function renderDeadline(rows) {
    const timed = rows.filter((r) => r.retention_margin_ms !== null && r.retention_margin_ms !== undefined);
    const near = timed.reduce((a, r) => (a === null || r.retention_margin_ms < a.retention_margin_ms ? r : a), null);
    const m = near ? near.retention_margin_ms : null;
    card("deadline", near ? (m < 0 ? "overdue " + fmtAge(-m) : "in " + fmtAge(m)) : "none",
      near ? near.topic + " / " + near.partition + " · segment " + fmtNum(near.retention_deadline_offset)
        + " by " + near.retention_deadline_cause + " retention" : "no untiered segment the broker will delete",
      !near ? "ok" : m < 0 ? "bad" : near.retention_margin_low ? "warn" : "ok")
      .setAttribute("data-value", near ? m : "");
  }

  function renderPartitions(rows) {
    rows.sort((a, b) => (a.topic < b.topic ? -1 : a.topic > b.topic ? 1 : a.partition - b.partition));
    const box = $("#partitions");
    box.replaceChildren(...(rows.length ? rows.map(partitionRow)
      : [el("p", { class: "muted empty", text: "No partitions found in the configured log dirs." })]));
    $("#count").textContent = rows.length ? "(" + rows.length + ")" : "";
    const sum = (f) => rows.reduce((a, r) => a + (Number(r[f]) || 0), 0);
    const errors = rows.filter((r) => r.last_error || Object.keys(r.quarantined || {}).length).length;
    const lagSegs = sum("copy_lag_segments");
    const oldest = rows.reduce((a, r) => Math.max(a, r.copy_lag_age_ms || 0), 0);
    const notTiered = rows.filter((r) => r.tiered === false).length;
    card("partitions", fmtNum(rows.length), (errors ? errors + " with errors" : "all OK")
      + (notTiered ? " · " + notTiered + " not tiered" : ""), errors ? "bad" : null)
      .setAttribute("data-value", rows.length);
    card("remote", fmtBytes(sum("remote_bytes")), fmtNum(sum("remote_segments")) + " segments")
      .setAttribute("data-value", sum("remote_bytes"));
    card("local", fmtBytes(sum("local_bytes")), fmtNum(sum("local_segments")) + " segments")
      .setAttribute("data-value", sum("local_bytes"));
    card("lag", lagSegs ? fmtBytes(sum("copy_lag_bytes")) : "none", lagSegs ? lagSegs + " segments" : "everything eligible is remote",
      lagSegs ? "warn" : "ok").setAttribute("data-value", sum("copy_lag_bytes"));
    card("age", lagSegs ? fmtAge(oldest) : "–", lagSegs ? "since its segment rolled" : "nothing waiting")
      .setAttribute("data-value", oldest);
    renderDeadline(rows);
    const health = $("#health");
    const h = errors ? "errors" : lagSegs ? "copying" : "healthy";
    health.setAttribute("data-health", h);
    health.textContent = errors ? errors + " partition" + (errors > 1 ? "s" : "") + " failing" : lagSegs ? "copying" : "healthy";
  }

  // ---- chart (inline SVG) ------------------------------------------------------------------
  const SVG = "http://www.w3.org/2000/svg";
  function svg(tag, attrs) {
    const e = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
    return e;
  }
  function niceMax(v) {
    if (v <= 0) return 1;
    const p = Math.pow(10, Math.floor(Math.log10(v)));
    for (const m of [1, 2, 2.5, 5, 10]) if (m * p >= v) return m * p;
    return 10 * p;
  }
  let lastHistory = null;
  function renderChart(hist) {
    lastHistory = hist;
    const box = $("#chart");
    const samples = hist.samples || [];
    box.setAttribute("data-samples", samples.length);
    const last = samples[samples.length - 1];
    const rate = last && last.copy_bytes_per_sec !== null ? last.copy_bytes_per_sec : null;
    card("rate", rate === null ? "–" : fmtBytes(rate) + "/s",
      last ? fmtBytes(last.copied_bytes) + " copied since start" : "no samples yet").setAttribute("data-value", rate ?? "");
    if (samples.length < 2) {
      box.replaceChildren(el("div", { class: "empty", text: hist.interval_s
        ? "Collecting… one sample every " + hist.interval_s + " s" : "No history: the server runs without a sampler." }));
      return;
    }
    const W = box.clientWidth || 800, H = box.clientHeight || 170;
    const L = 64, R = 64, T = 10, B = 22;
    const t1 = last.t, t0 = Math.max(samples[0].t, t1 - (hist.window_s || 3600) * 1000);
    const pts = samples.filter((s) => s.t >= t0);
    const rMax = niceMax(Math.max(...pts.map((s) => s.copy_bytes_per_sec || 0)));
    const lMax = niceMax(Math.max(...pts.map((s) => s.lag_bytes || 0)));
    const x = (t) => L + ((t - t0) / Math.max(1, t1 - t0)) * (W - L - R);
    const yR = (v) => T + (1 - v / rMax) * (H - T - B);
    const yL = (v) => T + (1 - v / lMax) * (H - T - B);
    const s = svg("svg", { viewBox: "0 0 " + W + " " + H, role: "img", "aria-label": "copy throughput and lag" });
    for (let i = 0; i <= 4; i++) {
      const y = T + (i / 4) * (H - T - B);
      s.append(svg("line", { class: "grid", x1: L, x2: W - R, y1: y, y2: y }));
      const lt = svg("text", { class: "axis", x: L - 6, y: y + 4, "text-anchor": "end" });
      lt.textContent = fmtBytes(rMax * (1 - i / 4)) + "/s";
      const rt = svg("text", { class: "axis", x: W - R + 6, y: y + 4 });
      rt.textContent = fmtBytes(lMax * (1 - i / 4));
      s.append(lt, rt);
    }
    const ticks = Math.min(6, Math.max(2, Math.floor((W - L - R) / 120)));
    for (let i = 0; i <= ticks; i++) {
      const t = t0 + (i / ticks) * (t1 - t0);
      const tt = svg("text", { class: "axis", x: x(t), y: H - 5, "text-anchor": i === 0 ? "start" : i === ticks ? "end" : "middle" });
      tt.textContent = fmtTime(t, t1 - t0 < 15 * 60 * 1000);
      s.append(tt);
    }
    // Throughput is an average over each sampling interval: drawn as steps.
    let d = "";
    for (let i = 1; i < pts.length; i++) {
      const v = pts[i].copy_bytes_per_sec;
      if (v === null) continue;
      const xa = x(pts[i - 1].t).toFixed(1), xb = x(pts[i].t).toFixed(1), y = yR(v).toFixed(1);
      d += (d ? " L" : "M" + xa + " " + yR(0) + " L") + xa + " " + y + " L" + xb + " " + y;
    }
    if (d) {
      d += " L" + x(pts[pts.length - 1].t).toFixed(1) + " " + yR(0) + " Z";
      s.append(svg("path", { d, fill: "var(--rate)", "fill-opacity": "0.3", stroke: "var(--rate)", "stroke-width": "1.5", "data-series": "rate" }));
    }
    let lag = "";
    pts.forEach((p, i) => { lag += (i ? " L" : "M") + x(p.t).toFixed(1) + " " + yL(p.lag_bytes).toFixed(1); });
    s.append(svg("path", { d: lag, fill: "none", stroke: "var(--lag)", "stroke-width": "2", "data-series": "lag" }));
    box.replaceChildren(s);
  }
  window.addEventListener("resize", () => { if (lastHistory) renderChart(lastHistory); });

  // ---- refresh loop ------------------------------------------------------------------------
  function showAuth(reason) {
    $("#auth").hidden = false;
    $("#auth-reason").textContent = "Last attempt: " + reason + ".";
    const health = $("#health");
    health.setAttribute("data-health", "unauthorized");
    health.textContent = "token needed";
    body.setAttribute("data-state", "unauthorized");
  }
  // The store's health (GET /v1/store, answered from memory): a banner while it is unreachable.
  function renderStore(st) {
    const b = $("#store");
    const state = st ? st.status : "unknown";
    b.setAttribute("data-store", state);
    if (state !== "unreachable") { b.hidden = true; return; }
    const since = new Date(st.unreachable_since_ms).toLocaleTimeString();
    b.textContent = "Remote store" + (st.backend ? " (" + st.backend + ")" : "") + " unreachable since " +
      since + " (" + fmtAge(st.unreachable_for_ms) + "): " + (st.last_error || "no answer") +
      ". Remote reads fail fast (503); tiering resumes by itself when it answers again.";
    b.hidden = false;
  }
  // Pins on sight (GET /v1/pins, from memory; docs/operations.md): the bytes rlm holds of the
  // broker's files against tiering.max_pinned_bytes, and a banner while a log dir is at its bound.
  function renderPins(rows) {
    const b = $("#pins");
    rows = rows || [];
    const held = rows.reduce((a, r) => a + (Number(r.pinned_bytes) || 0), 0);
    const segs = rows.reduce((a, r) => a + (Number(r.pinned_segments) || 0), 0);
    const full = rows.filter((r) => r.bound_reached);
    const bounds = rows.map((r) => r.max_pinned_bytes).filter((m) => m !== null && m !== undefined);
    const bound = bounds.length && bounds.every((m) => m >= 0) ? bounds.reduce((a, m) => a + m, 0) : null;
    card("pinned", fmtBytes(held), fmtNum(segs) + (segs === 1 ? " segment" : " segments")
      + (bound !== null ? " · bound " + fmtBytes(bound) : bounds.length ? " · unbounded" : ""),
      full.length ? "warn" : null).setAttribute("data-value", held);
    b.setAttribute("data-bound-reached", full.length ? "true" : "false");
    if (!full.length) { b.hidden = true; return; }
    b.textContent = full.map((r) => "Pins of " + r.log_dir + " reached tiering.max_pinned_bytes ("
      + fmtBytes(r.pinned_bytes) + " of " + fmtBytes(r.max_pinned_bytes) + ", since "
      + new Date(r.bound_reached_since_ms).toLocaleTimeString() + "): pending segments of "
      + r.partitions_refused + (r.partitions_refused === 1 ? " partition are" : " partitions are")
      + " not pinned, and the broker may delete them before they are tiered.").join(" ");
    b.hidden = false;
  }
  // Deleted topics (GET /v1/deleted-topics, as the last GC found them; docs/topic-identity.md):
  // partitions whose remote data waits for tiering.deleted_topic_grace_ms, and when the next goes.
  function renderDeleted(rows) {
    rows = rows || [];
    const topics = new Set(rows.map((r) => r.topic));
    const due = rows.map((r) => r.delete_after_ms).filter((t) => t !== null && t !== undefined);
    const next = due.length ? Math.min(...due) : null;
    const kept = rows.length - due.length;
    card("deleted", fmtNum(topics.size), !rows.length ? "none waiting"
      : fmtNum(rows.length) + (rows.length === 1 ? " partition" : " partitions") + " · "
        + fmtBytes(rows.reduce((a, r) => a + (Number(r.bytes) || 0), 0))
        + (next !== null ? " · next deleted " + new Date(next).toLocaleString() : "")
        + (kept ? " · " + fmtNum(kept) + " kept" : ""))
      .setAttribute("data-value", rows.length);
  }
  let timer = null;
  async function refresh() {
    clearTimeout(timer);
    try {
      const optional = (e) => { if (e instanceof Unauthorized) throw e; return null; };
      const [rows, hist, st, pins, deleted] = await Promise.all([api("v1/partitions"), api("v1/history"),
        api("v1/store").catch(optional), api("v1/pins").catch(optional),
        api("v1/deleted-topics").catch(optional)]);
      $("#auth").hidden = true;
      $("#problem").hidden = true;
      renderStore(st);
      renderPins(pins);
      renderDeleted(deleted);
      renderPartitions(rows);
      renderChart(hist);
      const now = new Date();
      $("#updated").textContent = "updated " + now.toLocaleTimeString();
      body.setAttribute("data-state", "ready");
      body.setAttribute("data-updated", String(now.getTime()));
      body.setAttribute("data-refreshes", String(Number(body.getAttribute("data-refreshes")) + 1));
    } catch (err) {
      if (err instanceof Unauthorized) {
        showAuth(err.message);
        return; // wait for a token
      }
      const p = $("#problem");
      p.hidden = false;
      p.textContent = "Cannot load status: " + err.message + " — retrying every " + refreshS + " s.";
      $("#health").setAttribute("data-health", "offline");
      $("#health").textContent = "unreachable";
      body.setAttribute("data-state", "offline");
    }
    timer = setTimeout(refresh, refreshS * 1000);
  }
  $("#auth-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const t = $("#auth-token").value.trim();
    if (t) sessionStorage.setItem(KEY, t);
    refresh();
  });
  $("#forget").addEventListener("click", (ev) => {
    ev.preventDefault();
    sessionStorage.removeItem(KEY);
    refresh();
  });
  refresh();
})();
