// Overview: totals (/api/v1/resources/overview), this broker's per-second throughput
// (/api/v1/live/throughput) and the cluster as it sees it (/api/v1/live/cluster).
import { api } from "/dashboard/js/api.js";
import { fill, errorBox, fmt, h, lineChart, table } from "/dashboard/js/ui.js";

const REFRESH_MS = 2000;

function card(label, value, id) {
  return h("div", { class: "card" }, h("div", { class: "label" }, label), h("div", { class: "value", id }, value));
}

function totals(o) {
  const m = o.messages || {};
  return h("div", { class: "cards", id: "totals" },
    card("Queues", fmt.n(o.queues), "total-queues"),
    card("Partitions", fmt.n(o.partitions), "total-partitions"),
    card("Pending", fmt.n(m.pending), "total-pending"),
    card("Processing", fmt.n(m.processing), "total-processing"),
    card("Dead-lettered", fmt.n(m.deadLetter), "total-dead-letter"));
}

function flag(on, label) {
  return h("span", { class: on ? "pill on" : "pill ok" }, `${label}: ${on ? "ON" : "off"}`);
}

function cluster(c) {
  const mesh = c.mesh;
  const peers = mesh
    ? table([
        { label: "Peer", value: (p) => `${p.host}:${p.port}` },
        { label: "Connection", value: (p) => (p.connected ? h("span", { class: "good" }, "connected") : h("span", { class: "bad" }, "not connected")) },
      ], mesh.peers, { empty: "No peers configured." })
    : h("p", { class: "muted" }, "Single broker (no mesh peers configured).");
  const jobs = table([
    { label: "Job", value: (j) => j.job },
    { label: "Last run", value: (j) => fmt.time(j.lastStartedAt) },
    { label: "Outcome", value: (j) => (j.lastError ? h("span", { class: "bad" }, j.lastError) : j.lastSkipped ? "skipped (another broker leads)" : j.lastStartedAt ? "ran" : "–") },
    { label: "Duration ms", num: true, value: (j) => (j.lastDurationMs == null ? "–" : Number(j.lastDurationMs).toFixed(1)) },
    { label: "Cycles", num: true, value: (j) => fmt.n(j.cycles) },
  ], c.jobs || []);
  return h("div", { class: "panel", id: "cluster" },
    h("h2", {}, `Broker ${c.server}`),
    h("p", {}, "Database: ", h("span", { class: c.database === "connected" ? "good" : "bad" }, c.database), "  ",
      flag(c.maintenance.push, "push maintenance"), " ", flag(c.maintenance.pop, "pop maintenance")),
    h("p", {}, `Spool: ${fmt.n(c.spool.pending)} pending, ${fmt.n(c.spool.quarantined)} quarantined; `,
      `${fmt.n(c.parkedPops)} parked pops`,
      mesh ? `; mesh peers alive ${mesh.serversAlive}, silent ${mesh.serversDead}` : ""),
    (c.spoolBacklog && c.spoolBacklog.length)
      ? h("p", { class: "warn" }, "Spools holding partitions back: ",
          c.spoolBacklog.map((b) => `${b.spool} (${b.partitions})`).join(", "))
      : null,
    h("h2", {}, "Mesh peers"), peers,
    h("h2", {}, "Background jobs on this broker"), jobs);
}

export async function render(root) {
  const chartBox = h("div", { class: "chart", id: "throughput-chart" });
  const totalsBox = h("div", {});
  const clusterBox = h("div", {});
  const rates = h("p", { class: "muted", id: "throughput-sums" });
  fill(root, 
    h("h1", {}, "Overview"), totalsBox,
    h("div", { class: "panel" }, h("h2", {}, "Throughput through this broker (messages per second, last 15 minutes)"), rates, chartBox),
    clusterBox);
  let chart = null;
  let stopped = false;

  async function refresh() {
    const [o, t, c] = await Promise.allSettled([
      api("/api/v1/resources/overview"), api("/api/v1/live/throughput"), api("/api/v1/live/cluster")]);
    if (stopped) return;
    fill(totalsBox, o.status === "fulfilled" ? totals(o.value) : errorBox(o.reason));
    fill(clusterBox, c.status === "fulfilled" ? cluster(c.value) : errorBox(c.reason));
    if (t.status === "fulfilled") {
      const s = t.value;
      rates.textContent = `Last 15 minutes: ${fmt.n(s.sums.pushed)} pushed, ${fmt.n(s.sums.popped)} popped, ${fmt.n(s.sums.acked)} acked`;
      const data = [s.t, s.pushed, s.popped, s.acked];
      if (chart) chart.setData(data);
      else chart = lineChart(chartBox, s.t, [
        { label: "pushed/s", values: s.pushed, stroke: "#2f6fdf" },
        { label: "popped/s", values: s.popped, stroke: "#b7791f" },
        { label: "acked/s", values: s.acked, stroke: "#2f855a" }]);
    } else {
      fill(rates, errorBox(t.reason));
    }
  }

  await refresh();
  const timer = setInterval(refresh, REFRESH_MS);
  return () => { stopped = true; clearInterval(timer); if (chart) chart.destroy(); };
}
