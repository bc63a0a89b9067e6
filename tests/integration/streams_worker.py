"""A streaming SDK worker for test_streams_sdk: runs one tumbling-window query of the
official client (queen-mq's ``queen.streams``) against a broker until it is killed.

    python -m tests.integration.streams_worker URL SOURCE SINK QUERY_ID [CRASH_AFTER [WHEN]]

The query: per source partition, 1-second event-time windows over ``data.ts``, the sum of
``data.amount``; each closed window goes to SINK as ``{key, windowStart, sum}``.
With CRASH_AFTER = N the process dies (os._exit, no cleanup) at its N-th acknowledging
cycle: WHEN = ``sent`` (default) right after sending it, before reading the answer (the
commit landed, the worker never learns it), ``unsent`` just before sending it (the
batch was popped and computed, nothing committed).
"""
from __future__ import annotations

import asyncio
import os
import sys

from queen import Queen
from queen.streams import Stream
from queen.streams.runtime import streams_http_client


def pipeline(q: Queen, source: str, sink: str, seconds: float = 1) -> Stream:
    return (Stream.from_(q.queue(source))
            .window_tumbling(seconds=seconds, event_time=lambda m: m["data"]["ts"])
            .reduce(lambda acc, v: acc + v["amount"], 0)
            .map(lambda v, ctx: {"key": ctx["partition"], "windowStart": ctx["windowStart"],
                                 "sum": v})
            .to(q.queue(sink)))


def crash_after(cycles: int, when: str) -> None:
    original = streams_http_client.StreamsHttpClient.post
    sent = 0

    async def post(self, path, body):
        nonlocal sent
        if path == "/streams/v1/cycle" and body.get("ack"):
            sent += 1
            if sent == cycles:
                if when == "sent":
                    await self._client.post(self.url + path, json=body)
                os._exit(137)
        return await original(self, path, body)

    streams_http_client.StreamsHttpClient.post = post  # type: ignore[method-assign]


async def main(url: str, source: str, sink: str, query_id: str) -> None:
    q = Queen(url)
    await pipeline(q, source, sink).run(query_id=query_id, url=url, batch_size=5,
                                        max_partitions=1, max_wait_millis=200)
    await asyncio.Event().wait()  # until killed


if __name__ == "__main__":
    if len(sys.argv) > 5:
        crash_after(int(sys.argv[5]), sys.argv[6] if len(sys.argv) > 6 else "sent")
    asyncio.run(main(*sys.argv[1:5]))
