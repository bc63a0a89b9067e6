// Queues: a searchable, paged list (/api/v1/browse/queues; the search runs in PostgreSQL).
import { api, enc, qs } from "/dashboard/js/api.js";
import { fill, debounce, errorBox, fmt, h, pager, table } from "/dashboard/js/ui.js";

const LIMIT = 50;

export async function render(root, _params, query) {
  const search = h("input", { type: "search", id: "queue-search", placeholder: "Search name, namespace or task", value: query.get("search") || "", size: 40 });
  const list = h("div", { id: "queue-list" });
  fill(root, h("h1", {}, "Queues"), h("div", { class: "toolbar" }, search), list);
  let offset = 0;

  async function load() {
    try {
      const page = await api(`/api/v1/browse/queues${qs({ search: search.value.trim(), limit: LIMIT, offset })}`);
      fill(list, 
        table([
          { label: "Queue", value: (q) => h("a", { href: `#/queues/${enc(q.name)}` }, q.name) },
          { label: "Namespace / task", value: (q) => [q.namespace, q.task].filter(Boolean).join(" / ") || "–" },
          { label: "Partitions", num: true, value: (q) => fmt.n(q.partitions) },
          { label: "Pending", num: true, value: (q) => fmt.n(q.messages.pending) },
          { label: "Processing", num: true, value: (q) => fmt.n(q.messages.processing) },
          { label: "Completed", num: true, value: (q) => fmt.n(q.messages.completed) },
          { label: "DLQ", num: true, value: (q) => fmt.n(q.messages.deadLetter) },
          { label: "Groups", num: true, value: (q) => fmt.n(q.consumerGroups) },
        ], page.queues, { onRow: (q) => { location.hash = `#/queues/${enc(q.name)}`; }, empty: "No queue matches." }),
        pager({ total: page.total, limit: LIMIT, offset }, (o) => { offset = o; load(); }),
        h("p", { class: "muted" }, `Message figures as the stats job last counted them${page.statsAge == null ? " (not run yet)" : ` (${Math.round(page.statsAge)} s ago)`}.`));
    } catch (err) {
      fill(list, errorBox(err));
    }
  }
  search.addEventListener("input", debounce(() => { offset = 0; load(); }));
  await load();
  const timer = setInterval(load, 5000);
  return () => clearInterval(timer);
}
