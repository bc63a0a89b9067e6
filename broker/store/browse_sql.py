"""SQL of the paged browsing routes (broker/http/routes/ops/browse.py): named, documented
statements, like broker/store/ops_sql.py.

Every statement here answers one page and says how many rows match (``full_count``), so a
reader with 1,000 queues and 10,000 partitions never gets the whole table. Searches are
case-insensitive substrings (``strpos`` on ``lower``: no pattern characters to escape).

Where figures come from: the queue list takes its message figures from queen.stats
('queue' rows, refreshed by the stats job every STATS_INTERVAL_MS), the same source as
/api/v1/resources/overview's totals once the job has run, because computing exact figures for
every queue of a page could mean counting 10,000 partitions; a partition page counts its own
partitions exactly (broker/store/figures_sql.py), since a page holds at most 500.
"""
from __future__ import annotations

from broker.store.figures_sql import partition_figures
from broker.store.ops_sql import CURSOR_ROWS

_SEARCH = "($1::text IS NULL OR strpos(lower({col}), lower($1)) > 0)"


def _search(*cols: str) -> str:
    return "(" + " OR ".join(_SEARCH.format(col=c) for c in cols) + ")"


QUEUES_PAGE = f"""
WITH page AS (
    SELECT q.id, q.name, q.namespace, q.task, q.priority, q.created_at,
           count(*) OVER () AS full_count
    FROM queen.queues q
    WHERE {_search('q.name', 'q.namespace', 'q.task')}
    ORDER BY q.name
    LIMIT $2 OFFSET $3
)
SELECT page.*,
       (SELECT count(*) FROM queen.partitions p WHERE p.queue_id = page.id) AS partitions,
       (SELECT count(DISTINCT l.consumer_group) FROM queen.log_consumers l
        JOIN queen.partitions p ON p.id = l.partition_id WHERE p.queue_id = page.id) AS groups,
       coalesce(s.total_messages, 0) AS total, coalesce(s.pending_messages, 0) AS pending,
       coalesce(s.processing_messages, 0) AS processing,
       coalesce(s.completed_messages, 0) AS completed,
       coalesce(s.dead_letter_messages, 0) AS dead_letter
FROM page
LEFT JOIN queen.stats s ON s.stat_type = 'queue' AND s.stat_key = page.name
ORDER BY page.name
"""
"""Queues whose name, namespace or task contains $1 (NULL = all), by name, page $2/$3:
catalog counts (partitions, consumer groups with a cursor) exact, message figures from
queen.stats (0 until the stats job has counted the queue)."""

QUEUES_MATCHING = f"SELECT count(*) FROM queen.queues q WHERE {_search('q.name', 'q.namespace', 'q.task')}"
"""How many queues match $1 (for a page past the end, which has no row to carry full_count)."""

PARTITIONS_PAGE = f"""
WITH page AS (
    SELECT p.id, p.name, p.created_at, p.last_seq, p.last_message_at,
           count(*) OVER () AS full_count
    FROM queen.partitions p JOIN queen.queues q ON q.id = p.queue_id
    WHERE q.name = $4 AND {_search('p.name')}
    ORDER BY p.name
    LIMIT $2 OFFSET $3
)
SELECT page.*, f.total, f.pending, f.processing, f.completed, f.dead_letter,
       (SELECT max(l.lease_expires_at) FROM queen.log_consumers l
        WHERE l.partition_id = page.id AND l.lease_expires_at > now()) AS lease_until
FROM page CROSS JOIN LATERAL {partition_figures('page.id')} f
ORDER BY page.name
"""
"""Partitions of queue $4 whose name contains $1, by name, page $2/$3, with exact
figures, the end of the latest live lease on each and its newest message's time."""

PARTITIONS_MATCHING = f"""
SELECT count(*) FROM queen.partitions p JOIN queen.queues q ON q.id = p.queue_id
WHERE q.name = $2 AND {_search('p.name')}
"""
"""How many partitions of queue $2 match $1."""

GROUPS_PAGE = f"""
WITH pairs AS (
    SELECT l.consumer_group, q.name AS queue_name, q.namespace, q.task,
           count(*) AS partitions,
           count(*) FILTER (WHERE p.last_seq > l.cursor_seq) AS partitions_behind,
           coalesce(sum(greatest(p.last_seq - l.cursor_seq, 0)), 0)::bigint AS positions_behind,
           count(*) FILTER (WHERE l.lease_expires_at > now()) AS active_leases,
           max(l.last_consumed_at) AS last_consumed_at
    FROM queen.log_consumers l
    JOIN queen.partitions p ON p.id = l.partition_id
    JOIN queen.queues q ON q.id = p.queue_id
    WHERE {_search('l.consumer_group', 'q.name')}
    GROUP BY l.consumer_group, q.name, q.namespace, q.task
)
SELECT *, count(*) OVER () AS full_count FROM pairs
ORDER BY positions_behind DESC, consumer_group, queue_name
LIMIT $2 OFFSET $3
"""
"""(group, queue) pairs whose group or queue name contains $1, the ones furthest
behind first, page $2/$3. ``positions_behind`` is Σ (last_seq − cursor): exact unless
messages inside that range were deleted (retention), an upper bound then."""

GROUP_LAG_PAGE = f"""
SELECT c.*, CASE WHEN c.lease_active THEN c.lease_expires_at END AS lease_until,
       count(*) OVER () AS full_count
FROM ({CURSOR_ROWS}) c
ORDER BY c.time_lag_seconds DESC, c.offset_lag DESC, c.partition_name
LIMIT $4 OFFSET $5
"""
"""Group $1's cursors on queue $2 ($3 NULL: every one; the rows of ops_sql.CURSOR_ROWS),
the partitions falling behind first (oldest unconsumed message, then positions after the
cursor), page $4/$5."""

DEPTHS = """
SELECT stat_key AS queue, pending_messages AS pending
FROM queen.stats WHERE stat_type = 'queue'
"""
"""Every queue's pending figure as the stats job last counted it (the depth history)."""

PARTITION_MESSAGES = """
WITH part AS (
    SELECT p.id FROM queen.partitions p JOIN queen.queues q ON q.id = p.queue_id
    WHERE q.name = $1 AND p.name = $2
), start AS (
    -- the first position to show: at or after $3, and at or after the first message
    -- created at or after $4 (the (partition_id, created_at) index finds it)
    SELECT greatest($3::bigint, coalesce((
        SELECT m.seq FROM queen.messages m, part
        WHERE $4::timestamptz IS NOT NULL AND m.partition_id = part.id AND m.created_at >= $4
        ORDER BY m.created_at, m.seq LIMIT 1), CASE WHEN $4::timestamptz IS NULL THEN 0
                                                  ELSE 9223372036854775807 END)) AS seq
)
SELECT m.id, m.partition_id, m.seq, m.transaction_id, m.trace_id, m.created_at,
       m.is_encrypted,
       EXISTS (SELECT 1 FROM queen.dead_letter_queue d WHERE d.message_id = m.id) AS dead_lettered
FROM part, start, queen.messages m
WHERE m.partition_id = part.id AND m.seq >= start.seq
ORDER BY m.seq
LIMIT $5
"""
"""Messages of partition $2 of queue $1 in position order, from position $3 or from the
first message created at or after $4 (whichever is later; NULL time = from $3), at most
$5: one step of the (partition_id, seq) index per message."""
