-- Migration 0002: drop queen.push_messages.
--
-- It was the push function of brokers that predate the cross-broker spool
-- order (queen.push_ordered). No broker that can still be running during a
-- supported rolling upgrade (from the previous release, whose brokers call
-- push_ordered) calls it; keeping it would only leave a second, drifting copy
-- of the push rules in the database.
DROP FUNCTION IF EXISTS queen.push_messages(integer[], text[], text[], uuid[], text[], uuid[], text[], boolean[], text[]);
