// Dead letters: browse by queue (/api/v1/dlq, paged), look at one (payload, error,
// retries), retry (POST …/retry: a copy goes back to its partition) or discard
// (DELETE the message) one or many.
import { api, enc, qs } from "/dashboard/js/api.js";
import { fill, actionButton, can, confirmAction, debounce, errorBox, fmt, h, pager, table, toast } from "/dashboard/js/ui.js";

const LIMIT = 50;

const key = (m) => `${m.partitionId}/${m.transactionId}`;

export async function render(root, _params, query) {
  const queue = h("input", { type: "search", id: "dlq-queue", placeholder: "Queue (exact name)", value: query.get("queue") || "", size: 30 });
  const box = h("div", { id: "dlq-list" });
  const view = h("div", { id: "dlq-detail" });
  const selected = new Map();
  let offset = 0;
  let page = { messages: [], total: 0 };

  async function each(what, fn) {
    const items = [...selected.values()];
    if (!items.length) { toast("Select at least one message.", true); return; }
    if (!(await confirmAction(`${what} ${items.length} dead letter(s)?`))) return;
    let ok = 0;
    const errors = [];
    for (const m of items) {
      try { await fn(m); ok += 1; } catch (err) { errors.push(`${m.transactionId}: ${err.message}`); }
    }
    selected.clear();
    toast(`${what}: ${ok} done${errors.length ? `, ${errors.length} failed (${errors[0]})` : ""}`, errors.length > 0);
    fill(view, );
    load();
  }
  const retry = (m) => api(`/api/v1/messages/${enc(m.partitionId)}/${enc(m.transactionId)}/retry`, { method: "POST" });
  const discard = (m) => api(`/api/v1/messages/${enc(m.partitionId)}/${enc(m.transactionId)}`, { method: "DELETE" });

  function show(m) {
    fill(view, h("div", { class: "panel" },
      h("h2", {}, `Dead letter ${m.transactionId}`),
      h("p", {}, `Queue ${m.queue}, partition ${m.partition}, group ${m.consumerGroup}; failed ${fmt.time(m.failedAt)}, retries ${fmt.n(m.retryCount)}`),
      h("p", {}, "Error: ", h("span", { class: "bad", id: "dlq-error" }, m.errorMessage || "–")),
      h("pre", { id: "dlq-payload" }, JSON.stringify(m.data, null, 2)),
      h("div", { class: "toolbar" },
        actionButton("retryDeadLetter", "Retry", async () => { selected.clear(); selected.set(key(m), m); await each("Retry", retry); }, { id: "dlq-retry-one" }),
        actionButton("discardMessage", "Discard", async () => { selected.clear(); selected.set(key(m), m); await each("Discard", discard); }, { id: "dlq-discard-one", class: "danger" }),
        h("a", { href: `#/messages/${enc(m.partitionId)}/${enc(m.transactionId)}` }, "message and trace"))));
  }

  async function load() {
    try {
      page = await api(`/api/v1/dlq${qs({ queue: queue.value.trim(), limit: LIMIT, offset })}`);
      const messages = (page && page.messages) || [];
      const total = page && typeof page.total === "number" ? page.total : offset + messages.length;
      const selectable = can("retryDeadLetter") || can("discardMessage");
      fill(box, 
        table([
          ...(selectable ? [{ label: "", value: (m) => h("input", { type: "checkbox", class: "dlq-select", checked: selected.has(key(m)) ? true : null, onclick: (ev) => { ev.stopPropagation(); if (ev.target.checked) selected.set(key(m), m); else selected.delete(key(m)); } }) }] : []),
          { label: "Transaction", value: (m) => m.transactionId },
          { label: "Queue", value: (m) => m.queue },
          { label: "Partition", value: (m) => m.partition },
          { label: "Group", value: (m) => m.consumerGroup },
          { label: "Error", value: (m) => m.errorMessage || "–" },
          { label: "Retries", num: true, value: (m) => fmt.n(m.retryCount) },
          { label: "Failed at", value: (m) => fmt.time(m.failedAt) },
        ], messages, { onRow: show, empty: "No dead letters." }),
        pager({ total, limit: LIMIT, offset }, (o) => { offset = o; load(); }));
    } catch (err) { fill(box, errorBox(err)); }
  }

  fill(root, 
    h("h1", {}, "Dead letters"),
    h("div", { class: "toolbar" }, queue,
      actionButton("retryDeadLetter", "Retry selected", () => each("Retry", retry), { id: "dlq-retry-selected" }),
      actionButton("discardMessage", "Discard selected", () => each("Discard", discard), { id: "dlq-discard-selected", class: "danger" })),
    box, view);
  queue.addEventListener("input", debounce(() => { offset = 0; load(); }));
  await load();
  return null;
}
