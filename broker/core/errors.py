"""The error every layer may raise for a caller's mistake."""
from __future__ import annotations


class BadRequest(Exception):
    """The caller's mistake: answered 400 with ``{"error": message}``, or, with a
    ``code`` (the key/value, lock and timer surfaces, whose clients branch on it),
    ``{"error": code, "detail": message}``."""

    def __init__(self, message: str, status: int = 400, code: str | None = None):
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code
