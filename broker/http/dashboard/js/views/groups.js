// Consumer groups: (group, queue) pairs furthest behind first (/api/v1/browse/consumer-groups);
// one pair's lag per partition, its subscription, seek (start / end / a time) and delete.
import { api, enc, qs } from "/dashboard/js/api.js";
import { fill, actionButton, can, confirmAction, debounce, errorBox, fmt, h, pager, table, toast } from "/dashboard/js/ui.js";

const LIMIT = 50;

async function list(root, query) {
  const search = h("input", { type: "search", id: "group-search", placeholder: "Search group or queue", value: query.get("search") || "", size: 40 });
  const box = h("div", { id: "group-list" });
  fill(root, h("h1", {}, "Consumer groups"), h("div", { class: "toolbar" }, search), box);
  let offset = 0;
  async function load() {
    try {
      const page = await api(`/api/v1/browse/consumer-groups${qs({ search: search.value.trim(), limit: LIMIT, offset })}`);
      fill(box, 
        table([
          { label: "Group", value: (g) => h("a", { href: `#/groups/${enc(g.group)}/${enc(g.queue)}` }, g.group) },
          { label: "Queue", value: (g) => g.queue },
          { label: "Partitions", num: true, value: (g) => fmt.n(g.partitions) },
          { label: "Behind on", num: true, value: (g) => fmt.n(g.partitionsBehind) },
          { label: "Positions behind", num: true, value: (g) => fmt.n(g.positionsBehind) },
          { label: "Leases", num: true, value: (g) => fmt.n(g.activeLeases) },
          { label: "Last consumed", value: (g) => fmt.time(g.lastConsumedAt) },
        ], page.groups, { onRow: (g) => { location.hash = `#/groups/${enc(g.group)}/${enc(g.queue)}`; }, empty: "No consumer group matches." }),
        pager({ total: page.total, limit: LIMIT, offset }, (o) => { offset = o; load(); }));
    } catch (err) { fill(box, errorBox(err)); }
  }
  search.addEventListener("input", debounce(() => { offset = 0; load(); }));
  await load();
  const timer = setInterval(load, 5000);
  return () => clearInterval(timer);
}

async function seek(group, queue, body, what) {
  if (!(await confirmAction(`Move group "${group}" on queue "${queue}" to ${what}? Its live lease is released.`))) return false;
  try {
    const r = await api(`/api/v1/consumer-groups/${enc(group)}/queues/${enc(queue)}/seek`, { method: "POST", body });
    toast(`Seek done: ${r.partitionsUpdated} partition(s) moved.`);
    return true;
  } catch (err) { toast(err.message, true); return false; }
}

async function detail(root, group, queue) {
  const box = h("div", { id: "group-lag" });
  const sub = h("p", { id: "group-subscription", class: "muted" });
  const when = h("input", { type: "datetime-local", id: "seek-time", step: 1 });
  let offset = 0;
  async function load() {
    try {
      const page = await api(`/api/v1/browse/consumer-groups/${enc(group)}/queues/${enc(queue)}${qs({ limit: LIMIT, offset })}`);
      sub.textContent = page.subscription
        ? `Subscription: ${page.subscription.mode}, from ${fmt.time(page.subscription.timestamp)}`
        : "Subscription: none stored (a new partition starts where the broker's default mode says).";
      fill(box, 
        table([
          { label: "Partition", value: (p) => p.partition },
          { label: "Cursor", num: true, value: (p) => fmt.n(p.cursor) },
          { label: "Newest", num: true, value: (p) => fmt.n(p.lastSeq) },
          { label: "Lag (messages)", num: true, value: (p) => fmt.n(p.offsetLag) },
          { label: "Lag (seconds)", num: true, value: (p) => fmt.n(Math.round(p.timeLagSeconds)) },
          { label: "Lease until", value: (p) => fmt.time(p.leaseUntil) },
          { label: "Last consumed", value: (p) => fmt.time(p.lastConsumedAt) },
        ], page.partitions, { empty: "This group has no cursor on this queue." }),
        pager({ total: page.total, limit: LIMIT, offset }, (o) => { offset = o; load(); }));
    } catch (err) { fill(box, errorBox(err)); }
  }
  const actions = h("div", { class: "toolbar" },
    actionButton("seek", "Seek to start", async () => { if (await seek(group, queue, { timestamp: "1970-01-01T00:00:00.000Z" }, "the start")) load(); }, { id: "seek-start" }),
    actionButton("seek", "Seek to end", async () => { if (await seek(group, queue, { toEnd: true }, "the end")) load(); }, { id: "seek-end" }),
    can("seek") ? when : null,
    actionButton("seek", "Seek to time", async () => {
      if (!when.value) { toast("Pick a time first.", true); return; }
      const ts = new Date(when.value).toISOString();
      if (await seek(group, queue, { timestamp: ts }, ts)) load();
    }, { id: "seek-time-button" }),
    actionButton("deleteGroup", "Delete group on this queue", async () => {
      if (!(await confirmAction(`Delete consumer group "${group}" on queue "${queue}"? Its cursors and stored subscription go; a later pop starts it afresh.`))) return;
      try {
        await api(`/api/v1/consumer-groups/${enc(group)}/queues/${enc(queue)}`, { method: "DELETE" });
        toast("Group deleted.");
        location.hash = "#/groups";
      } catch (err) { toast(err.message, true); }
    }, { id: "group-delete", class: "danger" }));
  fill(root, 
    h("h1", {}, `Group ${group} on `, h("a", { href: `#/queues/${enc(queue)}` }, queue)),
    sub, actions, h("h2", {}, "Lag per partition (falling behind first)"), box);
  await load();
  const timer = setInterval(load, 5000);
  return () => clearInterval(timer);
}

export async function render(root, [group, queue], query) {
  return group ? detail(root, group, queue) : list(root, query);
}
