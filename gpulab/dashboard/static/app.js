// The dashboard page: Preact components over one signal per view.
//
// The server sends a snapshot of every view, then patches ({k, v} or {call}) as the
// cluster changes (/api/stream, server-sent events). Each view lives in its own signal, and
// each card reads only its own, so a change to one node re-renders that node's card
// only; a panel re-renders when views are added or removed. Mermaid draws the call chain.
import { h, render } from "preact";
import { useEffect, useRef } from "preact/hooks";
import { batch, signal } from "@preact/signals";
import htm from "htm";

const html = htm.bind(h);

// ------------------------------------------------------------------ state

const KINDS = ["node", "pending", "cq", "vq", "pg", "op"];
const CALLS_KEPT = 400;
const CALLS_DRAWN = 40;

const views = new Map(); // "node:gpu-a100" -> signal(view)
const keys = Object.fromEntries(KINDS.map((kind) => [kind, signal([])]));
const status = signal(null); // API server reachability, installed panels
const calls = signal([]); // the call chain, oldest first
const lanes = signal([]);
const stream = signal("connecting"); // connecting | open | lost
const explained = signal(null); // the pending pod whose details are open
const chainNamespace = signal("");

// For the browser tests and the benchmark: renders per card kind, patches received.
window.gpulab = { renders: { node: 0, pending: 0 }, patches: 0, snapshots: 0 };

const kindOf = (key) => key.slice(0, key.indexOf(":"));

function applyView(key, value, added) {
  if (key === "status") {
    status.value = value;
    return;
  }
  const held = views.get(key);
  if (value === null) {
    if (held) {
      views.delete(key);
      added.add(kindOf(key));
    }
  } else if (held) {
    held.value = value;
  } else {
    views.set(key, signal(value));
    added.add(kindOf(key));
  }
}

function relist(kinds) {
  for (const kind of kinds) {
    keys[kind].value = [...views.keys()].filter((k) => kindOf(k) === kind).sort();
  }
}

function addCalls(items) {
  // a call replaces its earlier self (its Event repeated) and the calls merged into it
  const gone = new Set(items.flatMap((item) => [item.call.id, ...item.replaces]));
  const latest = new Map(items.map((item) => [item.call.id, item.call]));
  for (const item of items) for (const id of item.replaces) latest.delete(id);
  const all = calls.value.filter((c) => !gone.has(c.id)).concat([...latest.values()]);
  all.sort((a, b) => (a.time < b.time ? -1 : a.time > b.time ? 1 : 0));
  calls.value = all.slice(-CALLS_KEPT);
}

function connect() {
  const source = new EventSource("/api/stream");
  source.addEventListener("snapshot", (e) => {
    const snap = JSON.parse(e.data);
    batch(() => {
      views.clear();
      for (const [k, v] of Object.entries(snap.views)) applyView(k, v, new Set());
      relist(KINDS);
      lanes.value = snap.lanes;
      calls.value = snap.calls;
      stream.value = "open";
    });
    window.gpulab.snapshots++;
  });
  source.addEventListener("patch", (e) => {
    const items = JSON.parse(e.data);
    const added = new Set();
    const fresh = [];
    batch(() => {
      for (const item of items) {
        if (item.call) fresh.push(item);
        else applyView(item.k, item.v, added);
      }
      relist(added);
      if (fresh.length) addCalls(fresh);
    });
    window.gpulab.patches += items.length;
  });
  source.onerror = () => {
    stream.value = "lost"; // EventSource reconnects by itself and gets a new snapshot
  };
}

// ------------------------------------------------------------------ helpers

const tail = (uuid) => (uuid ? "…" + uuid.slice(-8) : "");
const podName = (key) => key.slice(key.indexOf("/") + 1);
const pct = (part, whole) => (whole > 0 ? Math.min(100, (100 * part) / whole) : 0);
const num = (x) => (Number.isInteger(x) ? String(x) : x.toFixed(1));

function Installed({ flag, panel, children }) {
  if (flag === undefined || flag === null) return html`<p class="empty">…</p>`;
  if (!flag) {
    return html`<p class="not-installed" data-panel=${panel}>not installed</p>`;
  }
  return children;
}

// ------------------------------------------------------------------ banner and header

function Banner() {
  const st = status.value;
  if (stream.value === "lost") {
    return html`<div class="banner" id="banner">
      The dashboard server is unreachable: reconnecting…
    </div>`;
  }
  if (st && st.api.up === false) {
    return html`<div class="banner" id="banner">
      The API server is unreachable (${st.api.error}). Showing what was last seen; the
      page catches up when it returns.
    </div>`;
  }
  return null;
}

function Header() {
  const st = status.value;
  const state = !st || st.api.up === null ? "connecting" : st.api.up ? "live" : "down";
  return html`<header>
    <h1>GPU Scheduling Lab</h1>
    <span class="server">${st ? st.server : ""}</span>
    <span class=${"state " + state} id="state">${state}</span>
  </header>`;
}

// ------------------------------------------------------------------ nodes x GPUs

function Nodes() {
  const list = keys.node.value;
  if (!list.length) return html`<p class="empty">no nodes</p>`;
  return html`<div class="nodes">
    ${list.map((k) => html`<${NodeCard} key=${k} view=${views.get(k)} />`)}
  </div>`;
}

function NodeCard({ view }) {
  window.gpulab.renders.node++;
  const n = view.value;
  const res = Object.entries(n.resources)
    .map(([r, [cap, alloc]]) => `${r.replace("nvidia.com/", "")} ${alloc}/${cap}`)
    .join(" · ");
  return html`<div class=${"node" + (n.ready ? "" : " not-ready")} data-node=${n.name}>
    <div class="node-head">
      <b>${n.name}</b>
      <span class="muted">${res || "no GPUs"}</span>
      ${n.unhealthyUnidentified > 0 &&
      html`<span class="sick-note">${n.unhealthyUnidentified} unhealthy GPU(s) not named</span>`}
    </div>
    <div class="gpus">
      ${n.gpus.map((g) => html`<${GpuBox} key=${g.index} gpu=${g} replicas=${n.replicas} />`)}
    </div>
  </div>`;
}

function GpuBox({ gpu, replicas }) {
  const title = `${gpu.product} ${gpu.uuid}` + (gpu.numa !== null ? ` NUMA ${gpu.numa}` : "");
  return html`<div
    class=${"gpu" + (gpu.healthy ? "" : " sick")}
    data-uuid=${gpu.uuid}
    data-index=${gpu.index}
    title=${title}
  >
    <div class="gpu-head">
      <span>#${gpu.index} ${gpu.product.replace(/^NVIDIA[- ]/, "")}</span>
      <span class="uuid">${tail(gpu.uuid)}</span>
    </div>
    ${gpu.mig.length > 0
      ? html`<div class="migs">
          ${gpu.mig.map(
            (m) => html`<div
              class=${"mig" + (m.pod ? " used" : "")}
              style=${{ flexGrow: m.mem }}
              title=${`${m.profile} ${m.uuid}` + (m.pod ? ` held by ${m.pod}` : "")}
              data-pod=${m.pod || ""}
            >
              ${m.profile}
            </div>`,
          )}
        </div>`
      : html`<${MemoryBar} gpu=${gpu} />`}
    ${gpu.whole.length > 0 &&
    html`<div class="holders">
      ${replicas > 1 ? `${gpu.whole.length}/${replicas} replicas: ` : "whole GPU: "}
      ${gpu.whole.map((p) => html`<span class="holder" data-pod=${p}>${podName(p)}</span>`)}
    </div>`}
    ${!gpu.healthy && html`<div class="health">✖ ${gpu.healthNote}</div>`}
  </div>`;
}

function MemoryBar({ gpu }) {
  const label = gpu.split
    ? `${gpu.usedMem}/${gpu.mem} MiB · ${gpu.usedCores}% cores · ${gpu.slices.length}/${gpu.split}`
    : `${gpu.mem} MiB`;
  return html`<div class="bar" title=${label}>
      ${gpu.slices.map(
        (s) => html`<div
          class=${"slice" + (s.phase === "success" ? "" : " allocating")}
          style=${{ width: pct(s.mem, gpu.mem) + "%" }}
          data-pod=${s.pod}
          title=${`${s.pod}: ${s.mem} MiB, ${s.cores}% cores (${s.phase || "bound"})`}
        >
          ${podName(s.pod)} ${s.cores}%
        </div>`,
      )}
    </div>
    <div class="muted small">${label}</div>`;
}

// ------------------------------------------------------------------ pending pods

function Pending() {
  const list = keys.pending.value;
  if (!list.length) return html`<p class="empty">no pending pods</p>`;
  return html`<table class="pending">
    <thead><tr><th>pod</th><th>scheduler</th><th>why it waits</th></tr></thead>
    <tbody>${list.map((k) => html`<${PendingRow} key=${k} view=${views.get(k)} />`)}</tbody>
  </table>`;
}

function PendingRow({ view }) {
  window.gpulab.renders.pending++;
  const p = view.value;
  return html`<tr class="pending-pod" data-pod=${p.key} onClick=${() => explain(p.key)}>
    <td>${p.key}</td>
    <td>${p.scheduler}</td>
    <td><b>${p.reason}</b> ${p.message}</td>
  </tr>`;
}

async function explain(podKey) {
  const response = await fetch(`/api/explain/${podKey}`);
  explained.value = response.ok ? await response.json() : { key: podKey, missing: true };
}

function Explain() {
  const x = explained.value;
  if (!x) return null;
  const close = () => (explained.value = null);
  return html`<div class="overlay" onClick=${close}>
    <div class="explain" id="explain" onClick=${(e) => e.stopPropagation()}>
      <button class="close" onClick=${close}>×</button>
      <h3>${x.key}</h3>
      ${x.missing
        ? html`<p>gone</p>`
        : html`<p><b>${x.reason}</b> ${x.message}</p>
            ${x.filter &&
            html`<h4>
                HAMi extender Filter: nodes ${x.filter.nodePolicy}, GPUs ${x.filter.gpuPolicy}
              </h4>
              <table class="filter">
                <thead><tr><th>node</th><th>fit</th><th>reason</th><th>score</th><th>GPUs</th></tr></thead>
                <tbody>
                  ${x.filter.rows.map(
                    (r) => html`<tr class=${r[1] === "yes" ? "fit" : "unfit"}>
                      ${r.map((c) => html`<td>${c}</td>`)}
                    </tr>`,
                  )}
                </tbody>
              </table>`}
            ${x.reasons.length > 0 &&
            html`<h4>kube-scheduler: nodes per reason</h4>
              <table class="reasons">
                <tbody>
                  ${x.reasons.map(([r, n]) => html`<tr><td>${n}</td><td>${r}</td></tr>`)}
                </tbody>
              </table>`}
            <h4>Events</h4>
            <ul class="events">
              ${x.events.map(
                (e) => html`<li class=${e.warning ? "warn" : ""}>
                  <b>${e.reason}</b> <span class="muted">${e.from}</span> ${e.message}
                </li>`,
              )}
            </ul>`}
    </div>
  </div>`;
}

// ------------------------------------------------------------------ queues and gangs

function Queues() {
  const panels = (status.value && status.value.panels) || {};
  const known = panels.volcano != null && panels.coscheduling != null;
  const gangs = known ? panels.volcano || panels.coscheduling : null;
  return html`
    <h3>Kueue ClusterQueues</h3>
    <${Installed} flag=${panels.kueue} panel="kueue"><${ClusterQueues} /><//>
    <h3>Volcano Queues</h3>
    <${Installed} flag=${panels.volcano} panel="volcano"><${VolcanoQueues} /><//>
    <h3>PodGroups (gangs)</h3>
    <${Installed} flag=${gangs} panel="podgroups"><${PodGroups} /><//>
  `;
}

function ClusterQueues() {
  const list = keys.cq.value;
  if (!list.length) return html`<p class="empty">no ClusterQueues</p>`;
  return list.map((k) => html`<${ClusterQueue} key=${k} view=${views.get(k)} />`);
}

function ClusterQueue({ view }) {
  const q = view.value;
  return html`<div class="cq" data-cq=${q.name}>
    <div>
      <b>${q.name}</b> ${q.cohort && html`<span class="muted">cohort ${q.cohort}</span>`}
      <span class="muted"> · ${q.admittedWorkloads} admitted, ${q.pendingWorkloads} pending</span>
    </div>
    <table class="quota">
      <thead>
        <tr><th>flavor</th><th>resource</th><th>usage / nominal</th><th>borrowed</th><th>lent</th></tr>
      </thead>
      <tbody>
        ${q.rows.map(
          (r) => html`<tr data-flavor=${r.flavor} data-resource=${r.resource}>
            <td>${r.flavor}</td>
            <td>${r.resource}</td>
            <td>
              <div class="bar quota-bar">
                <div class="own" style=${{ width: pct(r.usage - r.borrowed, Math.max(r.nominal, r.usage)) + "%" }}></div>
                <div class="borrowed" style=${{ width: pct(r.borrowed, Math.max(r.nominal, r.usage)) + "%" }}></div>
              </div>
              <span class="usage">${num(r.usage)} / ${num(r.nominal)}</span>
            </td>
            <td>${num(r.borrowed)}</td>
            <td>${num(r.lent)}</td>
          </tr>`,
        )}
      </tbody>
    </table>
    ${q.pending.length > 0 &&
    html`<ul class="workloads">
      ${q.pending.map((w) => html`<li><b>${w.key}</b> <span class="muted">${w.message}</span></li>`)}
    </ul>`}
  </div>`;
}

function VolcanoQueues() {
  const list = keys.vq.value;
  if (!list.length) return html`<p class="empty">no Queues</p>`;
  return html`<table class="vq">
    <thead><tr><th>queue</th><th>weight</th><th>share of GPUs vs deserved</th></tr></thead>
    <tbody>
      ${list.map((k) => {
        const q = views.get(k).value;
        return html`<tr data-queue=${q.name}>
          <td>${q.name}</td>
          <td>${q.weight}</td>
          <td>
            <div class="bar"><div class="own" style=${{ width: 100 * q.share + "%" }}></div></div>
            <div class="bar thin"><div class="deserved" style=${{ width: 100 * q.deserved + "%" }}></div></div>
            <span class="muted small">${q.gpus} GPUs = ${(100 * q.share).toFixed(0)}% ·
              deserved ${(100 * q.deserved).toFixed(0)}%</span>
          </td>
        </tr>`;
      })}
    </tbody>
  </table>`;
}

function PodGroups() {
  const list = keys.pg.value;
  if (!list.length) return html`<p class="empty">no PodGroups</p>`;
  return html`<table class="pg">
    <tbody>
      ${list.map((k) => {
        const g = views.get(k).value;
        const whole = g.bound >= g.minMember;
        return html`<tr data-pg=${g.key}>
          <td><span class="badge">${g.flavor}</span> ${g.name}</td>
          <td>
            <div class="bar"><div class=${whole ? "own" : "partial"} style=${{ width: pct(g.bound, g.minMember) + "%" }}></div></div>
          </td>
          <td class="gang">${g.bound}/${g.minMember}</td>
          <td class="muted">${g.phase}${g.queue ? " · queue " + g.queue : ""}</td>
        </tr>`;
      })}
    </tbody>
  </table>`;
}

// ------------------------------------------------------------------ GPU Operator

function Operator() {
  const panels = (status.value && status.value.panels) || {};
  return html`<${Installed} flag=${panels.operator} panel="operator"><${Policies} /><//>`;
}

function Policies() {
  const list = keys.op.value;
  if (!list.length) return html`<p class="empty">no ClusterPolicy</p>`;
  return list.map((k) => {
    const p = views.get(k).value;
    return html`<div class="policy" data-policy=${p.name}>
      <b>ClusterPolicy ${p.name}</b>
      <span class=${"state " + (p.state === "ready" ? "live" : "down")}>${p.state || "—"}</span>
      <table class="states">
        <thead><tr><th>state</th><th>ready</th>${p.nodes.map((n) => html`<th>${n}</th>`)}</tr></thead>
        <tbody>
          ${p.states.map(
            (s) => html`<tr>
              <td>${s.name}</td>
              <td>${s.ready}/${s.desired}</td>
              ${p.nodes.map((n) => html`<td class=${"cell " + s.nodes[n]}>${s.nodes[n]}</td>`)}
            </tr>`,
          )}
        </tbody>
      </table>
    </div>`;
  });
}

// ------------------------------------------------------------------ call chain

const participant = (name) => name.replace(/[^A-Za-z0-9]/g, "_");

function diagramText(items) {
  const used = new Set(items.flatMap((c) => [c.caller, c.callee]));
  const ordered = lanes.value.filter((l) => used.has(l));
  const others = [...used].filter((l) => !lanes.value.includes(l)).sort();
  return [
    "sequenceDiagram",
    ...[...ordered, ...others].map((l) => `    participant ${participant(l)} as ${l}`),
    ...items.map((c) => c.line),
  ].join("\n");
}

let drawing = null; // the timer of the next redraw (at most one per 300 ms)
let drawn = "";
let diagrams = 0;

function scheduleDiagram(element) {
  if (drawing || !element) return;
  drawing = setTimeout(async () => {
    drawing = null;
    const ns = chainNamespace.value;
    const items = calls.value.filter((c) => !ns || c.namespace === ns).slice(-CALLS_DRAWN);
    const text = diagramText(items);
    if (text === drawn) return;
    drawn = text;
    if (!items.length) {
      element.innerHTML = '<p class="empty">no calls yet</p>';
      return;
    }
    if (!(await window.mermaid.parse(text, { suppressErrors: true }))) return;
    const { svg } = await window.mermaid.render(`chain-${++diagrams}`, text);
    element.innerHTML = svg;
  }, 300);
}

function Chain() {
  const ref = useRef(null);
  const all = calls.value;
  const ns = chainNamespace.value;
  const namespaces = [...new Set(all.map((c) => c.namespace).filter(Boolean))].sort();
  useEffect(() => scheduleDiagram(ref.current));
  const query = ns ? `?namespace=${encodeURIComponent(ns)}` : "";
  return html`<div class="chain-bar">
      <label>
        namespace
        <select onChange=${(e) => (chainNamespace.value = e.target.value)} value=${ns}>
          <option value="">all</option>
          ${namespaces.map((n) => html`<option value=${n}>${n}</option>`)}
        </select>
      </label>
      <span class="muted">the last ${CALLS_DRAWN} calls; caller → callee, dashed = reply, ✕ = warning</span>
      <a href=${"/api/diagram" + query} download="call-chain.md">export as Mermaid</a>
    </div>
    <div class="diagram" id="diagram" ref=${ref}></div>`;
}

// ------------------------------------------------------------------ page

function App() {
  return html`
    <${Banner} />
    <${Header} />
    <main>
      <section class="panel wide" id="nodes"><h2>Nodes × GPUs</h2><${Nodes} /></section>
      <section class="panel" id="pending-panel"><h2>Pending pods</h2><${Pending} /></section>
      <section class="panel" id="queues"><h2>Queues</h2><${Queues} /></section>
      <section class="panel" id="operator"><h2>GPU Operator</h2><${Operator} /></section>
      <section class="panel wide" id="chain"><h2>Call chain</h2><${Chain} /></section>
    </main>
    <${Explain} />
  `;
}

window.mermaid.initialize({ startOnLoad: false, securityLevel: "strict", theme: "neutral" });
render(html`<${App} />`, document.getElementById("app"));
connect();
