// The page's entry: asks who the token is (once), then routes #/… to a view.
import { api, setAuthHandler, setToken, token } from "/dashboard/js/api.js";
import { fill, h, session } from "/dashboard/js/ui.js";
import * as overview from "/dashboard/js/views/overview.js";
import * as queues from "/dashboard/js/views/queues.js";
import * as queue from "/dashboard/js/views/queue.js";
import * as groups from "/dashboard/js/views/groups.js";
import * as dlq from "/dashboard/js/views/dlq.js";
import * as messages from "/dashboard/js/views/messages.js";
import * as maintenance from "/dashboard/js/views/maintenance.js";
import * as streams from "/dashboard/js/views/streams.js";
import * as state from "/dashboard/js/views/state.js";
import * as supervision from "/dashboard/js/views/supervision.js";

const ROUTES = [
  [/^\/?$/, overview, "overview"],
  [/^\/queues\/?$/, queues, "queues"],
  [/^\/queues\/(.+)$/, queue, "queues"],
  [/^\/groups(?:\/([^/]+)\/([^/]+))?\/?$/, groups, "groups"],
  [/^\/dlq\/?$/, dlq, "dlq"],
  [/^\/messages(?:\/([^/]+)\/([^/]+))?\/?$/, messages, "messages"],
  [/^\/maintenance\/?$/, maintenance, "maintenance"],
  [/^\/streams(?:\/([^/]+))?\/?$/, streams, "streams"],
  [/^\/state\/?$/, state, "state"],
  [/^\/supervision\/?$/, supervision, "supervision"],
];

let cleanup = null;
let generation = 0;

async function route() {
  if (cleanup) { try { cleanup(); } catch { /* a view's timers only */ } cleanup = null; }
  const mine = ++generation;
  const raw = location.hash.replace(/^#/, "");
  const [path, query = ""] = raw.split("?");
  const root = document.getElementById("view");
  for (const [pattern, view, nav] of ROUTES) {
    const m = path.match(pattern);
    if (!m) continue;
    for (const a of document.querySelectorAll("header nav a")) a.classList.toggle("active", a.dataset.nav === nav);
    fill(root, h("p", { class: "muted" }, "Loading…"));
    const params = m.slice(1).map((p) => (p === undefined ? undefined : decodeURIComponent(p)));
    const result = await view.render(root, params, new URLSearchParams(query));
    if (mine === generation) { cleanup = result || null; rendered(raw); } else if (result) result();
    return;
  }
  fill(root, h("h1", {}, "Not found"), h("p", {}, h("a", { href: "#/" }, "Back to the overview")));
  rendered(raw);
}

// Which route has finished its first render (a hook for tests and scripts waiting on the page).
function rendered(raw) { document.documentElement.dataset.rendered = raw || "/"; }

function askToken(message) {
  const dialog = document.getElementById("token-dialog");
  document.getElementById("token-error").textContent = message || "";
  if (!dialog.open) dialog.showModal();
}

async function loadSession() {
  const s = await api("/api/v1/auth/session");
  Object.assign(session, s);
  if (s.authEnabled && !s.authenticated) {
    askToken(token() ? s.error || "The stored token was refused." : "");
    return false;
  }
  document.body.className = Object.entries(s.can || {}).filter(([, ok]) => ok).map(([k]) => `can-${k}`).join(" ");
  document.getElementById("whoami").textContent = s.authEnabled ? `role: ${s.level}` : "";
  return true;
}

document.getElementById("token-form").addEventListener("submit", async () => {
  setToken(document.getElementById("token-input").value.trim());
  if (await loadSession()) route();
});

setAuthHandler((message) => { setToken(null); askToken(message); });
window.addEventListener("hashchange", route);

if (await loadSession()) route();
