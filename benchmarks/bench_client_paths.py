"""``client_paths``: the official client's (``queen-mq`` 2.6) fast paths against its JSON paths,
side by side in one run.

One PostgreSQL and one broker.  Registered in run.py (``python3 dev.py bench client_paths``).

1. **Push, 100 items per request**, ``--concurrency`` client tasks over ``--partitions``
   partitions (one partition per request), each variant on a fresh queue with
   ``--client-paths-push-n`` messages: the JSON body (``{"items": [...]}``), the binary body
   ``QPB1`` the client sends with ``binary_push=True`` (``encode_push_binary``, transaction ids
   on), and the framed, zstd-compressed groups it sends with ``push_compression=True`` as well
   (``encode_push_frames``); ``Content-Type: application/x-queen-push``.  Every body is built
   before the clock starts.
2. **Pop + ack, batch 100**: ``GET /api/v1/pop/queue/{q}?batch=100&wait=false`` + ``POST
   /api/v1/ack/batch`` (JSON answer) against the same pop with ``&frames=true`` (the ``QPF1``
   answer, unpacked with the client's ``decode_pop_frames``; acked with each message's
   ``transactionId``, ``partitionId``, a decimal partition handle there, and ``leaseId``), each on
   a queue pre-filled off the clock with ``--client-paths-pop-n`` messages.  A probe first asks
   for one framed pop: a broker that answers it with JSON does not serve ``frames=true``, and the
   framed row then says "not served (JSON answer)" instead of being measured.  Every delivered
   message is checked against what was pushed (transaction id known, delivered once, payload
   equal).
3. **consume() drain**: a backlog of ``--client-paths-drain-n`` messages over ``--partitions``
   partitions, pre-filled off the clock, drained by the client's ``consume()`` with
   ``--client-paths-drain-concurrency`` workers: once with batch and partitions left unset (the
   2.6 client sends ``autopilot=true`` and the broker sizes both), then once per
   ``--client-paths-drain-batches`` size with ``--client-paths-drain-partitions`` partitions per
   pop, each on a fresh queue.  Every drain uses long polls of 1 s (so the workers stop soon after
   the stop signal) and auto-ack.  Reported: the time until every message was handled, the pops
   it took and, for autopilot, the mean batch the broker chose (from ``/metrics/prometheus``).

Every phase reports msg/s and the broker's CPU per 1,000 messages (``BrokerMeter``).
Invariants (exit 1): an HTTP error or refused item or ack in a measured phase, a wrong pop answer,
a drain that loses or duplicates a message, a 5xx the broker counted during a drain.  The targets
(binary push >= 1.5 x JSON msg/s, framed pop + ack >= 1.3 x JSON, autopilot drain time <= 1.2 x
the best hand-tuned one) are rows of the targets table (_targets.py), not failures.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import httpx
from queen.http.pop_frames import decode_pop_frames, is_pop_frames
from queen.http.push_binary import (
    PUSH_BINARY_CONTENT_TYPE,
    PushBatch,
    encode_push_binary,
    encode_push_frames,
)

import _loadgen as loadgen
from _harness import Broker, BrokerMeter, fmt_broker
from _loadgen import (
    JSON_HEADERS,
    Env,
    Phase,
    Rows,
    ack_completed,
    broker_summary,
    check_phases,
    fmt_ms,
    fmt_rate,
    fmt_ratio,
    http_client,
    http_push,
    latency_summary,
    log,
    median,
    ratio,
    run_workers,
    table,
    warm_up,
)

NAME = "client_paths"
BATCH = 100
BINARY_HEADERS = {"content-type": PUSH_BINARY_CONTENT_TYPE}
NOT_SERVED = "not served (JSON answer)"

# (key, label, headers, encoder of one partition's batch; None: the JSON body of Rows)
PUSH_VARIANTS: list[tuple[str, str, dict[str, str], Callable[[list[PushBatch]], bytes] | None]] = [
    ("json", "JSON {items}", JSON_HEADERS, None),
    ("binary", "binary QPB1", BINARY_HEADERS, encode_push_binary),
    ("frames", "framed+zstd QPB1", BINARY_HEADERS, encode_push_frames),
]
POP_VARIANTS = [("json", "JSON answer", ""), ("frames", "framed QPF1 (frames=true)", "&frames=true")]


def _count(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text}: must be >= 1")
    return value


def _counts(text: str) -> list[int]:
    return [_count(x) for x in text.split(",") if x.strip()]


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--client-paths-push-n", type=_count, default=50000,
                    help="client_paths: messages pushed per push variant (batch 100)")
    ap.add_argument("--client-paths-pop-n", type=_count, default=40000,
                    help="client_paths: messages popped and acked per pop variant (batch 100)")
    ap.add_argument("--client-paths-drain-n", type=_count, default=10000,
                    help="client_paths: backlog drained by each consume() run")
    ap.add_argument("--client-paths-drain-batches", type=_counts, default="10,100,500",
                    metavar="B,B,...",
                    help="client_paths: the hand-tuned consume() batch sizes")
    ap.add_argument("--client-paths-drain-partitions", type=_count, default=1,
                    help="client_paths: partitions per pop of the hand-tuned consume() runs")
    ap.add_argument("--client-paths-drain-concurrency", type=_count, default=16,
                    help="client_paths: consume() workers of every drain (autopilot's too)")


# ----------------------------------------------------------------------------------------------
# one closed-loop driver for the push and the pop+ack phases
# ----------------------------------------------------------------------------------------------

Step = Callable[[Any], Awaitable[bool]]
"""One request (or a pop and its ack) on the load generator's client; False: nothing left."""

CLIENT_ERRORS = (httpx.HTTPError, OSError, asyncio.IncompleteReadError, ValueError, KeyError)


async def drive(url: str, phase: Phase, concurrency: int, cap_s: float, step: Step) -> None:
    """Runs ``step`` on ``concurrency`` tasks until the phase has its messages, a step says
    there is nothing left, or ``cap_s`` passed; a step's exception is one error of the phase."""
    async with http_client(url, concurrency) as client:
        deadline = time.perf_counter() + cap_s

        async def worker(_: int) -> None:
            while phase.done < phase.target and time.perf_counter() < deadline:
                try:
                    if not await step(client):
                        return
                except CLIENT_ERRORS as exc:
                    phase.error(repr(exc))

        phase.elapsed = await run_workers(concurrency, worker)


async def timed(env: Env, args: argparse.Namespace, phase: Phase, step: Step) -> Phase:
    """``drive`` with the broker's figures (``phase.broker``) and the load generator's own CPU
    per 1,000 messages (``phase.client_cpu``: this process, all its threads)."""
    meter = BrokerMeter(env.broker)
    cpu = time.process_time()
    await drive(env.broker.url, phase, args.concurrency, args.max_seconds, step)
    phase.broker = meter.figures(phase.done)
    used_ms = (time.process_time() - cpu) * 1000
    phase.client_cpu = used_ms * 1000 / phase.done if phase.done else None
    return phase


def in_turn(variants: list, rnd: int) -> list:
    """The variants in order in even rounds, reversed in odd ones (--rounds): no variant always
    runs first on a warming broker or last on a filling database."""
    return variants if rnd % 2 == 0 else variants[::-1]


def variant_result(key: str, label: str, n: int, phases: list[Phase]) -> dict:
    """The medians of one variant's rounds."""
    return {"variant": key, "label": label, "messages": n,
            "msgs_per_s": median([p.rate or 0.0 for p in phases]),
            "client_cpu_ms_per_1000": median([p.client_cpu for p in phases
                                              if p.client_cpu is not None]),
            "broker": broker_summary(phases), "phases": [p.as_dict() for p in phases]}


def push_step(phase: Phase, jobs: Iterator[tuple[int, bytes]], headers: dict[str, str]) -> Step:
    async def step(client: Any) -> bool:
        job = next(jobs, None)
        if job is None:
            return False
        items, body = job
        t = time.perf_counter()
        r = await client.post("/api/v1/push", content=body, headers=headers)
        phase.latencies_ms.append((time.perf_counter() - t) * 1000)
        phase.requests += 1
        if r.status_code not in (200, 201):
            phase.error(f"HTTP {r.status_code}: {r.text}")
            return True
        queued = sum(1 for x in r.json() if x.get("status") == "queued")
        phase.done += queued
        if queued != items:
            phase.error(f"{items - queued} of {items} items not queued: {r.text}")
        return True
    return step


class PopCheck:
    """What the pops of one phase delivered, against what was pushed."""

    def __init__(self, rows: Rows) -> None:
        self.expected = {tx: json.loads(p) for tx, p in zip(rows.txids, rows.payloads)}
        self.seen: set[str] = set()
        self.answers = {"framed": 0, "json": 0}
        self.wrong: list[str] = []

    def read(self, content: bytes) -> list[dict]:
        """The messages of one pop answer; counts the answers with messages by their kind (an
        empty answer is JSON either way)."""
        framed = is_pop_frames(content)
        messages = (decode_pop_frames(content) if framed else json.loads(content)).get(
            "messages") or []
        if messages:
            self.answers["framed" if framed else "json"] += 1
        return messages

    def check(self, messages: list[dict]) -> None:
        for m in messages:
            tx = m.get("transactionId")
            if tx not in self.expected:
                self.wrong.append(f"unknown transactionId {tx!r}")
            elif tx in self.seen:
                self.wrong.append(f"{tx} delivered twice")
            elif m.get("data") != self.expected[tx]:
                self.wrong.append(f"{tx}: payload {m.get('data')!r} is not what was pushed")
            self.seen.add(tx)


def pop_ack_step(phase: Phase, path: str, check: PopCheck) -> Step:
    async def step(client: Any) -> bool:
        r = await client.get(path)
        phase.requests += 1
        if r.status_code not in (200, 204):
            phase.error(f"pop HTTP {r.status_code}: {r.text}")
            return True
        messages = check.read(r.content) if r.content else []
        if not messages:  # every partition with messages is leased by another worker
            phase.empty += 1
            await asyncio.sleep(0.002)
            return True
        check.check(messages)
        r = await ack_completed(client, messages)
        phase.requests += 1
        if r.status_code != 200:
            phase.error(f"ack HTTP {r.status_code}: {r.text}")
            return True
        ok = sum(1 for x in r.json() if x.get("success"))
        phase.done += ok
        if ok != len(messages):
            phase.error(f"{len(messages) - ok} acks refused: {r.text}")
        return True
    return step


# ----------------------------------------------------------------------------------------------
# 1. push
# ----------------------------------------------------------------------------------------------

def push_jobs(rows: Rows, queue: str,
              encode: Callable[[list[PushBatch]], bytes] | None) -> list[tuple[int, bytes]]:
    """(items, body) per request: partition by partition as Rows.push_body sends them, in the
    JSON body (``encode`` None) or one partition's batch through the client's encoder."""
    jobs = []
    for k, chunk in enumerate(rows.chunks(BATCH)):
        if encode is None:
            body = rows.push_body(queue, chunk, BATCH)
        else:
            body = encode([PushBatch(queue, f"p{k % rows.partitions}",
                                     [rows.payloads[i].encode() for i in chunk],
                                     [rows.txids[i] for i in chunk])])
        jobs.append((len(chunk), body))
    return jobs


async def measure_push(env: Env, args: argparse.Namespace, failures: list[str]) -> list[dict]:
    n = args.client_paths_push_n
    phases: dict[str, list[Phase]] = {key: [] for key, *_ in PUSH_VARIANTS}
    wire_bytes: dict[str, int] = {}
    for rnd in range(args.rounds):
        rows = Rows(n, args.partitions)
        for key, label, headers, encode in in_turn(PUSH_VARIANTS, rnd):
            queue = f"bench-cp-push-{key}-{uuid.uuid4().hex[:8]}"
            jobs = push_jobs(rows, queue, encode)  # built before the clock starts
            wire_bytes[key] = sum(len(body) for _, body in jobs)
            phase = Phase(f"client_paths push {key} r={rnd}", n)
            await timed(env, args, phase, push_step(phase, iter(jobs), headers))
            log(f"push {label}: {phase.done} msgs in {phase.elapsed:.2f}s = "
                f"{fmt_rate(phase.rate)} msg/s; {fmt_broker(phase.broker)}")
            phases[key].append(phase)
    results = []
    for key, label, *_ in PUSH_VARIANTS:
        check_phases(phases[key], failures)
        results.append({**variant_result(key, label, n, phases[key]),
                        "body_bytes_per_msg": round(wire_bytes[key] / n, 1),
                        "request_ms": latency_summary(phases[key])})
    relative_to_json(results)
    return results


def relative_to_json(results: list[dict]) -> None:
    """Adds each variant's msg/s and broker CPU per message over the JSON variant's."""
    base = results[0]
    for r in results:
        r["ratio_to_json"] = ratio(r["msgs_per_s"], base["msgs_per_s"])
        r["cpu_ratio_to_json"] = ratio(r["broker"]["broker_cpu_ms_per_1000"],
                                       base["broker"]["broker_cpu_ms_per_1000"])


# ----------------------------------------------------------------------------------------------
# 2. pop + ack
# ----------------------------------------------------------------------------------------------

async def probe_frames(url: str) -> str:
    """Whether the broker answers ``frames=true`` with QPF1: "framed", NOT_SERVED, or what it
    answered instead.  The probe's one message is acked under its lease."""
    queue = f"bench-cp-probe-{uuid.uuid4().hex[:8]}"
    fill = await http_push(url, queue, Rows(1, 1), 1, 1, 30, "client_paths frames probe")
    if fill.done != 1:
        return f"probe push failed: {fill.first_error}"
    async with http_client(url, 1) as client:
        r = await client.get(f"/api/v1/pop/queue/{queue}?batch=1&wait=false&frames=true")
        if r.status_code != 200:
            return f"HTTP {r.status_code}: {r.text[:200]}"
        framed = is_pop_frames(r.content)
        messages = (decode_pop_frames(r.content) if framed else r.json()).get("messages") or []
        if messages:
            await ack_completed(client, messages)
    return "framed" if framed else NOT_SERVED


async def prefill(env: Env, args: argparse.Namespace, n: int, what: str,
                  failures: list[str]) -> tuple[Rows, str]:
    """A fresh queue with ``n`` messages over ``--partitions`` partitions (JSON pushes of 100,
    not timed): its rows and its name."""
    rows = Rows(n, args.partitions)
    queue = f"bench-cp-{what}-{uuid.uuid4().hex[:8]}"
    fill = await http_push(env.broker.url, queue, rows, BATCH, args.concurrency, 120,
                           f"client_paths {what} prefill")
    if fill.done != n:
        failures.append(f"client_paths {what} prefill: {fill.done}/{n} queued "
                        f"({fill.first_error})")
    return rows, queue


async def measure_pop(env: Env, args: argparse.Namespace, failures: list[str]) -> list[dict]:
    n = args.client_paths_pop_n
    probe = await probe_frames(env.broker.url)
    log(f"frames=true probe: {probe}")
    if probe not in ("framed", NOT_SERVED):  # a broker that does not know it answers JSON
        failures.append(f"client_paths: the frames=true probe pop failed: {probe}")
    variants = [v for v in POP_VARIANTS if v[0] == "json" or probe == "framed"]
    phases: dict[str, list[Phase]] = {key: [] for key, *_ in variants}
    answers: dict[str, dict[str, int]] = {key: {"framed": 0, "json": 0} for key, *_ in variants}
    for rnd in range(args.rounds):
        for key, label, extra in in_turn(variants, rnd):
            rows, queue = await prefill(env, args, n, f"pop-{key}", failures)
            check = PopCheck(rows)
            phase = Phase(f"client_paths pop {key} r={rnd}", n)
            path = f"/api/v1/pop/queue/{queue}?batch={BATCH}&wait=false{extra}"
            await timed(env, args, phase, pop_ack_step(phase, path, check))
            log(f"pop+ack {label}: {phase.done} msgs in {phase.elapsed:.2f}s = "
                f"{fmt_rate(phase.rate)} msg/s ({phase.empty} empty pops; answers "
                f"{check.answers['framed']} framed, {check.answers['json']} JSON); "
                f"{fmt_broker(phase.broker)}")
            if key == "json" and check.answers["framed"]:
                check.wrong.append(f"{check.answers['framed']} framed answers to pops that did "
                                   f"not ask for frames")
            if check.wrong:
                failures.append(f"client_paths pop {key}: {len(check.wrong)} wrong deliveries "
                                f"(first: {check.wrong[0]})")
            for k, v in check.answers.items():
                answers[key][k] += v
            phases[key].append(phase)
    results = []
    for key, label, _ in POP_VARIANTS:
        if key not in phases:
            results.append({"variant": key, "label": label, "messages": n, "served": False,
                            "probe": probe, "msgs_per_s": None, "ratio_to_json": None,
                            "cpu_ratio_to_json": None, "broker": None})
            continue
        check_phases(phases[key], failures)
        results.append({**variant_result(key, label, n, phases[key]),
                        "served": key == "json" or (answers[key]["json"] == 0
                                                    and answers[key]["framed"] > 0),
                        "probe": probe, "answers": answers[key],
                        "empty_pops": sum(p.empty for p in phases[key])})
    for r in results:
        r["not_served"] = not_served(r)
    if results[1]["broker"] is not None:
        relative_to_json(results)
    else:
        results[0].update(ratio_to_json=1.0, cpu_ratio_to_json=1.0)
    return results


# ----------------------------------------------------------------------------------------------
# 3. consume() drain
# ----------------------------------------------------------------------------------------------

async def broker_metrics(url: str) -> dict[str, float]:
    """``/metrics/prometheus`` as {series: value} (series with their labels)."""
    async with httpx.AsyncClient(base_url=url, timeout=10) as client:
        text = (await client.get("/metrics/prometheus")).text
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            series, _, value = line.rpartition(" ")
            out[series] = float(value)
    return out


POP_REQUESTS = 'queen_requests_total{route="queen.pop.'  # every pop route


def metric_delta(before: dict[str, float], after: dict[str, float], prefix: str) -> float:
    """The growth of every series whose name (with labels) starts with ``prefix``."""
    return sum(v - before.get(k, 0.0) for k, v in after.items() if k.startswith(prefix))


@contextlib.asynccontextmanager
async def quietly_closed(client: Any) -> AsyncIterator[Any]:
    """The client, closed without its "Closing Queen client..." lines on stdout."""
    try:
        yield client
    finally:
        with contextlib.redirect_stdout(io.StringIO()):
            await client.close()


async def drain(broker: Broker, rows: Rows, queue: str, label: str, batch: int | None,
                partitions: int | None, concurrency: int, cap_s: float,
                failures: list[str]) -> dict:
    """One consume() drain of ``queue`` (pre-filled with ``rows``); batch / partitions None:
    left to the client's defaults, i.e. to the broker's autopilot."""
    from queen import Queen

    seen: dict[str, int] = {}
    unique, t_last = 0, 0.0
    all_in, stop = asyncio.Event(), asyncio.Event()

    async def handler(msgs: Any) -> None:
        nonlocal unique, t_last
        for m in msgs if isinstance(msgs, list) else [msgs]:
            tx = m["transactionId"]
            seen[tx] = seen.get(tx, 0) + 1
            if seen[tx] == 1:
                unique += 1
                t_last = time.perf_counter()
        if unique >= rows.n:
            all_in.set()

    async with quietly_closed(Queen(url=broker.url)) as client:
        builder = (client.queue(queue).concurrency(concurrency).timeout_millis(1000)
                   .idle_millis(int(cap_s * 1000)))
        if batch is not None:
            builder = builder.batch(batch)
        if partitions is not None:
            builder = builder.partitions(partitions)
        before = await broker_metrics(broker.url)
        meter = BrokerMeter(broker)
        t0 = time.perf_counter()
        consumer = builder.consume(handler, signal=stop)

        async def run_consumer() -> None:
            await consumer

        task = asyncio.create_task(run_consumer())
        waiter = asyncio.create_task(all_in.wait())
        await asyncio.wait([task, waiter], timeout=cap_s, return_when=asyncio.FIRST_COMPLETED)
        meter.stop()
        drained = await broker_metrics(broker.url)  # pops and autopilot sizes of the drain
        waiter.cancel()
        await asyncio.sleep(0.5)  # a duplicate delivered just after the last one still counts
        stop.set()
        try:
            await asyncio.wait_for(task, timeout=15)
        except TimeoutError:
            task.cancel()
            failures.append(f"client_paths drain {label}: consume() did not stop within 15 s")
        except Exception as exc:  # the client gave up: the loss check below says what it cost
            failures.append(f"client_paths drain {label}: consume() raised {exc!r}")
        after = await broker_metrics(broker.url)

    lost = len(set(rows.txids) - seen.keys())
    duplicated = sum(1 for c in seen.values() if c > 1)
    unexpected = len(seen.keys() - set(rows.txids))
    errors_5xx = metric_delta(before, after, "queen_request_errors_total")
    if lost or duplicated or unexpected:
        failures.append(f"client_paths drain {label}: lost={lost} duplicated={duplicated} "
                        f"unexpected={unexpected}")
    if errors_5xx:
        failures.append(f"client_paths drain {label}: the broker answered {errors_5xx:.0f} "
                        f"requests with 5xx")
    elapsed = t_last - t0 if unique == rows.n else None
    pilot_pops = metric_delta(before, drained, "queen_pop_autopilot_batch_count")
    pops = metric_delta(before, drained, POP_REQUESTS)
    fig = meter.figures(rows.n)
    log(f"drain {label}: {unique}/{rows.n} handled in "
        f"{'-' if elapsed is None else f'{elapsed:.2f}s'}, {pops:.0f} pops; {fmt_broker(fig)}")
    return {"label": label, "batch": batch, "partitions": partitions, "messages": rows.n,
            "elapsed_s": elapsed, "handled": unique, "lost": lost, "duplicated": duplicated,
            "unexpected": unexpected, "errors_5xx": errors_5xx,
            "pops": pops,
            "autopilot_pops": pilot_pops,
            "autopilot_mean_batch": (metric_delta(before, drained, "queen_pop_autopilot_batch_sum")
                                     / pilot_pops if pilot_pops else None),
            "broker": fig}


async def measure_drains(env: Env, args: argparse.Namespace, failures: list[str]) -> dict:
    n, parts = args.client_paths_drain_n, args.client_paths_drain_partitions
    configs = [("autopilot (defaults)", None, None)] + [
        (f"batch {b}, partitions {parts}", b, parts) for b in args.client_paths_drain_batches]
    runs: dict[str, list[dict]] = {label: [] for label, *_ in configs}
    for rnd in range(args.rounds):
        for label, batch, partitions in in_turn(configs, rnd):
            rows, queue = await prefill(env, args, n, "drain", failures)
            runs[label].append(await drain(env.broker, rows, queue, label, batch, partitions,
                                           args.client_paths_drain_concurrency,
                                           args.max_seconds, failures))
    results = []
    for label, batch, partitions in configs:
        done = [r for r in runs[label] if r["elapsed_s"] is not None]
        elapsed = median([r["elapsed_s"] for r in done]) if len(done) == len(runs[label]) else None
        pilot = [r["autopilot_mean_batch"] for r in runs[label] if r["autopilot_mean_batch"]]
        results.append({"label": label, "batch": batch, "partitions": partitions,
                        "messages": n, "elapsed_s": elapsed,
                        "msgs_per_s": n / elapsed if elapsed else None,
                        "pops": median([r["pops"] for r in runs[label]]),
                        "autopilot_mean_batch": median(pilot),
                        "broker": broker_summary([_as_phase(r) for r in runs[label]]),
                        "runs": runs[label]})
    tuned = [r for r in results[1:] if r["elapsed_s"] is not None]
    best = min(tuned, key=lambda r: r["elapsed_s"], default=None)
    auto = results[0]["elapsed_s"]
    return {"concurrency": args.client_paths_drain_concurrency, "results": results,
            "best_hand_tuned": best["label"] if best else None,
            "autopilot_vs_best": ratio(auto, best["elapsed_s"]) if best else None}


def _as_phase(run: dict) -> Phase:
    """A drain's figures as a Phase, for broker_summary's medians."""
    phase = Phase(run["label"], run["messages"])
    phase.broker = run["broker"]
    return phase


# ----------------------------------------------------------------------------------------------
# the benchmark
# ----------------------------------------------------------------------------------------------

async def run(args: argparse.Namespace, failures: list[str]) -> dict:
    with Env() as env:
        ceiling = await warm_up(env, args)
        push = await measure_push(env, args, failures)
        pop = await measure_pop(env, args, failures)
        drains = await measure_drains(env, args, failures)
    print()
    print(table([f"client_paths, batch {BATCH}", "msg/s", "÷ JSON", "broker CPU ms/1k msgs",
                 "CPU ÷ JSON", "load generator CPU ms/1k", "body bytes/msg",
                 "request p50 / p99 ms"],
                [[f"push {r['label']}", *_cells(r), f"{r['body_bytes_per_msg']:.0f}",
                  f"{fmt_ms(r['request_ms']['p50'])} / {fmt_ms(r['request_ms']['p99'])}"]
                 for r in push] +
                [[f"pop+ack {r['label']}", *_cells(r), "-", "-"] for r in pop]))
    print()
    print(table([f"consume() drain of {args.client_paths_drain_n:,}", "workers",
                 "time to drain s", "msg/s", "pops", "autopilot mean batch",
                 "broker CPU ms/1k msgs"],
                [[r["label"], drains["concurrency"], _seconds(r["elapsed_s"]),
                  fmt_rate(r["msgs_per_s"]), fmt_rate(r["pops"]),
                  fmt_ms(r["autopilot_mean_batch"]),
                  fmt_ms(r["broker"]["broker_cpu_ms_per_1000"])] for r in drains["results"]]))
    print(f"  autopilot time / best hand-tuned ({drains['best_hand_tuned']}): "
          f"{fmt_ratio(drains['autopilot_vs_best'])} (target <= 1.2)")
    print(f"  load generator: {loadgen.CLIENT} client (push, pop); ceiling at C={args.concurrency} "
          f"(GET /health): {fmt_rate(ceiling[loadgen.CLIENT])} req/s (httpx: "
          f"{fmt_rate(ceiling['httpx'])} req/s); consume() runs the official client (httpx)")
    return {"client": loadgen.CLIENT, "client_ceiling_req_per_s": ceiling, "batch": BATCH,
            "push": push, "pop": pop, "drain": drains}


def not_served(r: dict) -> str | None:
    """Why a pop row has no framed figure (None: it has one)."""
    if r.get("served", True):
        return None
    answers = r.get("answers")
    if r.get("probe") not in (None, "framed", NOT_SERVED):
        return f"probe failed: {r['probe']}"
    if answers and answers["framed"]:
        return f"mixed: {answers['json']} of {answers['json'] + answers['framed']} answers JSON"
    return NOT_SERVED


def _cells(r: dict) -> list[str]:
    """msg/s, ÷ JSON, broker CPU, CPU ÷ JSON, load generator CPU of a push or pop row."""
    if not_served(r):
        return [not_served(r), "-", "-", "-", "-"]
    return [fmt_rate(r["msgs_per_s"]), fmt_ratio(r["ratio_to_json"]),
            fmt_ms(r["broker"]["broker_cpu_ms_per_1000"]), fmt_ratio(r["cpu_ratio_to_json"]),
            fmt_ms(r["client_cpu_ms_per_1000"])]


def summary_rows(res: dict) -> list[list[str]]:
    rows = []
    for what, entries in (("push", res["push"]), ("pop+ack", res["pop"])):
        base = entries[0]
        for r in entries:
            if r["variant"] == "json":
                rows.append([f"{NAME}: {what} {BATCH}, {r['label']}", _rate_cpu(r), "(baseline)",
                             ""])
            elif not_served(r):
                rows.append([f"{NAME}: {what} {BATCH}, {r['label']}", not_served(r),
                             f"JSON: {_rate_cpu(base)}", "-"])
            else:
                rows.append([f"{NAME}: {what} {BATCH}, {r['label']}", _rate_cpu(r),
                             f"JSON: {_rate_cpu(base)}", f"{fmt_ratio(r['ratio_to_json'])} x JSON"])
    d = res["drain"]
    for r in d["results"]:
        rows.append([f"{NAME}: consume() drain, {r['label']}",
                     f"{_seconds(r['elapsed_s'])} s ({fmt_rate(r['msgs_per_s'])} msg/s)",
                     f"{r['messages']:,} msgs, {d['concurrency']} workers", ""])
    rows.append([f"{NAME}: consume() autopilot / best hand-tuned", fmt_ratio(d["autopilot_vs_best"]),
                 f"best: {d['best_hand_tuned']}", ""])
    return rows


def _seconds(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def _rate_cpu(r: dict) -> str:
    return (f"{fmt_rate(r['msgs_per_s'])} msg/s, "
            f"{fmt_ms(r['broker']['broker_cpu_ms_per_1000'])} ms CPU/1k")
