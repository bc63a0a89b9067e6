// Maintenance: both modes, each with what it does (GET/POST /api/v1/system/maintenance[/pop]).
import { api } from "/dashboard/js/api.js";
import { fill, actionButton, confirmAction, errorBox, fmt, h, table, toast } from "/dashboard/js/ui.js";

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

// Spools holding partitions back, cluster-wide (GET /api/v1/system/spools): a silent one (no
// heartbeat for boundMs) is dead or cut off from PostgreSQL; its holds can be released here.
function holdsPanel(holds, reload) {
  if (!holds) return null;
  const release = (r) => async () => {
    const what = r.silent
      ? `Release the holds of spool ${r.spool} (${r.partitions} partition(s), silent for ${fmt.n(Math.round(r.silentSeconds || 0))} s)?`
      : `Spool ${r.spool} beat ${fmt.n(Math.round(r.silentSeconds || 0))} s ago and looks alive. Force the release of its ${r.partitions} partition(s)?`;
    if (!(await confirmAction(what))) return;
    try {
      const done = await api(`/api/v1/system/spools/${encodeURIComponent(r.spool)}/release`,
        { method: "POST", body: { force: !r.silent } });
      toast(`Released ${done.partitions} partition(s) of ${r.spool}.`);
    } catch (err) { toast(err.message, true); }
    reload();
  };
  return h("div", { class: "panel", id: "spool-holds" },
    h("h2", {}, "Spools holding partitions (cluster-wide)"),
    h("p", { class: holds.silentSpools ? "warn" : "muted", id: "spool-holds-summary" },
      `${fmt.n(holds.silentHeldPartitions)} partition(s) held by ${fmt.n(holds.silentSpools)} silent spool(s) ` +
      `(no heartbeat for ${fmt.n(holds.boundMs / 1000)} s). Holds removed through this broker: ` +
      `${fmt.n(holds.ended.expired)} expired, ${fmt.n(holds.ended.released)} released.`),
    table([
      { label: "Spool", value: (r) => r.spool },
      { label: "State", value: (r) => h("span", { class: r.silent ? "pill on" : "pill ok" }, r.silent ? "silent" : "live") },
      { label: "Partitions", num: true, value: (r) => fmt.n(r.partitions) },
      { label: "Last heartbeat", value: (r) => fmt.time(r.lastHeartbeat) },
      { label: "Silent for (s)", num: true, value: (r) => r.silentSeconds == null ? "never beat" : fmt.n(Math.round(r.silentSeconds)) },
      { label: "", value: (r) => actionButton("releaseSpool", r.silent ? "Release" : "Force release", release(r),
          { class: r.silent ? "danger" : "secondary", "data-spool": r.spool }) },
    ], holds.spools, { empty: "No spool holds partitions back." }),
    h("p", { class: "muted" }, "Releasing a spool deletes its holds, so no push waits behind it any more. " +
      "If its disk ever comes back, its pushes land later, each counted as an order exception; " +
      "nothing already in PostgreSQL changes."));
}

export async function render(root) {
  const box = h("div", {});
  fill(root, h("h1", {}, "Maintenance"), box);
  async function load() {
    const [m, sp] = await Promise.allSettled([api("/api/v1/system/maintenance"), api("/api/v1/system/spools")]);
    if (m.status === "rejected") { fill(box, errorBox(m.reason)); return; }
    const state = m.value;
    const holds = sp.status === "fulfilled" ? sp.value : null;
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
      stagingLine(state.staging),
      holdsPanel(holds, load));
  }
  await load();
  const timer = setInterval(load, 5000);
  return () => clearInterval(timer);
}
