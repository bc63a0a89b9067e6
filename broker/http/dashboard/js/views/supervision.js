// Supervised consumers: what consume().supervision({group}) publishes in the key/value
// namespace queen-supervisor, as GET /api/v1/status/supervision decodes it: per supervision
// group, each instance (one consume() call) with its state, host, pid and worker pool
// (running / desired workers, busy, completed and failed handler calls). Stale is the
// broker's verdict against the database's clock, never re-decided here from the browser's.
// A publication that does not decode shows its status and problem. Refreshed every 5 s.
import { api } from "/dashboard/js/api.js";
import { errorBox, fill, fmt, h, table } from "/dashboard/js/ui.js";

// A figure cell tests and scripts can find: data-fig="sv:<instance key>:<field>".
const fig = (row, field, text, attrs = {}) => h("span", { ...attrs, "data-fig": `sv:${row.key}:${field}` }, text);

function seconds(v) {
  if (v === null || v === undefined) return "–";
  if (v < 120) return `${v} s`;
  if (v < 7200) return `${Math.floor(v / 60)} min`;
  return `${Math.floor(v / 3600)} h`;
}

// The one word an operator reads first: a problem, stopped, stale, or the state.
function verdict(i) {
  if (i.status !== "ok") return { text: i.status, cls: "pill on", title: i.problem || "" };
  if (i.state === "stopped") return { text: "stopped", cls: "pill", title: "The consumer stopped; its last status stays until its TTL" };
  if (i.stale) return { text: "stale", cls: "pill on", title: `No status for ${i.ageSeconds} s (heartbeat timeout ${i.heartbeatTimeout} s)` };
  return { text: i.state || "unknown", cls: i.state === "running" ? "pill ok" : "pill", title: "" };
}

// One row per worker pool of an instance (one row when it has none: it did not decode).
function rows(instances) {
  return instances.flatMap((i) => (i.pools.length ? i.pools : [null]).map((pool) => ({ ...i, pool })));
}

function instanceTable(instances) {
  return table([
    { label: "Instance", value: (r) => fig(r, "instance", r.instance ? r.instance.slice(0, 12) : "(group)", { title: r.key }) },
    { label: "State", value: (r) => { const v = verdict(r); return fig(r, "state", v.text, { class: v.cls, title: v.title }); } },
    { label: "Host", value: (r) => fig(r, "host", r.hostname ?? "–") },
    { label: "PID", num: true, value: (r) => fig(r, "pid", r.pid ?? "–") },
    { label: "Queue", value: (r) => (r.pool ? fig(r, "queue", r.pool.queue ?? "–") : fig(r, "problem", r.problem ?? "–", { class: "bad" })) },
    { label: "Consumer group", value: (r) => (r.pool && r.pool.consumerGroup === "__QUEUE_MODE__" ? h("span", { class: "muted" }, "queue mode") : (r.pool && r.pool.consumerGroup) || "–") },
    { label: "Workers", num: true, value: (r) => fig(r, "workers", r.pool ? `${fmt.n(r.pool.running)} / ${fmt.n(r.pool.desired)}` : "–") },
    { label: "Busy", num: true, value: (r) => fig(r, "busy", r.pool ? fmt.n(r.pool.busy) : "–") },
    { label: "Completed", num: true, value: (r) => fig(r, "completed", r.pool ? fmt.n(r.pool.completed) : "–") },
    { label: "Failed", num: true, value: (r) => fig(r, "failed", r.pool ? fmt.n(r.pool.failed) : "–", { class: r.pool && r.pool.failed ? "bad" : null }) },
    { label: "Last completed", value: (r) => (r.pool ? fmt.time(r.pool.lastCompletedAt) : "–") },
    { label: "Last status", value: (r) => fig(r, "age", r.ageSeconds === null ? fmt.time(r.publishedAt) : `${seconds(r.ageSeconds)} ago`, { title: r.updatedAt || r.publishedAt }) },
    { label: "Uptime", num: true, value: (r) => seconds(r.uptimeSeconds) },
  ], rows(instances), { empty: "No instance." });
}

function counts(c) {
  const parts = [`${fmt.n(c.instances)} instance(s)`, `${fmt.n(c.running)} running`];
  if (c.stale) parts.push(`${fmt.n(c.stale)} stale`);
  if (c.stopped) parts.push(`${fmt.n(c.stopped)} stopped`);
  if (c.problems) parts.push(`${fmt.n(c.problems)} not decodable`);
  return parts.join(", ");
}

export async function render(root) {
  const summary = h("p", { id: "supervision-summary", class: "muted" });
  const box = h("div", { id: "supervision-groups" });
  fill(root, h("h1", {}, "Supervised consumers"),
    h("p", { class: "muted" }, "Consumers started with consume().supervision({group}) publish their status every 10 s (namespace queen-supervisor, 60 s TTL)."),
    summary, box);
  async function load() {
    try {
      const body = await api("/api/v1/status/supervision");
      const t = body.totals;
      summary.textContent = `${fmt.n(t.groups)} group(s): ${counts(t)}. As of ${fmt.time(body.asOf)}.`
        + (body.truncated ? " Not every publication was read (too many or too large)." : "");
      fill(box, body.groups.length
        ? body.groups.map((g) => h("section", { class: "panel supervision-group", "data-group": g.group },
          h("h2", {}, g.group, " ", h("span", { class: "muted" }, `· ${counts(g.counts)}`)),
          instanceTable(g.instances)))
        : h("p", { class: "muted" }, "No consumer publishes its status. Start one with .supervision({\"group\": \"<app>\"})."));
    } catch (err) { fill(box, errorBox(err)); }
  }
  await load();
  const timer = setInterval(load, 5000);
  return () => clearInterval(timer);
}
