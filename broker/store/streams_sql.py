"""SQL of the /streams/v1 routes: named, documented statements, like broker/store/sql.py.
The work is in server-side functions (migrations/NNNN_streams.sql and
NNNN_streams_cycle.sql), one round trip each: a cycle is the one statement CYCLE, its own
transaction."""
from __future__ import annotations

REGISTER_QUERY = "SELECT * FROM queen_streams.register_query_v1($1, $2, $3, $4, $5)"
"""Create a query, return the existing one (same name and hash), report a conflict
(another hash, no reset) or reset it (state deleted, the new hash takes over)."""

CYCLE = """
SELECT * FROM queen_streams.cycle_v1($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13,
                                     $14, $15, $16, $17, $18, $19, $20, $21, $22, $23)
"""
"""A whole cycle, its own transaction: the state ops (cycle_state_v1: query and partition
known, the shard's lock, a replayed cycle recognised, the ack widened to the lease's whole
batch), the sink pushes (push_ordered, direct mode), the source ack (ack_messages, failed
acks to the DLQ), the shard's cycle count. One row; a held sink partition raises SQLSTATE
QSH01, a refused ack QSA01, and nothing is committed."""

CYCLE_HELD = "QSH01"
"""SQLSTATE of CYCLE: a sink push went to a partition a spool holds (DETAIL: its idx)."""

CYCLE_ACK_REFUSED = "QSA01"
"""SQLSTATE of CYCLE: the source ack was refused (MESSAGE: ack_messages' error)."""

STATE_GET = "SELECT * FROM queen_streams.state_get_v1($1, $2, $3, $4, $5, $6, $7)"
"""State rows of several folded reads at once; (idx, key, value, updated_at) rows."""

DELETE_QUERY = """
WITH gone AS (DELETE FROM queen_streams.queries WHERE name = $1 RETURNING id)
SELECT id FROM gone
"""
"""Delete a query by name; its state rows go by cascade. The id, or no row."""

QUERY_LIST = """
SELECT q.id, q.name, q.source_queue, q.sink_queue, q.config_hash, q.created_at, q.updated_at,
       count(s.key)::bigint AS state_rows,
       coalesce(sum(pg_column_size(s.value)), 0)::bigint AS state_bytes,
       count(DISTINCT s.partition_id)::bigint AS partitions,
       max(s.updated_at) AS last_state_at
FROM queen_streams.queries q
LEFT JOIN queen_streams.state s ON s.query_id = q.id
GROUP BY q.id
ORDER BY q.name
"""
"""Every query with the size of its state (rows, stored bytes of the values, partitions
holding state): the operator's view."""
