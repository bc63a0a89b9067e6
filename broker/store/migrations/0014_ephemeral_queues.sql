-- Migration 0014: the declared configuration of ephemeral queues.
--
-- An ephemeral queue's messages live in one broker's RAM and survive nothing;
-- what a caller declared with POST /api/v1/ephemeral/configure survives
-- everything, here: one row per declared queue, read by every broker at start
-- and written by configure (docs/ephemeral.md §2). Nothing on the push, pop
-- or ack path reads or writes this table.
--
--   * options: only the knobs the caller gave, by their wire names (maxBytes,
--     maxLength, policy, ttlSeconds, leaseSeconds, retryLimit, windowBuffer);
--     a later configure merges its knobs over them (a knob sent as null goes
--     back to the broker's default, so it is removed). The broker's defaults
--     fill the knobs nobody set, so a changed default reaches those queues.
--   * A queue created implicitly by a push or a pop has no row: it is RAM
--     only, with the defaults, and a restart forgets it along with its
--     messages (the next push or pop creates it again, the same as before).
--   * DELETE /api/v1/ephemeral/queue/{queue} deletes the row.

CREATE TABLE queen.ephemeral_queues (
    name       text PRIMARY KEY CHECK (char_length(name) BETWEEN 1 AND 255),
    options    jsonb NOT NULL DEFAULT '{}'::jsonb CHECK (jsonb_typeof(options) = 'object'),
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);
