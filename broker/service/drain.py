"""The spool's drain through PostgreSQL (docs/spool-drain.md): upload a spool
file into queen.staged, and merge staged rows into the queues in the cluster's
accept order, waking the pops of what was merged."""
from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import ujson

from actors.spool import RejectedEvents, accepted_at, spool_file_key
from broker.service.context import BrokerContext
from broker.service.push import spooled_message_id, wake_after_commit
from broker.store.errors import StoreBusy, StoreUnavailable


def _record(spool_id: str, file_ms: int, file_seq: int, index: int, event: Mapping[str, Any],
            payload: Any, encrypted: bool) -> tuple:
    trace = event.get("traceId")
    return (accepted_at(event), spool_id, file_ms, file_seq, index, event["queue"],
            event.get("partition") or "Default", uuid.UUID(spooled_message_id(event)),
            event["transactionId"], uuid.UUID(trace) if trace else None,
            ujson.dumps(payload, escape_forward_slashes=False), encrypted, event.get("producerSub"))


async def upload_spooled(ctx: BrokerContext, name: str, events: Sequence[Mapping[str, Any]],
                         indexes: Sequence[int], oldest: Mapping[tuple[str, str], int]) -> bool:
    """Stage the events at ``indexes`` of spool file ``name`` in one
    transaction and replace this spool's backlog rows by ``oldest``. Payloads
    of encrypted queues not sealed at spool time are sealed here. False when
    the file was uploaded before. Raises RejectedEvents (events that can
    never be staged), or the store's error."""
    file_ms, file_seq = spool_file_key(name)
    cipher = ctx.cipher
    plain = {events[k]["queue"] for k in indexes if not events[k].get("encrypted")}
    flags = await ctx.queue_cache.encryption_flags(plain) if cipher and plain else {}
    records, rejected = [], {}
    for k in indexes:
        event = events[k]
        payload, encrypted = event.get("payload"), bool(event.get("encrypted"))
        try:
            if not encrypted and cipher is not None and flags.get(event["queue"], False):
                payload, encrypted = cipher.encrypt(payload), True
            records.append(_record(ctx.store.server_id, file_ms, file_seq, k, event, payload,
                                   encrypted))
        except (ValueError, TypeError, OverflowError) as exc:
            rejected[k] = f"cannot be staged: {exc}"
    if rejected:
        raise RejectedEvents(rejected)
    try:
        return await ctx.store.upload_spooled(ctx.store.server_id, file_ms, file_seq, records,
                                              oldest)
    except (StoreUnavailable, StoreBusy):
        raise
    except Exception:
        bad = await ctx.store.rejected_records(records)
        if not bad:
            raise
        raise RejectedEvents({records[n][4]: reason for n, reason in bad.items()}) from None


@dataclass(frozen=True)
class MergeOutcome:
    """One merge batch: rows stored, duplicates dropped, order exceptions (in
    all and per (queue, partition))."""
    merged: int
    duplicates: int
    late: int
    late_pairs: dict[tuple[str, str], int]


async def merge_once(ctx: BrokerContext, limit: int) -> MergeOutcome:
    """Merge one batch of staged rows, then wake the pops of the partitions
    that got messages (after the commit, locally and through the mesh)."""
    rows = await ctx.store.merge_staged(limit)
    wake_after_commit(ctx, {(r["queue_name"], r["partition_name"]) for r in rows
                            if r["merged"] > 0})
    late = {(r["queue_name"], r["partition_name"]): int(r["late"]) for r in rows if r["late"]}
    return MergeOutcome(merged=sum(int(r["merged"]) for r in rows),
                        duplicates=sum(int(r["duplicates"]) for r in rows),
                        late=sum(late.values()), late_pairs=late)


async def staged_count(ctx: BrokerContext) -> tuple[int, int]:
    """Staged events not merged yet, and the partitions they are for."""
    row = await ctx.store.staging_summary()
    return int(row["events"]), int(row["partitions"])


async def spool_stats(ctx: BrokerContext) -> dict[str, Any]:
    """This broker's spool figures, with the staging merge's under ``staging``.
    Order exceptions are found by the merge, so they are counted by the
    broker whose merge found them (any broker may merge)."""
    stats = await ctx.spool.stats()
    merge = await ctx.merger.stats()
    stats["orderExceptions"] = merge["orderExceptions"]
    stats["orderExceptionPartitions"] = merge["orderExceptionPartitions"]
    stats["staging"] = merge
    return stats
