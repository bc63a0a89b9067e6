"""Queen's wire format (docs/wire-contract.md), one module per request kind: the request's
parsing (400s, coded for the state surfaces) and the answer's shape, from what the service
returned. Parsing never touches the database.

    common.py       what every route's parsing shares: bodies, query strings, names
    push.py         push items, the answer per item
    push_binary.py  the client's binary push and transaction bodies (QPB1, QTB1)
    zstd.py         a caller's zstd frames, unpacked within a byte budget
    pop.py          the pop query string, the messages found or the empty answers
    pop_frames.py   the framed pop answer (QPF1) for a pop with frames=true
    ack.py          ack items, the answer per ack, lease extension
    transaction.py  the transaction's body and answer (committed or rolled back)
    riders.py       a transaction's kv and timers arrays, and their elements of the answer
    queues.py       configure, queue options, listings and detail, per-partition figures
    dlq.py          dead-letter pages, the retry's answer
    health.py       /health and the shared-state view
    reads.py        offset reads and partition discovery, their answers
    kv.py, locks.py, timers.py   the state surfaces' operations, the answers around their
                    results (kv: the path-style routes' headers, ETag and status too)
    listings.py     the operator listings of keys and locks, their pages
    streams.py      the /streams/v1 bodies and answers; the operator's view of the queries
    spools.py       the cluster's spool holds (/api/v1/system/spools, /health spoolHolds)
    ephemeral.py    the ephemeral queues' eight verbs: bodies, query strings, answers
"""
