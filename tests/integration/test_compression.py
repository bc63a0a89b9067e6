"""Compressed answers: an answer of at least RESPONSE_COMPRESSION_MIN_BYTES
goes zstd- or gzip-encoded when the request's Accept-Encoding takes it, and decodes to exactly
the bytes the uncompressed answer has; small answers, unaccepted encodings (q=0, identity)
and a broker with the setting at 0 send the body as it is. The official client (httpx
underneath) asks for it and reads it without noticing.
"""
from __future__ import annotations

import gzip
import json

import httpx
import pytest
import zstandard

from broker.http.compression import accepted
from tests.conftest import start_broker
from tests.integration.test_client_e2e import pop


def raw_get(url: str, path: str, accept: str | None) -> httpx.Response:
    """The answer's bytes as they crossed the wire (httpx left to decode nothing)."""
    headers = {"Accept-Encoding": accept} if accept is not None else {}
    with httpx.Client(base_url=url, timeout=30) as http:
        with http.stream("GET", path, headers=headers) as r:
            r.raw_bytes = b"".join(r.iter_raw())  # type: ignore[attr-defined]
            return r


def test_a_large_answer_is_zstd_or_gzip_encoded_as_the_caller_accepts(base_url):
    plain = raw_get(base_url, "/openapi.json", "identity")
    assert "content-encoding" not in plain.headers
    body = plain.raw_bytes
    assert len(body) > 8192  # large enough to be compressed with the default setting
    z = raw_get(base_url, "/openapi.json", "gzip, deflate, zstd")
    assert z.headers["content-encoding"] == "zstd" and z.headers["vary"] == "Accept-Encoding"
    assert len(z.raw_bytes) < len(body) / 3
    assert zstandard.ZstdDecompressor().decompress(z.raw_bytes) == body
    g = raw_get(base_url, "/openapi.json", "gzip")
    assert g.headers["content-encoding"] == "gzip"
    assert gzip.decompress(g.raw_bytes) == body
    refused = raw_get(base_url, "/openapi.json", "zstd;q=0, gzip;q=0")
    assert "content-encoding" not in refused.headers and refused.raw_bytes == body


def test_a_small_answer_is_sent_as_it_is(base_url):
    r = raw_get(base_url, "/health", "zstd, gzip")
    assert "content-encoding" not in r.headers
    assert json.loads(r.raw_bytes)["status"] in ("healthy", "unhealthy")


def test_zero_turns_compression_off(database, tmp_path):
    broker = start_broker(database, tmp_path, RESPONSE_COMPRESSION_MIN_BYTES="0")
    try:
        r = raw_get(broker.url, "/openapi.json", "zstd, gzip")
        assert "content-encoding" not in r.headers and len(r.raw_bytes) > 8192
    finally:
        broker.stop()


async def test_the_official_client_reads_a_compressed_pop(client, http, queue_name):
    """100 messages of 1 KiB: a pop answer of about 120 KiB, compressed on the way."""
    items = [{"queue": queue_name, "transactionId": f"t{n}", "payload": {"n": n, "pad": "x" * 1000}}
             for n in range(100)]
    assert http.post("/api/v1/push", json={"items": items}).status_code == 200
    raw = http.get(f"/api/v1/pop/queue/{queue_name}", headers={"Accept-Encoding": "zstd"},
                   params={"batch": "100", "wait": "false", "consumerGroup": "raw"})
    assert raw.headers.get("content-encoding") == "zstd"  # httpx decoded it for the test
    assert len(raw.json()["messages"]) == 100
    # the client's httpx asks for gzip at least, so this ~120 KiB answer comes compressed too
    async with httpx.AsyncClient() as probe:
        assert "gzip" in probe.headers["accept-encoding"]
    got = await pop(client, queue_name, batch=100, group="client")
    assert [m["data"]["n"] for m in got] == list(range(100))


@pytest.mark.parametrize("header, expected", [
    ("gzip, deflate, zstd", "zstd"), ("gzip", "gzip"), ("br, gzip;q=0.5", "gzip"),
    ("zstd;q=0, gzip", "gzip"), ("identity", None), ("*", "zstd"), ("*;q=0", None),
    ("zstd;q=bad", None), ("", None), (None, None), ("ZSTD", "zstd"),
])
def test_accept_encoding_is_read_with_its_q_values(header, expected):
    assert accepted(header) == expected
