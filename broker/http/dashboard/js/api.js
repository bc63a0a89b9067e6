// Talking to the broker: every figure on the page comes from these JSON routes.
// The token (when JWT is on) lives in sessionStorage: this tab only, gone when it closes.

const TOKEN_KEY = "queen.dashboard.token";

export class ApiError extends Error {
  constructor(status, message) { super(message); this.status = status; }
}

let onAuthNeeded = null;
export function setAuthHandler(fn) { onAuthNeeded = fn; }

export function token() { return sessionStorage.getItem(TOKEN_KEY); }
export function setToken(value) {
  if (value) sessionStorage.setItem(TOKEN_KEY, value); else sessionStorage.removeItem(TOKEN_KEY);
}

export async function api(path, { method = "GET", body } = {}) {
  const headers = {};
  const t = token();
  if (t) headers.Authorization = `Bearer ${t}`;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch(path, {
    method, headers, body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await response.text();
  let data = null;
  if (text) {
    try { data = JSON.parse(text); } catch { data = { error: text }; }
  }
  if (response.status === 401 && onAuthNeeded) onAuthNeeded((data && data.error) || "Authentication required");
  if (!response.ok) {
    throw new ApiError(response.status, (data && data.error) || `${response.status} ${response.statusText}`);
  }
  return data;
}

// Query string from an object, leaving out empty values.
export function qs(params) {
  const p = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) {
    if (v !== undefined && v !== null && v !== "") p.set(k, String(v));
  }
  const s = p.toString();
  return s ? `?${s}` : "";
}

export const enc = encodeURIComponent;
