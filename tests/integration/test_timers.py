"""Timers through the official client's ``client.timers`` / ``client.timer``
(POST /api/v1/timers, DELETE /api/v1/timers/<queue>/<key>, peek and list), delivered
as messages by the brokers' sweepers."""
from __future__ import annotations

import asyncio
import datetime as dt
import json
from datetime import timedelta

import asyncpg
import httpx
import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from queen import Queen
from queen.errors import TimerError

from tests.waiting import wait_until, wait_until_async

pytestmark = pytest.mark.timeout(120)


def _ts(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))


async def pop_all(client: Queen, queue: str, expected: int, timeout: float = 20) -> list:
    got: list = []

    async def more():
        got.extend(await client.queue(queue).batch(100).wait(True).timeout_millis(500).pop())
        return len(got) >= expected

    await wait_until_async(more, timeout, f"{expected} delivered timer(s) on {queue}")
    return got


async def test_schedule_delivers_not_before_its_time(client, queue_name):
    """A scheduled timer becomes one message, with the promised id and the timer's txn as
    transactionId, stored at or after deliverAt; peek shows it while pending, and a cancel
    afterwards answers absent with the txn echoed (absent may mean delivered)."""
    res = await (client.timer(queue_name).key("order:1:expire").payload({"order": 1})
                 .after(timedelta(milliseconds=400)).schedule())
    assert res["ok"] and res["status"] == "scheduled" and res["queue"] == queue_name
    assert res["timerKey"] == "order:1:expire" and res["messageId"] and res["txn"]
    peek = await client.timers.peek(queue_name, "order:1:expire")
    assert peek["found"] and peek["payload"] == {"order": 1} and not peek["encrypted"]
    (msg,) = await pop_all(client, queue_name, 1)
    assert msg["data"] == {"order": 1}
    assert msg["id"] == res["messageId"] and msg["transactionId"] == res["txn"]
    assert _ts(msg["createdAt"]) >= _ts(res["deliverAt"])  # not before
    gone = await client.timers.cancel(queue_name, "order:1:expire", txn=res["txn"])
    assert (gone["ok"], gone["status"], gone["txn"]) == (False, "absent", res["txn"])
    assert not await client.timers.peek(queue_name, "order:1:expire")


async def test_reschedule_and_cancel(client, queue_name):
    """Reschedule replaces a pending timer (one delivery, the new payload); cancel of a
    pending timer answers cancelled and nothing is delivered; a past delay fires at once."""
    t = client.timers
    first = await t.schedule(queue_name, "k", "old", delay_ms=60_000)
    again = await t.reschedule(queue_name, "k", "new", delay_ms=-5)
    assert first["status"] == "scheduled" and again["status"] == "rescheduled"
    doomed = await t.schedule(queue_name, "never", "x", delay_ms=60_000)
    listed = await t.list_all(queue_name, limit=1)
    assert {r["timerKey"] for r in listed} <= {"k", "never"} and any(
        r["timerKey"] == "never" for r in listed)
    cancelled = await t.cancel(queue_name, "never")
    assert (cancelled["ok"], cancelled["status"], cancelled["txn"]) == (
        True, "cancelled", doomed["txn"])
    msgs = await pop_all(client, queue_name, 1)
    assert [m["data"] for m in msgs] == ["new"]
    late = await client.queue(queue_name).batch(10).wait(True).timeout_millis(1500).pop()
    assert late == []  # the cancelled one and the replaced one never come


async def test_too_late_while_a_claim_is_held(client, queue_name, database):
    """A due timer whose row is claimed (held FOR UPDATE, as a sweeper holds it while it
    pushes) cannot be cancelled or rescheduled: too_late, a verdict; when the claim ends
    the timer is delivered once."""
    t = client.timers
    res = await t.schedule(queue_name, "claimed", {"v": 1}, delay_ms=800)
    conn = await asyncpg.connect(database.dsn)
    try:
        tx = conn.transaction()
        await tx.start()
        await conn.execute("SELECT 1 FROM queen.timers WHERE queue_name = $1 AND timer_key = $2"
                           " FOR UPDATE", queue_name, "claimed")

        async def due():
            return await conn.fetchval("SELECT clock_timestamp() >= $1::timestamptz",
                                       _ts(res["deliverAt"]))

        await wait_until_async(due, 10, "the claimed timer to be due")
        cancel = await t.cancel(queue_name, "claimed")
        assert (cancel["ok"], cancel["status"]) == (False, "too_late")
        resched = await t.reschedule(queue_name, "claimed", {"v": 2}, delay_ms=10)
        assert resched["status"] == "too_late" and not resched
        await tx.rollback()
    finally:
        await conn.close()
    msgs = await pop_all(client, queue_name, 1)
    assert [m["data"] for m in msgs] == [{"v": 1}]


def test_delivered_exactly_once_across_three_brokers(broker_factory, database, queue_name):
    """Three brokers sweep the same table: every timer scheduled (through all three) is
    delivered exactly once and not before its time. How late is printed, not asserted:
    on a loaded machine it is the machine's figure (a CI run once saw one timer 1.8 s
    late, with p50 35 ms). What makes delivery prompt (a sweep when the next timer is
    due, when one is announced, again at once after a full batch) is asserted through
    the sweeper's messages in tests/unit/test_timer_sweeper.py."""
    brokers = [broker_factory() for _ in range(3)]
    answers = []
    for n in range(60):
        b = brokers[n % 3]
        r = httpx.post(b.url + "/api/v1/timers", json={"operations": [{
            "op": "schedule", "queue": queue_name, "timerKey": f"t{n}",
            "payload": "MQ==", "delayMs": 50 + (n % 7) * 40, "txn": f"txn-{n}"}]}, timeout=30)
        assert r.status_code == 200, r.text
        answers.append(r.json()["results"][0])

    async def delivered():
        conn = await asyncpg.connect(database.dsn)
        try:
            return await conn.fetch(
                "SELECT m.transaction_id, m.created_at FROM queen.messages m "
                "JOIN queen.partitions p ON p.id = m.partition_id "
                "JOIN queen.queues q ON q.id = p.queue_id WHERE q.name = $1", queue_name)
        finally:
            await conn.close()

    deadline_rows: list = []

    def all_there():
        nonlocal deadline_rows
        deadline_rows = asyncio.run(delivered())
        return len(deadline_rows) >= 60

    wait_until(all_there, 30, "60 delivered timers", interval=0.2)
    rows = deadline_rows
    assert sorted(r["transaction_id"] for r in rows) == sorted(f"txn-{n}" for n in range(60))
    at = {r["transaction_id"]: r["created_at"] for r in rows}
    lateness = []
    for n, a in enumerate(answers):
        due = _ts(a["deliverAt"])
        assert at[f"txn-{n}"] >= due  # not before
        lateness.append((at[f"txn-{n}"] - due).total_seconds())
    lateness.sort()
    print(f"timer lateness over 3 brokers: p50 {lateness[30] * 1000:.1f} ms, "
          f"max (p99 of 60) {lateness[-1] * 1000:.1f} ms")


async def test_refusals(client, http, queue_name):
    """Server-owned fields, a missing delay, bad base64 and a damaged or oversized zstd
    payload are refused and schedule nothing; the client sees them as TimerError with the
    code."""
    cases = [
        ({"op": "schedule", "queue": queue_name, "timerKey": "k", "payload": "MQ==",
          "delayMs": 1, "producerSub": "forged"}, "timers_server_owned_field"),
        ({"op": "schedule", "queue": queue_name, "timerKey": "k", "payload": "MQ=="},
         "timers_bad_request"),
        ({"op": "schedule", "queue": queue_name, "timerKey": "k", "payload": "%%%",
          "delayMs": 1}, "timers_bad_payload"),
        ({"op": "launch", "queue": queue_name, "timerKey": "k"}, "timers_unknown_op"),
    ]
    for op, code in cases:
        r = http.post("/api/v1/timers", json={"operations": [
            {"op": "schedule", "queue": queue_name, "timerKey": "ok", "payload": "MQ==",
             "delayMs": 1}, op]})
        assert r.status_code == 400 and r.json()["error"] == code, (op, r.text)
    with pytest.raises(TimerError) as err:  # payloadZstd, but not a zstd frame
        await client.timers.schedule(queue_name, "z", b"raw", delay_ms=1, payload_zstd=True)
    assert err.value.status == 400 and err.value.code == "timers_bad_payload"
    bomb = zstandard.ZstdCompressor(write_content_size=True).compress(b" " * (64 << 20))
    with pytest.raises(TimerError) as err:  # a small frame that unpacks past the limit
        await client.timers.schedule(queue_name, "z", bomb, delay_ms=1, payload_zstd=True)
    assert err.value.status == 413
    assert not await client.timers.peek(queue_name, "ok")
    assert not await client.timers.peek(queue_name, "k")


_TIMER_OP = st.fixed_dictionaries({}, optional={
    "op": st.sampled_from(["schedule", "reschedule", "cancel", "x"]) | st.integers(),
    "queue": st.text(max_size=4) | st.integers(),
    "timerKey": st.text(max_size=4) | st.none(),
    "payload": st.sampled_from(["MQ==", "eyJhIjoxfQ==", "!!", ""]) | st.integers(),
    "delayMs": st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=2),
    "partition": st.text(max_size=3) | st.integers(),
    "txn": st.text(max_size=3) | st.integers(),
    "deliverAt": st.text(max_size=3),
})


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(ops=st.lists(_TIMER_OP, max_size=3) | st.integers() | st.none())
def test_timer_bodies_never_500(http, ops):
    """Any body answers 200 (one result per op) or a coded 400; a 400 schedules nothing."""
    r = http.post("/api/v1/timers", json={"operations": ops})
    assert r.status_code in (200, 400), (ops, r.status_code, r.text)
    if r.status_code == 400:
        assert r.json()["error"].startswith("timers_")
    else:
        assert len(r.json()["results"]) == len(ops)


async def test_encrypted_queue_timer_and_fetch(client, http, queue_name):
    """On an encrypted queue a timer's payload is stored encrypted (peek says so), and the
    delivered message reads as the plain payload through pop and through fetch."""
    r = http.post("/api/v1/configure", json={"queue": queue_name,
                                             "options": {"encryptionEnabled": True}})
    assert r.status_code == 200, r.text

    async def flag_seen():  # the broker's encryption-flag cache refreshes on its own
        res = await client.timers.schedule(queue_name, "probe", "p", delay_ms=600_000)
        peek = await client.timers.peek(queue_name, "probe")
        await client.timers.cancel(queue_name, "probe")
        return res["ok"] and peek["encrypted"]

    await wait_until_async(flag_seen, 30, "the queue's encryption flag", interval=0.3)
    await client.timers.schedule(queue_name, "secret", {"card": "4111"}, delay_ms=50)
    (msg,) = await pop_all(client, queue_name, 1)
    assert msg["data"] == {"card": "4111"}
    read = await client.queue(queue_name).fetch("Default")
    assert [rec["payload"] for rec in read["Default"]["records"]] == [{"card": "4111"}]


async def test_a_zstd_payload_is_delivered_as_its_json_body(client, queue_name):
    """payload_zstd=True (the 2.6 client's flag; its caller compresses the JSON body): the
    timer delivers the body the frame holds, as if it had been sent uncompressed."""
    body = {"order": 7, "lines": ["a", "b"], "note": "x" * 500}
    frame = zstandard.ZstdCompressor(write_content_size=True).compress(
        json.dumps(body).encode())
    await client.timers.schedule(queue_name, "zk", frame, delay_ms=0, payload_zstd=True)
    [got] = await pop_all(client, queue_name, 1)
    assert got["data"] == body
