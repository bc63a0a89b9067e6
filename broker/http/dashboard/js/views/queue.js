// One queue: its partitions (paged, exact figures), its configuration (only the
// options this broker supports, each saying whether it is applied; saved through POST
// /api/v1/configure, whose answer lists what was applied and what was ignored) and its
// depth over time.
import { api, enc, qs } from "/dashboard/js/api.js";
import { fill, actionButton, can, debounce, errorBox, fmt, h, lineChart, pager, table, toast } from "/dashboard/js/ui.js";

const LIMIT = 100;

// What this broker does with an option (supportedOptions[].effect), as the form says it.
const EFFECT_LABEL = { applied: "applied", stored: "stored only", fixed: "always on" };

function configForm(name, q) {
  const inputs = {};
  const rows = q.supportedOptions.map((o) => {
    const current = q.options[o.name];
    const input = o.type === "boolean"
      ? h("input", { type: "checkbox", name: o.name, checked: current ? true : null, disabled: !can("configure") })
      : h("input", { type: "number", name: o.name, value: current, step: 1, disabled: !can("configure") });
    inputs[o.name] = { input, option: o, current };
    const effect = h("span", { class: o.effect === "applied" ? "muted" : "warn", id: `opt-effect-${o.name}`,
                               "data-effect": o.effect || "applied", title: o.note || "" },
      `${EFFECT_LABEL[o.effect] || "applied"}${o.note ? ` – ${o.note}` : ""}`);
    return [h("label", { for: `opt-${o.name}` }, o.name), Object.assign(input, { id: `opt-${o.name}` }), effect];
  });
  // The last save's answer: which options were applied, and which the broker ignored (why).
  const outcome = h("div", { id: "config-outcome" });
  const save = actionButton("configure", "Save configuration", async (ev) => {
    ev.preventDefault();
    const options = {};
    for (const [key, { input, option, current }] of Object.entries(inputs)) {
      const value = option.type === "boolean" ? input.checked : Number(input.value);
      if (value !== current) options[key] = value;
    }
    if (!Object.keys(options).length) { toast("Nothing changed."); return; }
    try {
      const answer = await api("/api/v1/configure", { method: "POST", body: { queue: name, options } });
      const applied = answer.applied || Object.keys(options);
      const ignored = answer.ignored || [];
      for (const key of Object.keys(options)) inputs[key].current = options[key];
      fill(outcome,
        h("p", { id: "config-applied" }, applied.length ? `Applied: ${applied.join(", ")}.` : "Nothing applied."),
        ignored.length ? h("div", { id: "config-ignored", class: "warn" },
          h("p", {}, `Ignored by this broker: ${ignored.join(", ")}`),
          h("ul", {}, (answer.warnings || []).map((w) => h("li", {}, w)))) : null);
      if (ignored.length) toast(`Saved, but ignored: ${ignored.join(", ")}`, true);
      else toast(`Saved: ${applied.join(", ")}`);
    } catch (err) { toast(err.message, true); }
  }, { id: "config-save" });
  return h("form", { id: "config-form" },
    h("p", { class: "muted" }, "Every option is stored; \u201capplied\u201d ones change what this broker does. " +
      "Saving one this broker does not act on lists it under \u201cIgnored\u201d."),
    h("div", { class: "form-grid", style: "grid-template-columns: max-content 12rem auto" }, rows.flat()),
    h("p", {}, save), outcome);
}

export async function render(root, [name]) {
  let header;
  try {
    header = await api(`/api/v1/browse/queues/${enc(name)}`);
  } catch (err) {
    fill(root, h("h1", {}, name), errorBox(err));
    return null;
  }
  const search = h("input", { type: "search", id: "partition-search", placeholder: "Search partitions", size: 30 });
  const parts = h("div", { id: "partition-list" });
  const depthBox = h("div", { class: "chart", id: "depth-chart" });
  const depthNote = h("p", { class: "muted" });
  fill(root, 
    h("h1", {}, "Queue ", h("span", { id: "queue-name" }, header.name)),
    h("p", { class: "muted" }, `namespace ${header.namespace || "–"}, task ${header.task || "–"}, created ${fmt.time(header.createdAt)} · `,
      h("a", { href: `#/dlq?queue=${enc(name)}` }, "dead letters"), " · ",
      h("a", { href: `#/groups?search=${enc(name)}` }, "consumer groups")),
    h("h2", {}, "Partitions"), h("div", { class: "toolbar" }, search), parts,
    h("h2", {}, "Depth over time"), depthNote, depthBox,
    h("h2", {}, "Configuration"), configForm(name, header));
  let offset = 0;
  let chart = null;

  async function loadPartitions() {
    try {
      const page = await api(`/api/v1/browse/queues/${enc(name)}/partitions${qs({ search: search.value.trim(), limit: LIMIT, offset })}`);
      fill(parts, 
        table([
          { label: "Partition", value: (p) => h("a", { href: `#/messages?${new URLSearchParams({ queue: name, partition: p.name })}` }, p.name) },
          { label: "Pending", num: true, value: (p) => fmt.n(p.messages.pending) },
          { label: "Processing", num: true, value: (p) => fmt.n(p.messages.processing) },
          { label: "Completed", num: true, value: (p) => fmt.n(p.messages.completed) },
          { label: "DLQ", num: true, value: (p) => fmt.n(p.messages.deadLetter) },
          { label: "Total", num: true, value: (p) => fmt.n(p.messages.total) },
          { label: "Lease held until", value: (p) => fmt.time(p.leaseUntil) },
          { label: "Last message", value: (p) => fmt.time(p.lastMessageAt) },
        ], page.partitions, { empty: "No partition matches." }),
        pager({ total: page.total, limit: LIMIT, offset }, (o) => { offset = o; loadPartitions(); }));
    } catch (err) { fill(parts, errorBox(err)); }
  }

  async function loadDepth() {
    try {
      const d = await api(`/api/v1/live/queues/${enc(name)}/depth`);
      // samples taken before the stats job first counted the queue carry null: left out
      const first = d.pending.findIndex((v) => v !== null);
      const t = first < 0 ? [] : d.t.slice(first);
      const pending = first < 0 ? [] : d.pending.slice(first);
      depthNote.textContent = `Pending messages, sampled every ${d.intervalSeconds} s from the stats job's counts (kept in this broker's memory)` +
        (pending.length ? `; now ${fmt.n(pending[pending.length - 1])}.` : "; no sample of this queue yet.");
      if (chart) chart.setData([t, pending]);
      else if (pending.length) chart = lineChart(depthBox, t, [{ label: "pending", values: pending, stroke: "#2f6fdf" }], { height: 200, points: true });
    } catch (err) { fill(depthBox, errorBox(err)); }
  }

  search.addEventListener("input", debounce(() => { offset = 0; loadPartitions(); }));
  await Promise.all([loadPartitions(), loadDepth()]);
  const timer = setInterval(() => { loadPartitions(); loadDepth(); }, 5000);
  return () => { clearInterval(timer); if (chart) chart.destroy(); };
}
