// Streaming queries: every query with its state size (rows, bytes, partitions) and its
// committed cycles (/api/v1/status/streams); one query's source partitions, largest state
// first (/api/v1/status/streams/<name>). Refreshed every 5 s.
import { api, enc, qs } from "/dashboard/js/api.js";
import { errorBox, fill, fmt, h, table } from "/dashboard/js/ui.js";

const PARTITION_LIMIT = 200;

export function bytes(v) {
  if (v === null || v === undefined) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let n = Number(v);
  let u = 0;
  while (n >= 1024 && u < units.length - 1) { n /= 1024; u += 1; }
  return u === 0 ? `${n} B` : `${n.toFixed(1)} ${units[u]}`;
}

function refreshing(load) {
  const timer = setInterval(load, 5000);
  return () => clearInterval(timer);
}

async function list(root) {
  const summary = h("p", { id: "streams-summary", class: "muted" });
  const box = h("div", { id: "streams-list" });
  fill(root, h("h1", {}, "Streams"), summary, box);
  async function load() {
    try {
      const body = await api("/api/v1/status/streams");
      const t = body.totals;
      summary.textContent = `${fmt.n(t.queries)} queries, ${fmt.n(t.stateRows)} state rows (${bytes(t.stateBytes)}), ${fmt.n(t.cycles)} committed cycles.`;
      fill(box, table([
        { label: "Query", value: (q) => h("a", { href: `#/streams/${enc(q.name)}` }, q.name) },
        { label: "Source", value: (q) => q.sourceQueue },
        { label: "Sink", value: (q) => q.sinkQueue || "–" },
        { label: "State rows", num: true, value: (q) => fmt.n(q.state.rows) },
        { label: "State size", num: true, value: (q) => h("span", { title: `${q.state.bytes} bytes` }, bytes(q.state.bytes)) },
        { label: "Partitions", num: true, value: (q) => fmt.n(q.state.partitions) },
        { label: "Cycles", num: true, value: (q) => fmt.n(q.cycles.committed) },
        { label: "Last cycle", value: (q) => fmt.time(q.cycles.lastCycleAt) },
      ], body.queries, { onRow: (q) => { location.hash = `#/streams/${enc(q.name)}`; }, empty: "No streaming query is registered." }));
    } catch (err) { fill(box, errorBox(err)); }
  }
  await load();
  return refreshing(load);
}

async function detail(root, name) {
  const head = h("div", { id: "stream-query" });
  const box = h("div", { id: "stream-partitions" });
  fill(root, h("h1", {}, `Stream ${name}`), h("p", {}, h("a", { href: "#/streams" }, "All streams")), head, box);
  async function load() {
    try {
      const body = await api(`/api/v1/status/streams/${enc(name)}${qs({ limit: PARTITION_LIMIT })}`);
      const q = body.query;
      fill(head, h("p", {},
        `Source ${q.sourceQueue}, sink ${q.sinkQueue || "–"}, config ${q.configHash}; `,
        h("span", { id: "stream-state-rows" }, fmt.n(q.state.rows)), " state rows, ",
        h("span", { id: "stream-state-bytes", title: `${q.state.bytes} bytes` }, bytes(q.state.bytes)),
        ` on ${fmt.n(q.state.partitions)} partition(s); ${fmt.n(q.cycles.committed)} committed cycles, the last at ${fmt.time(q.cycles.lastCycleAt)}.`));
      const more = q.cycles.partitions > body.partitions.length || q.state.partitions > body.partitions.length;
      fill(box, table([
        { label: "Queue", value: (p) => p.queue },
        { label: "Partition", value: (p) => p.partition },
        { label: "State rows", num: true, value: (p) => fmt.n(p.state.rows) },
        { label: "State size", num: true, value: (p) => h("span", { title: `${p.state.bytes} bytes` }, bytes(p.state.bytes)) },
        { label: "Cycles", num: true, value: (p) => fmt.n(p.cycles.committed) },
        { label: "Last cycle", value: (p) => fmt.time(p.cycles.lastCycleAt) },
        { label: "Last state write", value: (p) => fmt.time(p.state.lastUpdateAt) },
      ], body.partitions, { empty: "No partition holds state or committed a cycle yet." }),
      more ? h("p", { class: "muted" }, `The ${PARTITION_LIMIT} partitions with the largest state are shown.`) : null);
    } catch (err) { fill(box, errorBox(err)); }
  }
  await load();
  return refreshing(load);
}

export async function render(root, params) {
  const [name] = params;
  return name === undefined ? list(root) : detail(root, name);
}
