"""An ephemeral queue's requests are served by its owner (docs/ephemeral.md, "Ownership"): a
broker that does not own the queue passes the request on to the owning broker's advertised HTTP API
(QUEEN_ADVERTISE_URL, carried in its mesh heartbeats) and hands the owning broker's answer back as
it came. One hop at most: a forwarded request is served where it arrives.

Not forwarded, served here: every request without a mesh, and, when JWT auth is on while
the mesh runs without QUEEN_SYNC_SECRET, every request (an unauthenticated peer could
otherwise advertise its own address and collect the callers' tokens); the brokers then each
keep their own rings for a queue, which the startup log says."""
from __future__ import annotations

from loguru import logger
from sanic.response import HTTPResponse

from broker.core.logs import Throttle
from broker.core.telemetry import telemetry
from broker.http.responses import json
from broker.http.types import BrokerRequest
from broker.service.ephemeral_ownership import owner as owner_and_address

FORWARDED_BY = "x-queen-forwarded-by"
"""Header naming the broker that forwarded a request: its receiver serves it, never again
forwards it."""

_PASSED_ON = ("content-type", "authorization")
_KEPT = ("retry-after",)  # with the content type, passed on its own
_SLACK_S = 5.0  # past a long poll's own timeout, so the owning broker's answer comes first
_UNREACHABLE_LINES = Throttle(60.0)


def forwarding(request: BrokerRequest) -> bool:
    """Whether this broker forwards ephemeral requests to their owners at all."""
    ctx = request.app.ctx
    return ctx.mesh is not None and not (ctx.auth.enabled and not ctx.settings.queen_sync_secret)


async def at_owner(request: BrokerRequest, queue: str, wait_ms: int = 0) -> HTTPResponse | None:
    """The owning broker's answer to this request when another broker owns ``queue``; None when it
    is to be served here. ``wait_ms``: a long poll's timeout, which the forwarding outlives."""
    ctx = request.app.ctx
    if request.headers.get(FORWARDED_BY) or not forwarding(request):
        return None
    owner, url = owner_and_address(ctx, queue)
    if url is None:
        return None
    target = url + request.path + (f"?{request.query_string}" if request.query_string else "")
    headers = {name: value for name in _PASSED_ON
               if (value := request.headers.get(name)) is not None}
    headers[FORWARDED_BY] = ctx.settings.queen_server_id
    # Imported here, not at the top, so that a broker without a mesh never loads httpx
    # (wiring.start_forwarding says why); forwarding() holds only with a mesh, which started
    # the client.
    import httpx

    client = ctx.forward_client
    assert client is not None
    try:
        answer = await client.request(request.method, target, content=request.body or None,
                                      headers=headers, timeout=wait_ms / 1000 + _SLACK_S)
    except httpx.HTTPError as exc:
        telemetry.ephemeral_forwards["unreachable"] += 1
        dropped = _UNREACHABLE_LINES.allow(owner)
        if dropped is not None:
            logger.warning("ephemeral: owner {} of queue {} unreachable at {}: {}", owner,
                           queue, url, exc.__class__.__name__)
        return json({"error": f"the owner of ephemeral queue {queue!r} ({owner}) is "
                              "unreachable; retry: its peers take over once it is seen dead",
                     "code": "ephemeral_owner_unreachable"}, status=503)
    telemetry.ephemeral_forwards["forwarded"] += 1
    return HTTPResponse(answer.content, status=answer.status_code,
                        headers={name: answer.headers[name] for name in _KEPT
                                 if name in answer.headers},
                        content_type=answer.headers.get("content-type"))
