-- Migration 0016: deadLetterQueue and dlqAfterMaxRetries say what the broker does.
--
-- Dead-lettering past retryLimit has always been on whatever these two options
-- hold (no statement reads queen.queues.dead_letter_queue or
-- dlq_after_max_retries), yet a new queue stored false and showed it, so the
-- queue detail and the options table told a reader that failed messages were
-- not dead-lettered. Their default becomes true, and the queues stored false
-- become true: nothing ever acted on the value, so no behaviour changes. A
-- broker of the previous release still runs against this schema: it reads
-- neither column, and its configure writing false changes nothing either.
ALTER TABLE queen.queues ALTER COLUMN dead_letter_queue SET DEFAULT true;
ALTER TABLE queen.queues ALTER COLUMN dlq_after_max_retries SET DEFAULT true;
UPDATE queen.queues SET dead_letter_queue = true, dlq_after_max_retries = true
WHERE NOT dead_letter_queue OR NOT dlq_after_max_retries;
