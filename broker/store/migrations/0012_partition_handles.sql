-- Migration 0012: every partition gets a u64 handle (framed pops).
--
-- The framed pop answer (docs/wire-contract.md §5.9) names each claimed
-- partition by an unsigned 64-bit integer, and the client acknowledges its
-- messages with that number, as a decimal string, in place of the partition's
-- UUID. So:
--
--   * queen.partitions.handle: a bigint from the sequence
--     queen.partition_handle_seq, unique, never reused (a partition deleted
--     and created again gets a new id and a new handle). Existing partitions
--     get theirs here; partitions created by any broker later (those of the
--     previous release included, which do not name the column) get one from
--     the column's default.
--   * queen.partition_ref(text) -> uuid: a partition reference as a client
--     sends it, a UUID or a decimal handle, as the partition's id. A handle
--     no partition has (or one past the bigint range) resolves to the nil
--     UUID, which no partition has either, so whatever looks the partition up
--     finds nothing, exactly as with an unknown UUID. Text that is neither is
--     left to the uuid cast to refuse (the broker checks the form before).
--   * queen.partition_refs(text[]) -> uuid[]: the same per element, in order.
--
-- Brokers of the previous release neither read the column nor call the
-- functions; adding a column with a volatile default rewrites
-- queen.partitions under an exclusive lock, which is held for as long as the
-- table (one row per partition) takes to copy.

CREATE SEQUENCE IF NOT EXISTS queen.partition_handle_seq AS bigint;
ALTER TABLE queen.partitions
    ADD COLUMN handle bigint NOT NULL DEFAULT nextval('queen.partition_handle_seq');
ALTER SEQUENCE queen.partition_handle_seq OWNED BY queen.partitions.handle;
CREATE UNIQUE INDEX partitions_handle_idx ON queen.partitions (handle);

CREATE FUNCTION queen.partition_ref(p_ref text) RETURNS uuid
LANGUAGE sql STABLE AS $$
    SELECT CASE
        WHEN p_ref !~ '^[0-9]{1,20}$' THEN p_ref::uuid
        WHEN p_ref::numeric > 9223372036854775807 THEN '00000000-0000-0000-0000-000000000000'::uuid
        ELSE coalesce((SELECT id FROM queen.partitions WHERE handle = p_ref::bigint),
                      '00000000-0000-0000-0000-000000000000'::uuid)
    END
$$;

CREATE FUNCTION queen.partition_refs(p_refs text[]) RETURNS uuid[]
LANGUAGE sql STABLE AS $$
    SELECT coalesce(array_agg(queen.partition_ref(r) ORDER BY n), '{}'::uuid[])
    FROM unnest(p_refs) WITH ORDINALITY AS u(r, n)
$$;
