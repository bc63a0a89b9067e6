// Messages: browse a partition from a position or a time
// (/api/v1/browse/queues/{q}/partitions/{p}/messages), look at one
// (/api/v1/messages/{partitionId}/{transactionId}) and follow its trace (/api/v1/traces/…).
import { api, enc, qs } from "/dashboard/js/api.js";
import { fill, errorBox, fmt, h, table } from "/dashboard/js/ui.js";

const LIMIT = 50;

// Trace events: snake_case fields (camelCase read too, for older brokers).
const field = (e, snake, camel) => (e[snake] !== undefined ? e[snake] : e[camel]);

async function detail(root, partitionId, transactionId) {
  const [m, t] = await Promise.allSettled([
    api(`/api/v1/messages/${enc(partitionId)}/${enc(transactionId)}`),
    api(`/api/v1/traces/${enc(partitionId)}/${enc(transactionId)}`)]);
  if (m.status !== "fulfilled") { fill(root, h("h1", {}, transactionId), errorBox(m.reason)); return null; }
  const msg = m.value;
  const traces = t.status === "fulfilled" ? ((t.value && t.value.traces) || []) : null;
  fill(root, 
    h("h1", {}, `Message ${msg.transactionId}`),
    h("p", {}, h("a", { href: `#/messages?${new URLSearchParams({ queue: msg.queue, partition: msg.partition, fromPosition: msg.position ?? "" })}` }, `${msg.queue} / ${msg.partition}`),
      `, position ${fmt.n(msg.position)}, created ${fmt.time(msg.createdAt)}, status `, h("strong", { id: "message-status" }, msg.status)),
    msg.errorMessage ? h("p", {}, "Last error: ", h("span", { class: "bad" }, msg.errorMessage), `, retries ${fmt.n(msg.retryCount)}`) : null,
    h("h2", {}, "Payload"), h("pre", { id: "message-payload" }, JSON.stringify(msg.payload !== undefined ? msg.payload : msg.data, null, 2)),
    h("h2", {}, "Consumer groups"),
    table([
      { label: "Group", value: (g) => g.name },
      { label: "Consumed", value: (g) => (g.consumed ? "yes" : "no") },
      { label: "Lease until", value: (g) => fmt.time(g.leaseExpiresAt) },
    ], msg.consumerGroups || [], { empty: "No consumer group has a cursor here." }),
    h("h2", {}, "Trace"),
    traces === null ? errorBox(t.reason) : h("div", { id: "message-trace" }, table([
      { label: "When", value: (e) => fmt.time(field(e, "created_at", "createdAt")) },
      { label: "Event", value: (e) => field(e, "event_type", "eventType") },
      { label: "Group", value: (e) => field(e, "consumer_group", "consumerGroup") },
      { label: "Names", value: (e) => (field(e, "trace_names", "traceNames") || []).join(", ") },
      { label: "Data", value: (e) => h("pre", {}, JSON.stringify(e.data)) },
    ], traces, { empty: "No trace events recorded for this message." })));
  return null;
}

async function browse(root, query) {
  const queue = h("input", { id: "msg-queue", placeholder: "Queue", value: query.get("queue") || "", required: true });
  const partition = h("input", { id: "msg-partition", placeholder: "Partition", value: query.get("partition") || "Default", required: true });
  const position = h("input", { id: "msg-position", type: "number", min: 0, placeholder: "from position", value: query.get("fromPosition") || "" });
  const since = h("input", { id: "msg-time", type: "datetime-local", step: 1 });
  const box = h("div", { id: "message-list" });
  async function load(fromPosition) {
    if (!queue.value.trim()) { fill(box, h("p", { class: "muted" }, "Name a queue and a partition.")); return; }
    try {
      const page = await api(`/api/v1/browse/queues/${enc(queue.value.trim())}/partitions/${enc(partition.value.trim())}/messages${qs({
        fromPosition: fromPosition ?? position.value, from: since.value ? new Date(since.value).toISOString() : "", limit: LIMIT })}`);
      fill(box, 
        table([
          { label: "Position", num: true, value: (m) => fmt.n(m.position) },
          { label: "Transaction", value: (m) => h("a", { href: `#/messages/${enc(m.partitionId)}/${enc(m.transactionId)}` }, m.transactionId) },
          { label: "Created", value: (m) => fmt.time(m.createdAt) },
          { label: "Dead-lettered", value: (m) => (m.deadLettered ? h("span", { class: "bad" }, "yes") : "no") },
          { label: "Trace id", value: (m) => m.traceId || "–" },
        ], page.messages, { onRow: (m) => { location.hash = `#/messages/${enc(m.partitionId)}/${enc(m.transactionId)}`; }, empty: "No message from there." }),
        page.next !== null ? h("button", { class: "secondary", id: "msg-next", onclick: () => { since.value = ""; position.value = page.next; load(page.next); } }, "Next page ›") : null);
    } catch (err) { fill(box, errorBox(err)); }
  }
  fill(root, 
    h("h1", {}, "Messages"),
    h("form", { class: "toolbar", onsubmit: (ev) => { ev.preventDefault(); load(); } },
      queue, partition, position, h("span", { class: "muted" }, "or from"), since, h("button", { type: "submit", id: "msg-go" }, "Browse")),
    box);
  await load();
  return null;
}

export async function render(root, [partitionId, transactionId], query) {
  return partitionId ? detail(root, partitionId, transactionId) : browse(root, query);
}
