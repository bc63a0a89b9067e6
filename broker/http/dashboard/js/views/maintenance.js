// Maintenance: both modes, each with what it does (GET/POST /api/v1/system/maintenance[/pop]).
import { api } from "/dashboard/js/api.js";
import { fill, actionButton, confirmAction, errorBox, fmt, h, toast } from "/dashboard/js/ui.js";

const MODES = [
  { id: "push", label: "Push maintenance", field: "maintenanceMode", path: "/api/v1/system/maintenance",
    text: "While on, every broker of the cluster writes accepted pushes to its local disk spool instead of PostgreSQL and answers them \"buffered\". They stay durable and are uploaded into PostgreSQL's staging table and merged into the queues, in order, when the mode is switched off. Use it to take the database away for a while (upgrade, migration) without refusing producers." },
  { id: "pop", label: "Pop maintenance", field: "popMaintenanceMode", path: "/api/v1/system/maintenance/pop",
    text: "While on, every pop answers with no messages (consumers keep polling and see an empty queue); nothing is leased, acknowledged or lost, and pushes go on as usual. Use it to pause consumers cluster-wide without stopping them." },
];

// The drain through PostgreSQL: staged pushes not merged yet, this broker's merge rate and the
// expected time to empty at that rate.
function stagingLine(st) {
  if (!st) return h("span", {});
  const eta = st.etaSeconds == null ? "not merging here" : `about ${fmt.n(st.etaSeconds)} s to empty`;
  const last = st.lastDrain ? ` Last drain: ${fmt.n(st.lastDrain.mergedEvents)} merged here in ${st.lastDrain.seconds} s.` : "";
  return h("p", { class: "muted", id: "staging" },
    `Staged in PostgreSQL (cluster-wide): ${fmt.n(st.stagedEvents)} push(es) in ${fmt.n(st.stagedPartitions)} partition(s); ` +
    `merging ${fmt.n(st.mergeRatePerSecond)}/s here, ${eta}.${last}`);
}

export async function render(root) {
  const box = h("div", {});
  fill(root, h("h1", {}, "Maintenance"), box);
  async function load() {
    let state;
    try { state = await api("/api/v1/system/maintenance"); } catch (err) { fill(box, errorBox(err)); return; }
    fill(box, 
      ...MODES.map((m) => {
        const on = !!state[m.field];
        return h("div", { class: "switch", id: `mode-${m.id}` },
          h("div", { class: "state" }, h("span", { class: on ? "pill on" : "pill ok", id: `mode-${m.id}-state` }, on ? "ON" : "off")),
          h("div", {}, h("strong", {}, m.label), h("p", {}, m.text),
            actionButton("maintenance", on ? `Switch ${m.label.toLowerCase()} off` : `Switch ${m.label.toLowerCase()} on`, async () => {
              if (!(await confirmAction(`Switch ${m.label.toLowerCase()} ${on ? "off" : "on"} for the whole cluster?`))) return;
              try {
                await api(m.path, { method: "POST", body: { enabled: !on } });
                toast(`${m.label} ${on ? "off" : "on"}.`);
              } catch (err) { toast(err.message, true); }
              load();
            }, { id: `mode-${m.id}-toggle`, class: on ? "secondary" : "danger" })));
      }),
      h("p", { class: "muted" }, `Spooled on this broker: ${fmt.n(state.bufferedMessages)} message(s); quarantined: ${fmt.n(state.quarantinedEvents)}.`),
      stagingLine(state.staging));
  }
  await load();
  const timer = setInterval(load, 5000);
  return () => clearInterval(timer);
}
