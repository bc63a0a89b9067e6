"""The hot path's lean functions answer and store exactly what the functions they replace do.

queen.push_ordered_v5 and queen.ack_messages_v4 (migration 0017) take fast paths for the
usual calls and hand the others to push_ordered_v4 / ack_messages_v3; queen.push_ordered_v6
(migration 0019) adds one for calls to several partitions; queen.ack_messages_v5
(migration 0018) takes v4's fast path in one statement, and queen.pop_messages_v5 takes
pop_messages_v3's candidates by one statement per shape of call; the previous release's
brokers still call the old ones. Invariant: for any sequence of calls (items to one
or several partitions, transaction ids repeated within a call and across calls, accept times
out of order, batches popped under leases and acked with any mix of statuses, leases and
unknown or repeated items, queues with and without maxSize, partitions new or not), the new
function and the old one, each on a queue of its own in the same database, give the same rows
(modulo the ids of their own partitions and messages) and leave the same messages, cursors,
leases and dead letters behind. For the pop: any sequence of pops of every shape (a partition
named, hinted partitions only, a scan, through the namespace), groups (one conflating), batch
sizes and partition counts, with leases acked, left or expired and pushes between, gives the
same rows and leaves the same cursors and leases.
"""
from __future__ import annotations

import uuid

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from broker.core.domain import QUEUE_MODE, AckRow, PushRow
from broker.core.ids import new_uuid7
from broker.store import sql
from broker.store.codecs import ack_call, push_arrays
from broker.store.db import Store, now_us

PUSH = """
SELECT idx, message_id, partition_id, status, late, peer, error
FROM queen.{fn}($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)
"""
ACK = {fn: sql.ACK.replace("ack_messages_v5", fn) for fn in ("ack_messages_v3",
                                                             "ack_messages_v4",
                                                             "ack_messages_v5")}
OLD, NEW = 0, 1
SETTINGS = settings(max_examples=40, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])

# One call: items as (partition, transaction id) picks from small pools, so that
# repeats within a call and across calls are common; whether its items all go to p0; its
# accept-time offset; whether its transaction ids are all fresh instead (the fast paths'
# usual call); whether its items count against maxSize (a request id) or not (None, as
# spooled pushes).
ITEM = st.tuples(st.integers(0, 2), st.integers(0, 5))
CALL = st.tuples(st.lists(ITEM, min_size=1, max_size=7), st.booleans(), st.sampled_from([0, -5, 7]),
                 st.booleans(), st.sampled_from([True, True, False]))


async def push_call(store: Store, fn: str, queue: str, rows: list[PushRow], accept: int) -> list:
    async with store.connection() as c:
        return await c.fetch(PUSH.format(fn=fn), *push_arrays(
            rows, [accept] * len(rows), store.server_id, store.order_wait_ms, store.settle_ms),
            [r.request for r in rows])


async def stored(store: Store, queue: str, origin: dict[str, tuple]) -> list[tuple]:
    async with store.connection() as c:
        rows = await c.fetch(
            "SELECT p.name, m.seq, m.transaction_id, m.id::text AS id, p.last_seq,"
            " p.last_accept_us"
            " FROM queen.messages m JOIN queen.partitions p ON p.id = m.partition_id"
            " JOIN queen.queues q ON q.id = p.queue_id WHERE q.name = $1"
            " ORDER BY p.name, m.seq", queue)
    return [(r["name"], r["seq"], r["transaction_id"], origin[r["id"]], r["last_seq"],
             r["last_accept_us"]) for r in rows]


SPREAD = [(0, 0), (1, 1), (0, 2), (2, 3), (1, 4), (0, 5)]  # several items to each partition


@pytest.mark.parametrize("new_fn", ["push_ordered_v5", "push_ordered_v6"])
@SETTINGS
# Always tried: calls to several existing partitions with fresh transaction ids (v6's fast
# path), at equal, later and earlier accept times; the same over a queue's maxSize.
@example(max_size=0, partitions_exist=True,
         calls=[(SPREAD, False, 0, True, True), (SPREAD, False, 0, True, True),
                (SPREAD, False, 7, True, True), (SPREAD, False, 0, True, False)])
@example(max_size=5, partitions_exist=True, calls=[(SPREAD, False, 0, True, True)])
@given(calls=st.lists(CALL, min_size=1, max_size=6), max_size=st.sampled_from([0, 0, 5, 12]),
       partitions_exist=st.booleans())
async def test_push_answers_and_stores_what_v4_does(store, new_fn, calls, max_size,
                                                    partitions_exist):
    tag = uuid.uuid4().hex[:8]
    queues = (f"eq-push-{tag}-old", f"eq-push-{tag}-new")
    async with store.connection() as c:
        await c.execute("INSERT INTO queen.queues (name, namespace, max_size)"
                        " SELECT n, n, $2 FROM unnest($1::text[]) AS n", queues, max_size)
        if partitions_exist:  # else the calls create them (push_ordered_v4's path)
            await c.execute("INSERT INTO queen.partitions (queue_id, name)"
                            " SELECT q.id, 'p' || i FROM queen.queues q, generate_series(0, 2) i"
                            " WHERE q.name = ANY($1::text[])", queues)
    origin: dict[str, tuple] = {}  # message id -> (call, item): ids differ, origins do not
    base = now_us()
    for k, (items, one_partition, offset, fresh, checked) in enumerate(calls):
        answers = []
        for side, fn in ((OLD, "push_ordered_v4"), (NEW, new_fn)):
            rows = []
            for i, (part, tx) in enumerate(items):
                mid = new_uuid7()
                origin[mid] = (k, i)
                rows.append(PushRow(queue=queues[side], partition=f"p{0 if one_partition else part}",
                                    message_id=mid, trace_id=None,
                                    transaction_id=f"tx-{k}-{i}" if fresh else f"tx-{tx}",
                                    payload={"k": k, "i": i},
                                    request=k + 1 if checked else None))
            # offsets repeat across calls: equal accept times as well as earlier ones
            got = await push_call(store, fn, queues[side], rows, base + offset * 1000)
            answers.append([(r["idx"], r["status"], r["late"],
                             r["error"] and r["error"].replace(queues[side], "Q"),
                             origin.get(str(r["message_id"]))) for r in got])
        assert answers[NEW] == answers[OLD], f"call {k}: {items}"
    assert await stored(store, queues[NEW], origin) == await stored(store, queues[OLD], origin)


@pytest.mark.parametrize("new_fn", ["push_ordered_v5", "push_ordered_v6"])
@pytest.mark.parametrize("spread", [False, True], ids=["one-partition", "several-partitions"])
async def test_push_stages_while_the_database_settles_as_v4_does(store, new_fn, spread):
    """Invariant: while the database settles after a restart (queen.db_settling), every item
    of a call is staged, whatever fast path the call would take otherwise. The settling is
    made up in a transaction that is rolled back, so that no other test sees it."""
    tag = uuid.uuid4().hex[:8]
    queues = (f"eq-settle-{tag}-old", f"eq-settle-{tag}-new")
    answers = []
    async with store.connection() as c:
        tr = c.transaction()
        await tr.start()
        try:
            await c.execute("INSERT INTO queen.queues (name) SELECT unnest($1::text[])", queues)
            await c.execute("INSERT INTO queen.partitions (queue_id, name)"
                            " SELECT q.id, 'p' || i FROM queen.queues q, generate_series(0, 2) i"
                            " WHERE q.name = ANY($1::text[])", queues)
            await c.execute("SELECT queen.db_settling(1)")  # this server's incarnation row
            await c.execute("UPDATE queen.db_incarnations SET follows = true,"
                            " first_write_at = now() WHERE started_at = pg_postmaster_start_time()")
            # the new function first: the old one's staged items leave a spool backlog,
            # which would send the new one's call to v4 whatever it makes of the settling
            for side, fn in ((NEW, new_fn), (OLD, "push_ordered_v4")):
                rows = [PushRow(queue=queues[side], partition=f"p{part if spread else 0}",
                                message_id=new_uuid7(), transaction_id=f"tx-{i}", trace_id=None,
                                payload={"i": i}, request=1)
                        for i, (part, _) in enumerate(SPREAD)]
                got = await c.fetch(PUSH.format(fn=fn), *push_arrays(
                    rows, [now_us()] * len(rows), store.server_id, store.order_wait_ms, 60_000),
                    [r.request for r in rows])
                answers.append([(r["idx"], r["status"]) for r in got])
        finally:
            await tr.rollback()
    new, old = answers
    assert old == [(i, "staged") for i in range(len(SPREAD))]
    assert new == old


# A step of a consumer: which group pops which partition how many, then, per popped item, a
# status; and what else goes into the ack call.
STEP = st.fixed_dictionaries({
    "group": st.sampled_from([QUEUE_MODE, "g1", "g2"]),
    "partition": st.sampled_from(["p0", "p1"]),
    "batch": st.integers(1, 6),
    # mostly the usual ack (every item completed), which the fast path takes
    "statuses": st.lists(st.sampled_from(
        ["completed"] * 6 + ["success", "failed", "retry", "dlq", "skip"]), max_size=6),
    # ... "twice": the first item acked alone first, then all of them (the first again, now
    # behind the cursor, under the still live lease); "expired": the lease ran out first
    "extra": st.sampled_from([None] * 4 + ["unknown", "repeat", "wrong-lease", "no-lease",
                                            "beyond", "twice", "expired"]),
    "reverse": st.booleans(),
})


async def consumer_state(store: Store, queue: str) -> list[tuple]:
    async with store.connection() as c:
        rows = await c.fetch(
            "SELECT p.name, l.consumer_group, l.cursor_seq, l.lease_id IS NOT NULL AS leased,"
            " l.lease_last_seq, l.batch_size, l.acked_count, l.batch_retry_count,"
            " l.total_messages_consumed, l.total_batches_consumed,"
            " l.last_consumed_at IS NOT NULL AS consumed,"
            " (SELECT m.transaction_id FROM queen.messages m"
            "  WHERE m.id = l.last_consumed_id) AS last_tx,"
            " (SELECT count(*) FROM queen.dead_letter_queue d WHERE d.partition_id = p.id"
            "  AND d.consumer_group = l.consumer_group) AS dead"
            " FROM queen.log_consumers l JOIN queen.partitions p ON p.id = l.partition_id"
            " JOIN queen.queues q ON q.id = p.queue_id WHERE q.name = $1"
            " ORDER BY p.name, l.consumer_group", queue)
    return [tuple(r) for r in rows]


@pytest.mark.parametrize("new_fn", ["ack_messages_v4", "ack_messages_v5"])
@settings(SETTINGS, max_examples=150)
# Always tried: an item acked again, behind the cursor, with the rest of its batch under the
# still live lease (random steps seldom put "twice" on a fully completed, unreversed batch).
@example(messages=["p0", "p0", "p0"], retry_limit=0,
         steps=[{"group": "g1", "partition": "p0", "batch": 3, "statuses": ["completed"] * 3,
                 "extra": "twice", "reverse": False}])
@given(messages=st.lists(st.sampled_from(["p0", "p1"]), min_size=1, max_size=12),
       steps=st.lists(STEP, min_size=1, max_size=10),
       retry_limit=st.sampled_from([0, 1, 3]))
async def test_ack_answers_and_moves_what_v3_does(store, new_fn, messages, steps, retry_limit):
    tag = uuid.uuid4().hex[:8]
    queues = (f"eq-ack-{tag}-old", f"eq-ack-{tag}-new")
    for q in queues:
        await store.push([PushRow(queue=q, partition=p, message_id=new_uuid7(),
                                  transaction_id=f"tx-{i}", trace_id=None, payload={"i": i})
                          for i, p in enumerate(messages)])
        async with store.connection() as c:
            await c.execute("UPDATE queen.queues SET retry_limit = $2 WHERE name = $1",
                            q, retry_limit)
    for n, step in enumerate(steps):
        popped, answers = [], []
        for side, ack_fn in ((OLD, "ack_messages_v3"), (NEW, new_fn)):
            lease = new_uuid7()
            async with store.connection() as c:
                rows = await c.fetch(sql.POP, queues[side], step["partition"], None, None,
                                     step["group"], step["batch"], 1, False, lease, None, False)
            popped.append([(r["kind"], r["partition_name"], r["transaction_id"], r["seq"],
                            r["retry_count"], r["verdict"], r["payload"], r["retired"])
                           for r in rows])
            msgs = [r for r in rows if r["kind"] == "msg"]
            acks = [AckRow(r["transaction_id"], str(r["partition_id"]), status, "boom",
                           step["group"], lease)
                    for r, status in zip(msgs, step["statuses"]) if status != "skip"]
            if msgs and step["extra"] == "unknown":
                acks.append(AckRow("tx-none", str(msgs[0]["partition_id"]), "completed", None,
                                   step["group"], lease))
            elif msgs and step["extra"] == "beyond":  # a message after the batch, same lease
                after = [i for i, p in enumerate(messages)
                         if p == step["partition"] and i > int(msgs[-1]["transaction_id"][3:])]
                if after:
                    acks.append(AckRow(f"tx-{after[0]}", str(msgs[0]["partition_id"]),
                                       "completed", None, step["group"], lease))
            elif acks and step["extra"] == "repeat":
                acks.append(acks[0])
            elif acks and step["extra"] == "wrong-lease":
                a = acks[-1]
                acks[-1] = AckRow(a.transaction_id, a.partition_id, a.status, a.error,
                                  a.consumer_group, new_uuid7())
            elif acks and step["extra"] == "no-lease":
                a = acks[0]
                acks[0] = AckRow(a.transaction_id, a.partition_id, a.status, a.error,
                                 a.consumer_group, None)
            if step["reverse"]:
                acks.reverse()
            calls = [acks[:1], acks] if len(acks) > 1 and step["extra"] == "twice" else [acks]
            if msgs and step["extra"] == "expired":
                async with store.connection() as c:
                    await c.execute("UPDATE queen.log_consumers SET lease_expires_at = now()"
                                    " - interval '1 second' WHERE lease_id = $1", lease)
            answer = []
            for call in calls:
                if call:
                    async with store.connection() as c:
                        got = await c.fetch(ACK[ack_fn], *ack_call(call, False))
                    answer.append(sorted((r["idx"], r["success"], r["error"],
                                          r["partition_name"], r["lease_released"], r["dlq"])
                                         for r in got))
            answers.append(answer)
        assert popped[NEW] == popped[OLD], f"step {n}: {step}"
        assert answers[NEW] == answers[OLD], f"step {n}: {step}"
        assert await consumer_state(store, queues[NEW]) == \
            await consumer_state(store, queues[OLD]), f"step {n}: {step}"


# One pop call of queen.pop_messages_v5 against v3: the shape (a partition named; the hinted
# partitions only; a scan, hinted partitions first; the same through the queue's namespace
# instead of its name), the hints, the group (c conflates), the batch, how many partitions,
# auto-ack; then what happens to a lease taken: acked, left, or expired; or a push between.
POP_STEP = st.one_of(
    st.fixed_dictionaries({
        "shape": st.sampled_from(["named", "hinted", "scan", "ns-scan", "ns-named"]),
        "partition": st.sampled_from(["p0", "p1", "p2", "p9"]),
        "hints": st.lists(st.sampled_from(["p0", "p1", "p2", "p9"]), max_size=3, unique=True),
        "group": st.sampled_from(["g", "h", "c"]),
        "batch": st.sampled_from([1, 2, 5]),
        "partitions": st.sampled_from([1, 2, 3]),
        "auto_ack": st.booleans(),
        "then": st.sampled_from(["ack", "leave", "expire"]),
    }),
    st.fixed_dictionaries({"push": st.lists(st.sampled_from(["p0", "p1", "p2"]), min_size=1,
                                            max_size=3)}))
POP_V3 = sql.POP.replace("pop_messages_v5", "pop_messages_v3")


@settings(SETTINGS, max_examples=200)
@given(messages=st.lists(st.sampled_from(["p0", "p1", "p2"]), min_size=1, max_size=10),
       steps=st.lists(POP_STEP, min_size=1, max_size=12))
async def test_pop_v5_claims_and_answers_what_v3_does(store, messages, steps):
    tag = uuid.uuid4().hex[:8]
    queues = (f"eq-pop-{tag}-old", f"eq-pop-{tag}-new")
    pushed = 0

    async def push(partitions: list[str]) -> None:
        nonlocal pushed
        for q in queues:
            await store.push([PushRow(queue=q, partition=p, message_id=new_uuid7(),
                                      transaction_id=f"tx-{pushed + i}", trace_id=None,
                                      payload={"i": pushed + i})
                              for i, p in enumerate(partitions)])
        pushed += len(partitions)

    async with store.connection() as c:
        for side, q in enumerate(queues):
            # A namespace of its own, so that a namespace pop reaches this queue only; and
            # partitions whose ids sort as their names do in both queues: partitions the
            # group never claimed, or claimed in one call, are taken in the order of their
            # ids, which would otherwise differ between the two queues.
            await c.execute("INSERT INTO queen.queues (name, namespace) VALUES ($1, $1)", q)
            await c.execute(
                "INSERT INTO queen.partitions (queue_id, name, id)"
                " SELECT q.id, 'p' || k, ($2 || '-0000-4000-8000-' || $3 || lpad(k::text, 11, '0'))::uuid"
                " FROM queen.queues q, generate_series(0, 2) k WHERE q.name = $1", q, tag, str(side))
            await c.execute("INSERT INTO queen.group_policies (queue_name, consumer_group,"
                            " conflation) VALUES ($1, 'c', true)", q)
    await push(messages)
    for n, step in enumerate(steps):
        if "push" in step:
            await push(step["push"])
            continue
        popped = []
        for side, stmt in ((OLD, POP_V3), (NEW, sql.POP)):
            q = queues[side]
            by_ns = step["shape"].startswith("ns-")
            named = step["shape"].endswith("named")
            lease = new_uuid7()
            async with store.connection() as c:
                rows = await c.fetch(
                    stmt, None if by_ns else q, step["partition"] if named else None,
                    q if by_ns else None, None, step["group"], step["batch"],
                    step["partitions"], step["auto_ack"], lease, step["hints"] or None,
                    step["shape"] == "hinted")
            popped.append([(r["kind"], r["partition_name"], r["transaction_id"], r["seq"],
                            r["retry_count"], r["verdict"], r["payload"], r["retired"])
                           for r in rows])
            msgs = [r for r in rows if r["kind"] == "msg"]
            if msgs and not step["auto_ack"] and step["then"] == "ack":
                await store.ack([AckRow(r["transaction_id"], str(r["partition_id"]), "completed",
                                        None, step["group"], lease) for r in msgs])
            elif msgs and not step["auto_ack"] and step["then"] == "expire":
                async with store.connection() as c:
                    await c.execute("UPDATE queen.log_consumers SET lease_expires_at = now()"
                                    " - interval '1 second' WHERE lease_id = $1", lease)
        assert popped[NEW] == popped[OLD], f"step {n}: {step}"
        assert await consumer_state(store, queues[NEW]) == \
            await consumer_state(store, queues[OLD]), f"step {n}: {step}"
