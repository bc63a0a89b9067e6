"""Spool drain: a set-based prototype beside the raw COPY limit and today's replay (issue 25).

    .venv/bin/python benchmarks/drain_sql.py [--events 100000] [--partitions 200] [--spools 3]
                                             [--current-events 20000] [--batches 10000,50000]

Starts an embedded PostgreSQL (or uses PG_HOST/PG_PORT/PG_USER/PG_PASSWORD/PG_DB), applies the
broker's schema, and measures on that one database, in one run:

  raw limit   COPY of the synthetic events into an UNLOGGED and into a logged table shaped like
              the staging table, and one INSERT ... SELECT of them into a copy of
              queen.messages (same columns and indexes, no foreign keys);
  prototype   the drain as issue 25 asks for it: each spool uploads its files with COPY into a
              durable staging table (one transaction per file, recorded in a ledger so that a
              re-upload after a crash is a no-op), then a plpgsql function merges staged rows
              into queen.messages in batches, per partition in accept order, with dedup by
              transactionId (against stored messages and across spools: first accept wins),
              positions, missing partitions created, merged rows deleted in the same
              transaction. Run once per --batches size, each on fresh queues, one step at a
              time on one connection; then once more with every spool uploading on its own
              connection while the merger runs beside them (the first batch size);
  current     the same kind of events replayed through queen.push_ordered_v2 in chunks of
              FILE_BUFFER_MAX_BATCH=100 as the spool's drain sends them: once without any
              spool backlog (one broker) and once merged across --spools registered spools
              (SQL cost only: the drain's retry timers are not simulated, so this is an upper
              bound of today's path).

The prototype lives in schema ``drain_proto`` (never in ``queen``), which is dropped at the end,
like the benchmark's queues. Every result is checked: each non-duplicate event stored exactly
once, per-partition order = accept order, positions 1..n, duplicates counted, the first
accepted copy of a duplicated transactionId kept, encrypted events stored as encrypted.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import asyncpg  # noqa: E402
import ujson  # noqa: E402
import uuid_utils  # noqa: E402

from _drain_proto_sql import (  # noqa: E402
    COUNT_STAGED,
    LEDGER_INSERT,
    MERGE_CALL,
    PROTO_DDL,
    PROTO_MERGE,
    PUSH_CALL,
    SPOOL_REGISTER,
    STAGED_COLUMNS,
)
from _harness import start_database  # noqa: E402
from broker.store import sql as broker_sql  # noqa: E402
from broker.store.schema import apply_schema  # noqa: E402

MAX_BATCH = 100          # FILE_BUFFER_MAX_BATCH: events per replay round trip today
EVENTS_PER_FILE = 10000  # FILE_BUFFER_EVENTS_PER_FILE: a spool file's size
WAIT_MS = 30000          # FILE_BUFFER_ORDER_WAIT_MS
QUEUES = 4               # partitions are spread over this many queues; the last is encrypted
MERGER = "merger-0"      # the server id of the broker running the merge
RNG_SEED = 25

# -- synthetic spools ---------------------------------------------------------------------------


@dataclass
class Event:
    """One spooled push item, as a spool file record holds it after the drain has read it."""
    accept_us: int
    spool: str
    file_ms: int
    file_seq: int
    rec_no: int
    queue: str
    partition: str
    message_id: str
    txid: str
    payload: str
    encrypted: bool

    @property
    def key(self) -> tuple:
        return (self.accept_us, self.spool, self.file_ms, self.file_seq, self.rec_no)

    @property
    def pair(self) -> tuple[str, str]:
        return self.queue, self.partition


@dataclass
class Dataset:
    """The spools' events and what the cluster must end up storing."""
    prefix: str
    events: list[Event]
    files: dict[str, list[list[Event]]]      # per spool, its files in name order
    seeded: dict[tuple[str, str], list[str]]  # txids stored before the drain, per pair
    expected: dict[tuple[str, str], list[str]] = field(default_factory=dict)  # txids by seq
    winners: dict[tuple[str, str, str], str] = field(default_factory=dict)    # -> message id
    duplicates: int = 0


def payload_text(rng: random.Random, n: int, encrypted: bool) -> str:
    """About 200 bytes of JSON; an AES-GCM envelope's shape for encrypted queues."""
    if encrypted:
        return ujson.dumps({"encrypted": "A" * 160, "iv": "B" * 16, "authTag": "C" * 24})
    return ujson.dumps({"orderId": n, "customer": f"c-{rng.randrange(10**6)}",
                        "amount": rng.randrange(10**5) / 100, "currency": "EUR",
                        "items": [{"sku": f"s-{rng.randrange(999)}", "qty": rng.randrange(9)}
                                  for _ in range(3)],
                        "note": "x" * 40})


def queue_names(prefix: str) -> list[str]:
    return [f"{prefix}.q{k}" for k in range(QUEUES)]


def make_dataset(prefix: str, n: int, partitions: int, spools: int, seed: int) -> Dataset:
    """``n`` events accepted by ``spools`` brokers while PostgreSQL was down: pushes of 1-5
    items at interleaved accept times (ties across spools included), ~1% repeating an earlier
    transactionId of the same partition from another spool, ~0.5% repeating one stored
    before the outage; files rotate every EVENTS_PER_FILE events."""
    rng = random.Random(seed)
    queues = queue_names(prefix)
    pairs = [(queues[k % QUEUES], f"p{k}") for k in range(partitions)]
    seeded = {pair: [f"{prefix}-seed-{k}-{j}" for j in range(5)]
              for k, pair in enumerate(pairs[: partitions // 2])}  # the other half is missing
    spool_ids = [f"spool-{chr(97 + s)}" for s in range(spools)]
    last = dict.fromkeys(spool_ids, 0)
    per_spool: dict[str, list[list]] = {s: [] for s in spool_ids}
    history: dict[tuple[str, str], list[tuple[str, str]]] = defaultdict(list)  # (txid, spool)
    t = int(time.time() * 1e6) - 3600 * 10**6  # an hour ago: before any "now" floor
    count = 0
    while count < n:
        spool = rng.choice(spool_ids)
        t += rng.randrange(0, 30)  # 0: a tie with another spool's push
        accept = max(t, last[spool] + 1)  # one spool's accept times only rise
        last[spool] = accept
        for _ in range(min(rng.choice((1, 1, 1, 2, 5)), n - count)):
            pair = rng.choice(pairs)
            txid = f"{prefix}-t{count}"
            roll = rng.random()
            others = [x for x, s in history[pair] if s != spool]
            if roll < 0.01 and others:
                txid = rng.choice(others)
            elif roll < 0.015 and pair in seeded:
                txid = rng.choice(seeded[pair])
            history[pair].append((txid, spool))
            per_spool[spool].append([accept, pair, txid, count])
            count += 1
    events, files = [], {}
    for spool, items in per_spool.items():
        files[spool] = []
        for start in range(0, len(items), EVENTS_PER_FILE):
            chunk = items[start:start + EVENTS_PER_FILE]
            file_ms = chunk[0][0] // 1000
            batch = [Event(acc, spool, file_ms, 0, rec, pair[0], pair[1],
                           str(uuid_utils.uuid7()), txid,
                           payload_text(rng, num, pair[0] == queues[-1]), pair[0] == queues[-1])
                     for rec, (acc, pair, txid, num) in enumerate(chunk)]
            files[spool].append(batch)
            events.extend(batch)
    data = Dataset(prefix, events, files, seeded)
    expect(data)
    return data


def expect(data: Dataset) -> None:
    """What must be stored: per partition, the seeded messages, then each transactionId's
    first accepted copy, in accept order."""
    stored = {pair: list(txids) for pair, txids in data.seeded.items()}
    seen = {pair: set(txids) for pair, txids in data.seeded.items()}
    for e in sorted(data.events, key=lambda e: e.key):
        known = seen.setdefault(e.pair, set())
        if e.txid in known:
            data.duplicates += 1
            continue
        known.add(e.txid)
        stored.setdefault(e.pair, []).append(e.txid)
        data.winners[(e.queue, e.partition, e.txid)] = e.message_id
    data.expected = stored


def renamed(data: Dataset, prefix: str, limit: int) -> Dataset:
    """The first ``limit`` events (accept order) under other queue names, for a path that
    cannot take them all in the time we have; fresh message ids."""
    keep = sorted(data.events, key=lambda e: e.key)[:limit]
    old = data.prefix

    def rename(text: str) -> str:
        return prefix + text[len(old):] if text.startswith(old) else text

    events = [Event(e.accept_us, e.spool, e.file_ms, e.file_seq, e.rec_no, rename(e.queue),
                    e.partition, str(uuid_utils.uuid7()), rename(e.txid), e.payload, e.encrypted)
              for e in keep]
    files: dict[str, list[list[Event]]] = defaultdict(list)
    for e in events:  # keep[] is in accept order, so each spool's events stay in file order
        spool_files = files[e.spool]
        if not spool_files or spool_files[-1][0].file_ms != e.file_ms:
            spool_files.append([])
        spool_files[-1].append(e)
    seeded = {(rename(q), p): [rename(t) for t in txids] for (q, p), txids in data.seeded.items()}
    out = Dataset(prefix, events, dict(files), seeded)
    expect(out)
    return out


# -- setup shared by every phase -------------------------------------------------------------

async def seed_queues(conn: asyncpg.Connection, data: Dataset) -> None:
    """Before the outage: the last queue is encrypted, half the partitions hold 5 messages."""
    await conn.execute("INSERT INTO queen.queues (name, namespace, task, encryption_enabled) "
                       "VALUES ($1, split_part($1, '.', 1), split_part($1, '.', 2), true)",
                       queue_names(data.prefix)[-1])
    rows = [(q, p, t) for (q, p), txids in data.seeded.items() for t in txids]
    n = len(rows)
    await conn.fetch(PUSH_CALL, list(range(n)), [r[0] for r in rows], [r[1] for r in rows],
                     [str(uuid_utils.uuid7()) for _ in rows], [r[2] for r in rows], [None] * n,
                     ['{"seeded": true}'] * n, [False] * n, [None] * n, [0] * n, MERGER, False,
                     None, WAIT_MS)


def oldest_by_pair(events: list[Event]) -> dict[tuple[str, str], int]:
    out: dict[tuple[str, str], int] = {}
    for e in events:
        out[e.pair] = min(out.get(e.pair, e.accept_us), e.accept_us)
    return out


async def register(conn: asyncpg.Connection, spool: str, pending: list[Event]) -> None:
    """A spool's whole backlog in queen.spool_backlog, as the drain's registration sends it."""
    oldest = oldest_by_pair(pending)
    await conn.execute(SPOOL_REGISTER, spool, [q for q, _ in oldest], [p for _, p in oldest],
                       list(oldest.values()), WAIT_MS)


# -- raw limit ---------------------------------------------------------------------------------

def staged_record(e: Event) -> tuple:
    return (e.accept_us, e.spool, e.file_ms, e.file_seq, e.rec_no, e.queue, e.partition,
            e.message_id, e.txid, None, e.payload, e.encrypted, None)


async def timed(conn: asyncpg.Connection, work) -> float:
    """Seconds ``work`` (a coroutine) takes, after a CHECKPOINT: every timed phase starts
    with no dirty buffers left by the one before (shared_buffers is small here)."""
    await conn.execute("CHECKPOINT")
    t0 = time.perf_counter()
    await work
    return time.perf_counter() - t0


RAW_INSERT = """
INSERT INTO drain_proto.{table}
    (id, partition_id, seq, transaction_id, trace_id, payload, is_encrypted, producer_sub)
SELECT r.message_id, p.id, row_number() OVER (), r.message_id::text, r.trace_id,
       r.payload, r.is_encrypted, r.producer_sub
FROM drain_proto.raw_logged r
JOIN queen.queues q ON q.name = r.queue_name
JOIN queen.partitions p ON p.queue_id = q.id AND p.name = r.partition_name"""


async def raw_limit(conn: asyncpg.Connection, data: Dataset) -> dict[str, float]:
    """Seconds for the bare operations the drain is built of, on the same events: COPY into
    the staging table's shape (unlogged, logged), then one INSERT ... SELECT of those rows
    into a copy of queen.messages (its columns, defaults and indexes) without and with the
    foreign key to queen.partitions (checked row by row, as in queen.messages). Positions
    and transactionIds are any unique values here: no per-partition sort, no dedup."""
    records = [staged_record(e) for e in data.events]
    out = {}
    for kind in ("unlogged", "logged"):
        await conn.execute(f"CREATE {'UNLOGGED' if kind == 'unlogged' else ''} TABLE "
                           f"drain_proto.raw_{kind} (LIKE drain_proto.staged INCLUDING ALL)")
        out[f"copy {kind}"] = await timed(conn, conn.copy_records_to_table(
            f"raw_{kind}", schema_name="drain_proto", records=records, columns=STAGED_COLUMNS))
    await conn.execute("""
        INSERT INTO queen.queues (name) SELECT DISTINCT queue_name FROM drain_proto.raw_logged;
        INSERT INTO queen.partitions (queue_id, name)
        SELECT DISTINCT q.id, r.partition_name FROM drain_proto.raw_logged r
        JOIN queen.queues q ON q.name = r.queue_name;
        CREATE TABLE drain_proto.raw_nofk (LIKE queen.messages INCLUDING ALL);
        CREATE TABLE drain_proto.raw_fk (LIKE queen.messages INCLUDING ALL,
            FOREIGN KEY (partition_id) REFERENCES queen.partitions (id));""")
    for table in ("raw_nofk", "raw_fk"):
        name = "INSERT messages" + (" (+ FK)" if table == "raw_fk" else " (no FK)")
        out[name] = await timed(conn, conn.execute(RAW_INSERT.format(table=table)))
    await conn.execute("DROP TABLE drain_proto.raw_unlogged, drain_proto.raw_logged, "
                       "drain_proto.raw_nofk, drain_proto.raw_fk")
    return out


# -- the prototype -----------------------------------------------------------------------------

async def upload_file(conn: asyncpg.Connection, spool: str, events: list[Event],
                      remaining: list[Event], crash: bool = False, built: bool = False) -> int:
    """One spool file into staging, in one transaction: the ledger row first (a file uploaded
    before is skipped), the rows by COPY, the per-partition counters, and this spool's backlog
    registration narrowed to what is still on its disk. Returns the rows staged (0: already
    uploaded; the caller then just deletes the file). ``crash``: roll back at the end, as a
    broker dying before the commit would. ``built``: the broker's own tables and SQL
    (migration 0010, broker/store/sql.py) instead of the prototype's."""
    first = events[0]
    tx = conn.transaction()
    await tx.start()
    try:
        if not await conn.fetchval(broker_sql.UPLOAD_LEDGER if built else LEDGER_INSERT,
                                   spool, first.file_ms, first.file_seq, len(events)):
            await tx.rollback()
            return 0
        await conn.copy_records_to_table("staged", schema_name="queen" if built else "drain_proto",
                                         records=[staged_record(e) for e in events],
                                         columns=STAGED_COLUMNS)
        counts: dict[tuple[str, str], int] = defaultdict(int)
        for e in events:
            counts[e.pair] += 1
        await conn.execute(broker_sql.STAGE_COUNT if built else COUNT_STAGED,
                           [q for q, _ in counts], [p for _, p in counts], list(counts.values()))
        await register(conn, spool, remaining)
    except BaseException:
        await tx.rollback()
        raise
    if crash:
        await tx.rollback()
        return 0
    await tx.commit()
    return len(events)


async def merge_all(conn: asyncpg.Connection, batch: int, stats: dict, built: bool = False) -> None:
    """Merge batches until nothing eligible is left."""
    while True:
        rows = await (conn.fetch(broker_sql.MERGE_STAGED, batch, MERGER, WAIT_MS, 0) if built
                      else conn.fetch(MERGE_CALL, batch, MERGER, WAIT_MS))
        if not rows:
            return
        stats["calls"] += 1
        stats["merged"] += sum(r["merged"] for r in rows)
        stats["duplicates"] += sum(r["duplicates"] for r in rows)
        stats["late"] += sum(r["late"] for r in rows)
        # After the commit the broker would wake these: hints.pushed(pairs with merged > 0).
        stats["woken"] += sum(1 for r in rows if r["merged"] > 0)


async def upload_spool(conn: asyncpg.Connection, spool: str, files: list[list[Event]],
                       built: bool = False) -> int:
    """A spool's files, oldest first, each in its own transaction; the rows staged."""
    staged = 0
    for k, events in enumerate(files):
        staged += await upload_file(conn, spool, events, [e for f in files[k + 1:] for e in f],
                                    built=built)
    return staged


async def outage(conn: asyncpg.Connection, data: Dataset) -> None:
    """Every spool holds its events and says so in queen.spool_backlog; the merger beats.
    The ledger is emptied: each run replays the same file names on fresh queues."""
    await conn.execute("TRUNCATE drain_proto.uploaded_files")
    await conn.execute("DELETE FROM queen.uploaded_files WHERE spool_id LIKE 'spool-%'")
    for spool in sorted(data.files):
        await register(conn, spool, [e for f in data.files[spool] for e in f])
    await conn.execute("SELECT queen.spool_beat($1, $2)", MERGER, WAIT_MS)


def new_stats() -> dict:
    return dict.fromkeys(("calls", "merged", "duplicates", "late", "woken", "staged"), 0)


async def prototype(conn: asyncpg.Connection, data: Dataset, batch: int,
                    built: bool = False) -> dict:
    """One connection, one step at a time: the first spool uploads and a merge runs (only
    what no other spool holds back may go), the other spools upload, the merge finishes."""
    await outage(conn, data)
    stats = new_stats()
    spools = sorted(data.files)
    staged = [0]

    async def upload(names: list[str]) -> None:
        for spool in names:
            staged[0] += await upload_spool(conn, spool, data.files[spool], built)

    upload_s = await timed(conn, upload(spools[:1]))
    merge_s = await timed(conn, merge_all(conn, batch, stats, built))
    partial = stats["merged"] + stats["duplicates"]
    upload_s += await timed(conn, upload(spools[1:]))
    merge_s += await timed(conn, merge_all(conn, batch, stats, built))
    stats.update(staged=staged[0], upload_s=upload_s, merge_s=merge_s, partial=partial)
    return stats


async def concurrent_drain(dsn: str, data: Dataset, batch: int) -> dict:
    """What a cluster would do: every spool uploads on its own connection while one merger
    merges whatever no spool holds back, until staging is empty. Wall time, start to end."""
    conns = [await asyncpg.connect(dsn) for _ in range(len(data.files) + 1)]
    try:
        merger, uploaders = conns[0], conns[1:]
        await outage(merger, data)
        await merger.execute("CHECKPOINT")
        stats = new_stats()
        uploaded = [False]

        async def merge_until_done() -> None:
            while True:
                finished = uploaded[0]  # read before the call: a later upload is seen next time
                before = stats["calls"]
                await merge_all(merger, batch, stats)
                if finished and stats["calls"] == before:
                    return
                await asyncio.sleep(0.005)

        async def upload_all() -> None:
            counts = await asyncio.gather(*(upload_spool(c, spool, data.files[spool])
                                            for c, spool in zip(uploaders, sorted(data.files))))
            stats["staged"] = sum(counts)
            uploaded[0] = True

        t0 = time.perf_counter()
        await asyncio.gather(upload_all(), merge_until_done())
        stats["seconds"] = time.perf_counter() - t0
        return stats
    finally:
        for c in conns:
            await c.close()


async def check_idempotent_upload(conn: asyncpg.Connection, data: Dataset) -> None:
    """A file uploaded again after its commit (the broker died before deleting it) stages
    nothing; an upload rolled back half-way (died before the commit) leaves nothing behind."""
    spool = sorted(data.files)[0]
    again = await upload_file(conn, spool, data.files[spool][0], [])
    assert again == 0, f"a committed file was staged again ({again} rows)"
    ghost = [Event(e.accept_us, e.spool, e.file_ms + 10**9, 0, e.rec_no, e.queue, e.partition,
                   str(uuid_utils.uuid7()), e.txid, e.payload, e.encrypted)
             for e in data.files[spool][0][:50]]
    assert await upload_file(conn, spool, ghost, [], crash=True) == 0
    left = await conn.fetchval("SELECT count(*) FROM drain_proto.uploaded_files "
                               "WHERE file_ms = $1", ghost[0].file_ms)
    assert left == 0, "a rolled-back upload left its ledger row"
    assert await upload_file(conn, spool, ghost, []) == len(ghost), "re-upload after a crash"
    await conn.execute("DELETE FROM drain_proto.staged WHERE file_ms = $1", ghost[0].file_ms)
    await conn.execute("DELETE FROM drain_proto.staged_partitions")
    await register(conn, spool, [])


# -- today's path -------------------------------------------------------------------------------

def next_accepts(events: list[Event], floor: int) -> list[int]:
    """Per event: the accept time of the same spool's next event to its partition, or
    ``floor`` (the spool's _next_accepts)."""
    seen: dict[tuple[str, str], int] = {}
    out = [0] * len(events)
    for k in range(len(events) - 1, -1, -1):
        out[k] = seen.get(events[k].pair, floor)
        seen[events[k].pair] = events[k].accept_us
    return out


async def replay_chunk(conn: asyncpg.Connection, spool: str, chunk: list[Event],
                       nxt: list[int] | None) -> list[asyncpg.Record]:
    n = len(chunk)
    return await conn.fetch(
        PUSH_CALL, list(range(n)), [e.queue for e in chunk], [e.partition for e in chunk],
        [str(uuid_utils.uuid7()) for _ in chunk], [e.txid for e in chunk], [None] * n,
        [e.payload for e in chunk], [e.encrypted for e in chunk], [None] * n,
        [e.accept_us for e in chunk], spool, True, nxt, WAIT_MS)


async def current_path(conn: asyncpg.Connection, data: Dataset, merged: bool) -> dict:
    """Each spool's events through push_ordered_v2 in replay mode, MAX_BATCH per call. With
    ``merged`` every spool is registered first and the spools take turns as the drain cycles
    do: a pass over a spool's pending events skips partitions that answered ``waiting``, then
    the spool re-registers what it still holds."""
    if merged:
        pending = {s: [e for f in files for e in f] for s, files in data.files.items()}
    else:  # one broker's spool: every event, in accept order
        pending = {"spool-a": sorted(data.events, key=lambda e: e.key)}
    floor = int(time.time() * 1e6)
    stats = dict.fromkeys(("calls", "queued", "duplicates", "waiting", "late"), 0)
    if merged:
        for spool, events in pending.items():
            await register(conn, spool, events)
    t0 = time.perf_counter()
    while any(pending.values()):
        for spool in sorted(pending):
            events = pending[spool]
            if not events:
                continue
            nxt = next_accepts(events, floor) if merged else None
            blocked: set[tuple[str, str]] = set()
            done: set[int] = set()
            k = 0
            while k < len(events):
                idx = []
                while k < len(events) and len(idx) < MAX_BATCH:
                    if events[k].pair not in blocked:
                        idx.append(k)
                    k += 1
                if not idx:
                    break
                rows = await replay_chunk(conn, spool, [events[i] for i in idx],
                                          [nxt[i] for i in idx] if nxt else None)
                stats["calls"] += 1
                for i, row in zip(idx, rows):
                    if row["status"] == "waiting":
                        blocked.add(events[i].pair)
                        stats["waiting"] += 1
                        continue
                    stats["queued" if row["status"] == "queued" else "duplicates"] += 1
                    stats["late"] += bool(row["late"])
                    done.add(i)
            pending[spool] = [e for i, e in enumerate(events) if i not in done]
            if merged:
                await register(conn, spool, pending[spool])
    stats["seconds"] = time.perf_counter() - t0
    return stats


# -- checks ---------------------------------------------------------------------------------------

async def check_stored(conn: asyncpg.Connection, data: Dataset, check_ids: bool) -> int:
    """Every partition holds exactly the expected transactionIds in position order, at
    positions 1..n, with last_seq = n; the winning copy's message id when ``check_ids``;
    encrypted queue's events stored as encrypted. Returns the partitions checked."""
    rows = await conn.fetch("""
        SELECT q.name AS queue, p.name AS partition, p.last_seq,
               array_agg(m.transaction_id ORDER BY m.seq) AS txids,
               array_agg(m.id::text ORDER BY m.seq) AS ids,
               array_agg(m.seq ORDER BY m.seq) AS seqs,
               bool_and(m.is_encrypted OR m.payload ? 'seeded') AS all_enc
        FROM queen.queues q JOIN queen.partitions p ON p.queue_id = q.id
        JOIN queen.messages m ON m.partition_id = p.id
        WHERE q.name LIKE $1 || '.%'
        GROUP BY q.name, p.name, p.last_seq""", data.prefix)
    got = {(r["queue"], r["partition"]): r for r in rows}
    assert set(got) == set(data.expected), (
        f"{data.prefix}: partitions differ: missing {set(data.expected) - set(got)}, "
        f"extra {set(got) - set(data.expected)}")
    enc_queue = queue_names(data.prefix)[-1]
    for pair, txids in data.expected.items():
        r = got[pair]
        assert list(r["txids"]) == txids, f"{data.prefix} {pair}: stored order != accept order"
        assert list(r["seqs"]) == list(range(1, len(txids) + 1)), f"{pair}: positions not 1..n"
        assert r["last_seq"] == len(txids), f"{pair}: last_seq {r['last_seq']} != {len(txids)}"
        if pair[0] == enc_queue:
            assert r["all_enc"], f"{pair}: an encrypted event stored as plain"
        if check_ids:
            for txid, mid in zip(r["txids"], r["ids"]):
                want = data.winners.get((pair[0], pair[1], txid))
                assert want is None or want == mid, f"{pair} {txid}: not the first accept kept"
    return len(rows)


# -- the run ----------------------------------------------------------------------------------------

def rate(n: int, seconds: float) -> float:
    return n / seconds if seconds > 0 else float("inf")


Row = tuple[str, int, float, str]  # (what, events, events/s, notes)


async def check_drained(conn: asyncpg.Connection, data: Dataset, st: dict,
                        built: bool = False) -> str:
    """The prototype's invariants after a drain; a note for the table."""
    n = len(data.events)
    assert st["staged"] == n, f"{data.prefix}: staged {st['staged']} of {n}"
    assert st["merged"] + st["duplicates"] == n, f"{data.prefix}: merge settled {st}"
    assert st["duplicates"] == data.duplicates, (
        f"{data.prefix}: duplicates {st['duplicates']} != expected {data.duplicates}")
    assert st["late"] == 0, f"{data.prefix}: {st['late']} merged events flagged late"
    schema = "queen" if built else "drain_proto"
    left = await conn.fetchval(f"SELECT (SELECT count(*) FROM {schema}.staged) + "
                               f"(SELECT count(*) FROM {schema}.staged_partitions)")
    assert left == 0, f"{data.prefix}: {left} staging rows or counters left after the merge"
    parts = await check_stored(conn, data, check_ids=True)
    return f"{st['calls']} merges, {st['duplicates']} dups, {parts} partitions"


async def run_raw(conn: asyncpg.Connection, base: Dataset) -> tuple[list[Row], float]:
    n = len(base.events)
    raw = await raw_limit(conn, base)
    rows = [(f"raw: {name}", n, rate(n, secs), "") for name, secs in raw.items()]
    limit = rate(n, raw["copy logged"] + raw["INSERT messages (+ FK)"])
    rows.append(("raw: COPY logged + INSERT messages (+ FK)", n, limit, "= the raw limit"))
    nofk = rate(n, raw["copy logged"] + raw["INSERT messages (no FK)"])
    rows.append(("raw: COPY logged + INSERT messages (no FK)", n, nofk, ""))
    return rows, limit


async def run_prototype(conn: asyncpg.Connection, base: Dataset, batch: int,
                        limit: float) -> list[Row]:
    n = len(base.events)
    data = renamed(base, f"drainbench-b{batch}", n)
    await seed_queues(conn, data)
    st = await prototype(conn, data, batch)
    note = await check_drained(conn, data, st)
    total = st["upload_s"] + st["merge_s"]
    return [
        (f"proto upload (COPY + ledger), batch {batch}", n, rate(n, st["upload_s"]),
         f"{len(data.files)} spools, one file per transaction"),
        (f"proto merge, batch {batch}", n, rate(n, st["merge_s"]),
         f"{note}; {st['partial']} merged before the other spools uploaded"),
        (f"proto drain, one step at a time, batch {batch}", n, rate(n, total),
         f"upload + merge times added; {rate(n, total) / limit:.2f} x raw limit"),
    ]


async def run_built(conn: asyncpg.Connection, base: Dataset, batch: int,
                    limit: float) -> list[Row]:
    """The broker's drain as built (queen.staged, queen.merge_staged), the same steps."""
    n = len(base.events)
    data = renamed(base, f"drainbench-built{batch}", n)
    await seed_queues(conn, data)
    st = await prototype(conn, data, batch, built=True)
    note = await check_drained(conn, data, st, built=True)
    total = st["upload_s"] + st["merge_s"]
    return [
        (f"built upload (queen.staged), batch {batch}", n, rate(n, st["upload_s"]),
         "one file per transaction"),
        (f"built merge (queen.merge_staged), batch {batch}", n, rate(n, st["merge_s"]), note),
        (f"built drain, one step at a time, batch {batch}", n, rate(n, total),
         f"upload + merge times added; {rate(n, total) / limit:.2f} x raw limit"),
    ]


async def run_concurrent(conn: asyncpg.Connection, dsn: str, base: Dataset, batch: int,
                         limit: float) -> list[Row]:
    n = len(base.events)
    data = renamed(base, f"drainbench-c{batch}", n)
    await seed_queues(conn, data)
    st = await concurrent_drain(dsn, data, batch)
    note = await check_drained(conn, data, st)
    r = rate(n, st["seconds"])
    return [(f"proto drain, {len(data.files)} uploaders + merger, batch {batch}", n, r,
             f"{note}; {r / limit:.2f} x raw limit")]


async def run_current(conn: asyncpg.Connection, base: Dataset, m: int) -> list[Row]:
    rows = []
    for merged in (False, True):
        data = renamed(base, f"drainbench-cur{int(merged)}", m)
        await seed_queues(conn, data)
        await conn.execute("CHECKPOINT")
        st = await current_path(conn, data, merged)
        assert st["queued"] + st["duplicates"] == m, f"current path settled {st}"
        assert st["duplicates"] == data.duplicates, "current path: duplicates differ"
        await check_stored(conn, data, check_ids=False)
        label = ("current: push_ordered_v2 replay, merged across spools" if merged
                 else "current: push_ordered_v2 replay, one spool")
        rows.append((label, m, rate(m, st["seconds"]),
                     f"{st['calls']} calls, {st['waiting']} waiting answers, "
                     f"{st['late']} late"))
    return rows


async def run(args: argparse.Namespace, dsn: str) -> list[Row]:
    conn = await asyncpg.connect(dsn)
    table: list[Row] = []
    try:
        await apply_schema(conn)
        await conn.execute("DROP SCHEMA IF EXISTS drain_proto CASCADE")
        await conn.execute(PROTO_DDL)
        await conn.execute(PROTO_MERGE)
        base = make_dataset("drainbench-raw", args.events, args.partitions, args.spools,
                            RNG_SEED)
        rows, limit = await run_raw(conn, base)
        table += rows
        for batch in args.batches:
            table += await run_prototype(conn, base, batch, limit)
            if batch == args.batches[0]:
                await check_idempotent_upload(conn, renamed(base, f"drainbench-b{batch}",
                                                            args.events))
        table += await run_built(conn, base, args.batches[0], limit)
        table += await run_concurrent(conn, dsn, base, args.batches[0], limit)
        table += await run_current(conn, base, min(args.current_events, args.events))
    finally:
        await cleanup(conn)
        await conn.close()
    return table


async def cleanup(conn: asyncpg.Connection) -> None:
    """Drop what this run made (it matters on an external PG_HOST database)."""
    await conn.execute("DROP SCHEMA IF EXISTS drain_proto CASCADE")
    await conn.execute("DELETE FROM queen.queues WHERE name LIKE 'drainbench-%'")
    await conn.execute("DELETE FROM queen.spool_backlog WHERE server_id LIKE 'spool-%'")
    await conn.execute("DELETE FROM queen.uploaded_files WHERE spool_id LIKE 'spool-%'")
    await conn.execute("DELETE FROM queen.spool_backlog WHERE queue_name LIKE 'drainbench-%'")
    await conn.execute("DELETE FROM queen.spool_servers WHERE server_id LIKE 'spool-%' "
                       "OR server_id = $1", MERGER)


def print_table(table: list[Row], load: tuple[float, ...], elapsed: float) -> None:
    limit = next(r for name, _n, r, _note in table if name.endswith("(+ FK)")
                 and name.startswith("raw: COPY"))
    print(f"load average before / after: {load[0]:.2f} / {load[1]:.2f} (1 min); "
          f"{os.cpu_count()} cores; {elapsed:.0f} s")
    print(f"{'path':<56} {'events':>8} {'events/s':>10} {'/ limit':>8}  notes")
    for name, n, r, note in table:
        print(f"{name:<56} {n:>8} {r:>10,.0f} {r / limit:>8.2f}  {note}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--partitions", type=int, default=200)
    parser.add_argument("--spools", type=int, default=3)
    parser.add_argument("--current-events", type=int, default=20_000,
                        help="events replayed through today's path (slow)")
    parser.add_argument("--batches", default="10000,50000",
                        help="merge batch sizes, comma-separated (each is a full drain)")
    args = parser.parse_args()
    args.batches = [int(b) for b in args.batches.split(",") if b]
    if args.events < 1 or args.partitions < 2 or not 1 <= args.spools <= 26 or not args.batches:
        parser.error("need --events >= 1, --partitions >= 2, 1 <= --spools <= 26, a batch size")
    started, load0 = time.perf_counter(), os.getloadavg()[0]
    db = start_database()
    try:
        table = asyncio.run(run(args, db.dsn))
    finally:
        db.stop()
    print_table(table, (load0, os.getloadavg()[0]), time.perf_counter() - started)
    return 0


if __name__ == "__main__":
    sys.exit(main())
