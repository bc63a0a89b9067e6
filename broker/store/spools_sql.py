"""Statements of the cluster's spool holds (queen.spool_backlog, queen.spool_servers): what
operators see of them, the release of one spool's holds, and the retention job's removal of
spools silent for FILE_BUFFER_ORDER_FORGET_MS. ``(staged)`` is not a spool: it names the
partitions with staged pushes, never goes silent, and is never listed, released or removed.

A spool is *silent* when its last heartbeat (``spool_servers.seen_at``) is older than
FILE_BUFFER_ORDER_WAIT_MS, or it has none: the data path's ``queen.spool_server_dead`` asks the
same of the peer (it also asks that the judging broker has beaten that long)."""
from __future__ import annotations

STAGED = "(staged)"
"""The holder name of staged rows (migration 0010)."""

SPOOL_HOLDS = """
WITH held AS (
    SELECT b.server_id, count(*) AS partitions, min(b.oldest_accept_us) AS oldest_accept_us
    FROM queen.spool_backlog b WHERE b.server_id <> '(staged)'
    GROUP BY b.server_id)
SELECT h.server_id, h.partitions, h.oldest_accept_us, s.seen_at,
       coalesce(s.seen_at < now() - make_interval(secs => $1 / 1000.0), true) AS silent,
       extract(epoch FROM now() - s.seen_at)::float8 AS silent_seconds,
       (SELECT count(*) FROM (
            SELECT DISTINCT b.queue_name, b.partition_name
            FROM queen.spool_backlog b LEFT JOIN queen.spool_servers s2 USING (server_id)
            WHERE b.server_id <> '(staged)'
              AND coalesce(s2.seen_at < now() - make_interval(secs => $1 / 1000.0), true)) d
       ) AS silent_pairs
FROM held h LEFT JOIN queen.spool_servers s USING (server_id)
ORDER BY h.server_id
"""
"""Every spool holding partitions ($1: FILE_BUFFER_ORDER_WAIT_MS): its partitions, the accept
time of its oldest registered push, its last heartbeat (NULL: none), whether it is silent and
for how many seconds (PostgreSQL's clock), and on every row the count of distinct (queue,
partition) pairs held by silent spools."""

SPOOL_HEARTBEAT_FOR_RELEASE = """
SELECT s.seen_at, s.seen_at >= now() - make_interval(secs => $2 / 1000.0) AS fresh
FROM queen.spool_servers s WHERE s.server_id = $1
FOR UPDATE
"""
"""The spool's heartbeat row, locked until the release commits (a beat of that spool waits,
then starts a new row: a spool alive after all registers again). $2: FILE_BUFFER_ORDER_WAIT_MS;
fresh: it beat within it."""

SPOOL_HELD_COUNT = "SELECT count(*) FROM queen.spool_backlog WHERE server_id = $1"
"""The partitions one spool holds."""

SPOOL_RELEASE_BACKLOG = "DELETE FROM queen.spool_backlog WHERE server_id = $1"
"""The spool's holds."""

SPOOL_RELEASE_SERVER = "DELETE FROM queen.spool_servers WHERE server_id = $1"
"""The spool's heartbeat row."""

SPOOLS_FORGET = """
WITH gone AS (
    SELECT h.server_id
    FROM (SELECT DISTINCT b.server_id FROM queen.spool_backlog b
          WHERE b.server_id <> '(staged)') h
    LEFT JOIN queen.spool_servers s USING (server_id)
    WHERE coalesce(s.seen_at < now() - make_interval(secs => $1 / 1000.0), true)),
backlog AS (
    DELETE FROM queen.spool_backlog b USING gone g WHERE b.server_id = g.server_id
    RETURNING b.server_id),
servers AS (
    DELETE FROM queen.spool_servers s USING gone g WHERE s.server_id = g.server_id
    RETURNING s.server_id)
SELECT g.server_id, (SELECT count(*) FROM backlog x WHERE x.server_id = g.server_id) AS partitions
FROM gone g ORDER BY g.server_id
"""
"""Remove the rows of every spool holding partitions whose last heartbeat is older than $1 ms
(FILE_BUFFER_ORDER_FORGET_MS); one row per spool removed, with the holds it had. Heartbeat
rows of spools that hold nothing stay: a broker judges silent peers only once its own
heartbeat row is old enough (queen.spool_server_dead)."""
