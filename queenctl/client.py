"""The broker's HTTP API for queenctl: one method per call, every failure a ``CtlError``
carrying the one line to print and the exit code scripts can rely on."""
from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

import httpx

# Exit codes (docs/reference/queenctl.md documents them).
OK = 0
FAILED = 1        # the broker refused the request (4xx other than below) or said it failed
USAGE = 2         # bad command line (click's own code)
NOT_FOUND = 3     # the queue, group, message or entry does not exist
AUTH = 4          # 401 / 403: no token, a bad token, or a role too low
UNREACHABLE = 5   # no broker answered at --url (refused, DNS, timeout, not HTTP)
UNAVAILABLE = 6   # 503: the database is unreachable or busy, retry later
SERVER_ERROR = 7  # any other 5xx


class CtlError(Exception):
    def __init__(self, message: str, code: int = FAILED):
        super().__init__(message)
        self.message = message
        self.code = code


def seg(value: str) -> str:
    """One path segment, percent-encoded (names may hold '/', spaces, anything)."""
    return quote(value, safe="")


def _code_for(status: int) -> int:
    if status == 404:
        return NOT_FOUND
    if status in (401, 403):
        return AUTH
    if status == 503:
        return UNAVAILABLE
    if status >= 500:
        return SERVER_ERROR
    return FAILED


class Broker:
    def __init__(self, url: str, token: str | None = None, timeout: float = 30.0):
        self.url = url.rstrip("/")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout)

    def close(self) -> None:
        self.http.close()

    def call(self, method: str, path: str, *, params: dict | None = None,
             body: Any = None, ok: tuple[int, ...] = ()) -> Any:
        """The answer's JSON (text when not JSON). A status >= 400 not in ``ok`` raises."""
        params = {k: _param(v) for k, v in (params or {}).items() if v is not None}
        try:
            response = self.http.request(method, path, params=params,
                                         json=body if body is not None else None)
        except httpx.TimeoutException:
            raise CtlError(f"no answer from {self.url} within {self.http.timeout.read} s "
                           f"(--timeout)", UNREACHABLE) from None
        except httpx.HTTPError as exc:
            reason = str(exc) or exc.__class__.__name__
            raise CtlError(f"cannot reach a broker at {self.url} ({reason}); check --url "
                           f"or QUEEN_URL", UNREACHABLE) from None
        try:
            answer = response.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            answer = response.text
        if response.status_code >= 400 and response.status_code not in ok:
            message = answer.get("error") if isinstance(answer, dict) else None
            message = message or (answer.strip()[:200] if isinstance(answer, str) else "")
            raise CtlError(f"{message or response.reason_phrase} (HTTP {response.status_code} "
                           f"from {method} {path})", _code_for(response.status_code))
        return answer


def _param(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
