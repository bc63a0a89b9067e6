"""SQL of the /streams/v1 routes: named, documented statements, like broker/store/sql.py.
The work is in server-side functions (migrations/NNNN_streams.sql and
NNNN_streams_cycle.sql), one round trip each: a cycle is the one statement CYCLE, its own
transaction."""
from __future__ import annotations

REGISTER_QUERY = "SELECT * FROM queen_streams.register_query_v1($1, $2, $3, $4, $5)"
"""Create a query, return the existing one (same name and hash), report a conflict
(another hash, no reset) or reset it (state deleted, the new hash takes over)."""

CYCLE = """
SELECT * FROM queen_streams.cycle_v1($1, queen.partition_ref($2::text), $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13,
                                     $14, $15, $16, $17, $18, $19, $20, $21, $22, $23)
"""
"""A whole cycle, its own transaction: the state ops (cycle_state_v1: query and partition
known, the shard's lock, a replayed cycle recognised, the ack widened to the lease's whole
batch), the sink pushes (push_ordered_v2, direct mode), the source ack (ack_messages_v2,
failed acks to the DLQ), the shard's cycle count; the partition named by its UUID or its
handle (a framed pop's: queen.partition_ref). One row; a held sink partition raises
SQLSTATE QSH01, a refused ack QSA01, and nothing is committed."""

CYCLE_HELD = "QSH01"
"""SQLSTATE of CYCLE: a sink push went to a partition a spool holds (DETAIL: its idx)."""

CYCLE_ACK_REFUSED = "QSA01"
"""SQLSTATE of CYCLE: the source ack was refused (MESSAGE: ack_messages_v2's error)."""

STATE_GET = """
SELECT * FROM queen_streams.state_get_v1($1, $2, queen.partition_refs($3::text[]), $4, $5, $6, $7)
"""
"""State rows of several folded reads at once; (idx, key, value, updated_at) rows."""

DELETE_QUERY = """
WITH gone AS (DELETE FROM queen_streams.queries WHERE name = $1 RETURNING id)
SELECT id FROM gone
"""
"""Delete a query by name; its state rows go by cascade. The id, or no row."""

STREAMS_STATUS = """
SELECT q.id, q.name, q.source_queue, q.sink_queue, q.config_hash, q.created_at, q.updated_at,
       coalesce(s.state_rows, 0)::bigint AS state_rows,
       coalesce(s.state_bytes, 0)::bigint AS state_bytes,
       coalesce(s.state_partitions, 0)::bigint AS state_partitions, s.last_state_at,
       coalesce(c.cycle_partitions, 0)::bigint AS cycle_partitions,
       coalesce(c.cycles, 0)::bigint AS cycles, c.last_cycle_at
FROM queen_streams.queries q
LEFT JOIN LATERAL (
    SELECT count(*) AS state_rows, sum(pg_column_size(st.value)) AS state_bytes,
           count(DISTINCT st.partition_id) AS state_partitions, max(st.updated_at) AS last_state_at
    FROM queen_streams.state st WHERE st.query_id = q.id) s ON true
LEFT JOIN LATERAL (
    SELECT count(*) AS cycle_partitions, sum(sh.cycles) AS cycles,
           max(sh.last_cycle_at) AS last_cycle_at
    FROM queen_streams.shards sh WHERE sh.query_id = q.id) c ON true
WHERE $1::text IS NULL OR q.name = $1
ORDER BY q.name
"""
"""The operator's view of the queries ($1: one name, NULL: all): per query its state (rows,
stored bytes of the values, partitions holding state, newest write) and its committed
cycles (count, partitions that committed one, when the newest committed)."""

STREAM_PARTITIONS = """
WITH st AS (
    SELECT s.partition_id, count(*) AS state_rows, sum(pg_column_size(s.value)) AS state_bytes,
           max(s.updated_at) AS last_state_at
    FROM queen_streams.state s WHERE s.query_id = $1 GROUP BY s.partition_id
), sh AS (
    SELECT c.partition_id, c.cycles, c.last_cycle_at
    FROM queen_streams.shards c WHERE c.query_id = $1
)
SELECT p.id AS partition_id, p.name AS partition, qu.name AS queue,
       coalesce(st.state_rows, 0)::bigint AS state_rows,
       coalesce(st.state_bytes, 0)::bigint AS state_bytes, st.last_state_at,
       coalesce(sh.cycles, 0)::bigint AS cycles, sh.last_cycle_at
FROM st FULL JOIN sh ON sh.partition_id = st.partition_id
JOIN queen.partitions p ON p.id = coalesce(st.partition_id, sh.partition_id)
JOIN queen.queues qu ON qu.id = p.queue_id
ORDER BY coalesce(st.state_bytes, 0) DESC, qu.name, p.name
LIMIT $2
"""
"""One query's source partitions that hold state or committed a cycle, largest state
first, at most $2: rows, bytes, cycles and times per partition."""
