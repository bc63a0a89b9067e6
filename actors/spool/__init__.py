"""The node-local disk spool (docs/behaviour.md §5, §14 invariants 39-45).

Pushes are appended here, instead of going to PostgreSQL, while push
maintenance is on or the database cannot be reached (the push service,
broker/service/push.py, decides); a drain task uploads them into PostgreSQL's
staging table once the database takes writes again, a whole file per
transaction, and :mod:`actors.staging_merger` moves them on into the queues in
the cluster's accept order (docs/spool-drain.md).

Files live in one node-local directory::

    queen-<13-digit epoch ms>-<8-digit sequence>.tmp   the active file (appended to)
    queen-<13-digit epoch ms>-<8-digit sequence>.buf   finalized, waiting to be drained
    quarantine/<id>.json                               one event PostgreSQL refused (or never could store)
    failed/<name>.buf                                  a whole file that could not be read
    spool-id                                           this spool's name in PostgreSQL
    lock                                               held by the broker using the directory

The parts, each one job, lowest first:

    records.py     the record format and names: encode/read/tally, file keys, accept times
    backlog.py     SpoolBacklog: events per partition not uploaded yet (sticky failover)
    files.py       SpoolFile (one file: state, counts, partitions, accept range, progress)
                   and SpoolFiles (every known file, the totals, the backlog's counts)
    writer.py      the active file: append (accept times, cap, rollback), rotation, finalize
    health.py      DrainHealth: is PostgreSQL taking uploads; transient failures, cooldown
    order.py       Registration: this spool's rows in queen.spool_backlog (cluster order)
    quarantine.py  entries PostgreSQL refused: on disk, and the operator's messages
    upload.py      Uploader: one finished file into staging (set aside, retry, delete);
                   RejectedEvents, what the upload raises for events PostgreSQL refuses;
                   the "drained" line
    actor.py       Spool: the actor composing them, the drain loop, and the figures
                   /health and /metrics report
    lock.py        one directory, one broker (an flock taken by broker/__main__.py)

A file is only deleted after its upload committed (PostgreSQL records the file
in the same transaction, so an upload repeated after a crash is skipped) with
each of its events either uploaded or set aside in the quarantine. The spool
holds at most ``max_bytes`` of files: an append beyond it raises
:class:`SpoolFull`. Blocking file work (fsync, renames, directory listings, the
quarantine) runs in a thread, never on the event loop; single short appends
stay on it.
"""
from __future__ import annotations

from actors.spool.actor import Spool
from actors.spool.backlog import SpoolBacklog
from actors.spool.files import FileState, SpoolFile
from actors.spool.records import (
    SpoolError,
    SpoolFull,
    accepted_at,
    encode_records,
    event_pair,
    file_accept_us,
    read_records,
    spool_file_key,
    tally_records,
)
from actors.spool.upload import RejectedEvents

__all__ = ["FileState", "RejectedEvents", "Spool", "SpoolBacklog", "SpoolError", "SpoolFile",
           "SpoolFull",
           "accepted_at", "encode_records", "event_pair", "file_accept_us", "read_records",
           "spool_file_key", "tally_records"]
