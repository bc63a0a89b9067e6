// State: key/value namespaces (and one namespace's keys), held locks and semaphores,
// pending timers. Read-only: /api/v1/resources/kv/namespaces, POST …/kv/list (the cursor
// is a key, so it travels in the body), /api/v1/resources/locks, /api/v1/resources/timers.
// Expired and overdue are the broker's verdicts against the database's clock; this page
// never re-decides them from the browser's clock.
import { api } from "/dashboard/js/api.js";
import { errorBox, fill, fmt, h, table } from "/dashboard/js/ui.js";

const KEY_PAGE = 50;

// A figure cell tests and scripts can find: data-fig="<section>:<row>:<field>".
const fig = (section, row, field, text) => h("span", { "data-fig": `${section}:${row}:${field}` }, text);

function namespaces(data, open) {
  return table([
    { label: "Namespace", value: (n) => n.namespace },
    { label: "Keys", num: true, value: (n) => fig("kv", n.namespace, "keys", fmt.n(n.keys)) },
    { label: "Live", num: true, value: (n) => fig("kv", n.namespace, "live", fmt.n(n.liveKeys)) },
    { label: "With TTL", num: true, value: (n) => fig("kv", n.namespace, "ttl", fmt.n(n.withTtl)) },
    { label: "Expired, not swept", num: true, value: (n) => fig("kv", n.namespace, "expired", fmt.n(n.expired)) },
    { label: "Deleted, not swept", num: true, value: (n) => fig("kv", n.namespace, "deleted", fmt.n(n.deleted)) },
    { label: "Live bytes", num: true, value: (n) => fig("kv", n.namespace, "bytes", fmt.n(n.bytes)) },
  ], data.namespaces, { onRow: (n) => open(n.namespace), empty: "No key/value namespaces." });
}

function expiry(row) {
  if (!row.expiresAt) return "never";
  return row.expired ? h("span", { class: "warn", title: "Absent to every read; the retention job deletes it" }, `${fmt.time(row.expiresAt)} (expired)`) : fmt.time(row.expiresAt);
}

// One namespace's keys, a page at a time (keyset: Next carries the last key).
function keyBrowser(box, namespace) {
  const cursors = [null];
  async function load() {
    const after = cursors[cursors.length - 1];
    let page;
    try {
      page = await api("/api/v1/resources/kv/list", { method: "POST", body: { namespace, after, limit: KEY_PAGE, includeExpired: true } });
    } catch (err) { fill(box, errorBox(err)); return; }
    fill(box, h("div", { class: "panel", id: "kv-keys", "data-ns": namespace },
      h("h2", {}, `Keys of ${namespace}`),
      table([
        { label: "Key", value: (r) => fig("key", r.key, "key", r.key) },
        { label: "Version", num: true, value: (r) => fig("key", r.key, "version", fmt.n(r.version)) },
        { label: "Expires", value: expiry },
        { label: "Updated", value: (r) => fmt.time(r.updatedAt) },
        { label: "Bytes", num: true, value: (r) => fmt.n(r.bytes) },
        { label: "Value", value: (r) => h("code", {}, JSON.stringify(r.value).slice(0, 120)) },
      ], page.rows, { empty: "No keys." }),
      h("div", { class: "pager" },
        h("button", { class: "secondary", disabled: cursors.length <= 1, onclick: () => { cursors.pop(); load(); } }, "‹ Previous"),
        h("span", { class: "muted" }, `page ${cursors.length}, ${page.rows.length} key(s)`),
        h("button", { class: "secondary", id: "kv-keys-next", disabled: !page.truncated, onclick: () => { cursors.push(page.nextAfter); load(); } }, "Next ›"))));
  }
  return load();
}

function permits(lock) {
  return lock.permits.map((p) => h("div", {},
    `#${p.slot} ${p.owner ?? "–"} · token `, fig("lock", `${lock.name}#${p.slot}`, "token", String(p.token)),
    ` · expires ${fmt.time(p.expiresAt)}`));
}

function locks(data) {
  return [
    h("p", { class: "muted" }, "Held now, cluster-wide: ",
      fig("locks", "all", "held", fmt.n(data.locksHeld)), " lock(s), ",
      fig("locks", "all", "permits", fmt.n(data.permitsHeld)), " permit(s)",
      data.truncated ? " (first page shown)" : "", "."),
    table([
      { label: "Name", value: (l) => l.name },
      { label: "Holders", num: true, value: (l) => fig("lock", l.name, "holders", fmt.n(l.holders)) },
      { label: "Permits (slot, owner, fencing token, expiry)", value: permits },
      { label: "Last token", num: true, value: (l) => fig("lock", l.name, "lastToken", fmt.n(l.lastToken)) },
      { label: "Next expiry", value: (l) => fmt.time(l.expiresAt) },
    ], data.locks, { empty: "No lock is held." }),
  ];
}

function timers(data) {
  const mine = data.thisBroker;
  return [
    table([
      { label: "Queue", value: (q) => q.queue },
      { label: "Pending", num: true, value: (q) => fig("timers", q.queue, "pending", fmt.n(q.pending)) },
      { label: "Overdue", num: true, value: (q) => fig("timers", q.queue, "overdue", h("span", { class: q.overdue ? "warn" : null }, fmt.n(q.overdue))) },
      { label: "Next due", value: (q) => fmt.time(q.nextDueAt) },
      { label: "Most attempts", num: true, value: (q) => fmt.n(q.maxAttempts) },
    ], data.queues, { empty: "No pending timers." }),
    h("p", { class: "muted" }, "In total ",
      fig("timers", "all", "pending", fmt.n(data.totals.pending)), " pending, ",
      fig("timers", "all", "overdue", fmt.n(data.totals.overdue)), " overdue (due, not delivered yet), as of ",
      fmt.time(data.asOf), ". This broker since it started: ",
      fig("timers", "broker", "delivered", fmt.n(mine.delivered)), " delivered, ",
      fig("timers", "broker", "cancelled", fmt.n(mine.cancelled)), " cancelled, ",
      fmt.n(mine.scheduled), " scheduled, ", fmt.n(mine.rescheduled), " rescheduled."),
  ];
}

export async function render(root) {
  const kvBox = h("div", { id: "state-kv" });
  const keysBox = h("div", { id: "state-kv-keys" });
  const locksBox = h("div", { id: "state-locks" });
  const timersBox = h("div", { id: "state-timers" });
  fill(root, h("h1", {}, "State"),
    h("h2", {}, "Key/value namespaces"), kvBox, keysBox,
    h("h2", {}, "Locks and semaphores"), locksBox,
    h("h2", {}, "Pending timers"), timersBox);
  const open = (ns) => keyBrowser(keysBox, ns);

  async function section(box, path, draw) {
    try { fill(box, draw(await api(path))); } catch (err) { fill(box, errorBox(err)); }
  }
  async function load() {
    await Promise.all([
      section(kvBox, "/api/v1/resources/kv/namespaces", (d) => namespaces(d, open)),
      section(locksBox, "/api/v1/resources/locks", locks),
      section(timersBox, "/api/v1/resources/timers", timers),
    ]);
  }
  await load();
  const timer = setInterval(load, 5000);
  return () => clearInterval(timer);
}
