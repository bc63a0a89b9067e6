// Small DOM helpers shared by the views: element builder, tables, pager, formatting,
// confirmation, toasts, charts (uPlot, vendored in /dashboard/vendor).
import uPlot from "/dashboard/vendor/uPlot.esm.js";

export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "class") el.className = v;
    else if (k === "value") el.value = v;
    else el.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) {
    if (c === undefined || c === null || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

// What the session's token may do (set once by main.js from /api/v1/auth/session).
export const session = { can: {}, level: null, authEnabled: false };
export function can(action) { return !!session.can[action]; }

// A button for a state-changing action, or nothing when the role may not do it.
export function actionButton(action, label, onclick, attrs = {}) {
  if (!can(action)) return null;
  return h("button", { ...attrs, "data-needs": action, onclick }, label);
}

export const fmt = {
  n(v) { return v === null || v === undefined ? "–" : Number(v).toLocaleString("en-US"); },
  time(v) { return v ? new Date(v).toISOString().replace("T", " ").replace(/\.\d+Z$/, "Z") : "–"; },
  rate(v) { return v === null || v === undefined ? "–" : Number(v).toFixed(1); },
};

export function table(columns, rows, { onRow, empty = "Nothing here." } = {}) {
  const head = h("tr", {}, columns.map((c) => h("th", { class: c.num ? "num" : null }, c.label)));
  const body = rows.length
    ? rows.map((r) => h("tr", { class: onRow ? "clickable" : null, onclick: onRow ? () => onRow(r) : null },
        columns.map((c) => h("td", { class: c.num ? "num" : null }, c.value(r)))))
    : [h("tr", {}, h("td", { colspan: columns.length, class: "muted" }, empty))];
  return h("table", {}, h("thead", {}, head), h("tbody", {}, body));
}

export function pager({ total, limit, offset }, go) {
  const last = Math.min(offset + limit, total);
  return h("div", { class: "pager" },
    h("button", { class: "secondary", disabled: offset <= 0, onclick: () => go(Math.max(0, offset - limit)) }, "‹ Previous"),
    h("span", { class: "muted" }, total ? `${offset + 1}–${last} of ${fmt.n(total)}` : "0 of 0"),
    h("button", { class: "secondary", disabled: last >= total, onclick: () => go(offset + limit) }, "Next ›"));
}

export function debounce(fn, ms = 250) {
  let timer = null;
  return (...a) => { clearTimeout(timer); timer = setTimeout(() => fn(...a), ms); };
}

let toastTimer = null;
export function toast(text, isError = false) {
  const el = document.getElementById("toast");
  el.textContent = text;
  el.className = isError ? "error" : "";
  el.hidden = false;
  clearTimeout(toastTimer);
  toastTimer = setTimeout(() => { el.hidden = true; }, isError ? 8000 : 3000);
}

export function confirmAction(text) {
  const dialog = document.getElementById("confirm-dialog");
  document.getElementById("confirm-text").textContent = text;
  return new Promise((resolve) => {
    dialog.addEventListener("close", () => resolve(dialog.returnValue === "ok"), { once: true });
    dialog.showModal();
  });
}

// A line chart: xs are Unix seconds, series = [{label, values, stroke}].
export function lineChart(container, xs, series, { height = 240, points = false } = {}) {
  const width = Math.max(320, container.clientWidth || 800);
  const opts = {
    width, height,
    series: [{}, ...series.map((s) => ({ label: s.label, stroke: s.stroke, width: 2, points: { show: points } }))],
    axes: [{}, { size: 60 }],
    scales: { x: { time: true } },
    legend: { live: true },
  };
  container.replaceChildren();
  return new uPlot(opts, [xs, ...series.map((s) => s.values)], container);
}

export function errorBox(err) {
  return h("p", { class: "bad" }, `Could not load: ${err.message}`);
}

// replaceChildren without the "null" text nodes it would make of absent parts.
export function fill(el, ...children) {
  el.replaceChildren(...children.flat().filter((c) => c !== null && c !== undefined && c !== false));
  return el;
}
