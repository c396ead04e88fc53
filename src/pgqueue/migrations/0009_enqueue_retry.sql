-- Producers retry across a lost connection without duplicating a job: each
-- call carries a key that lets a second attempt find what a first attempt
-- committed (the reply to its COMMIT may be what was lost).
--
--   enqueue_many  its rows' own ids: they are reserved from the sequence
--                 before the first attempt and kept by every retry, so the
--                 primary key is the call's key and costs nothing more.
--   enqueue       one job, one statement: its id is not known before the
--                 reply, so the call stores a key of its own, `enqueue_key`
--                 (a time-ordered uuid made by the producer; NULL for a job
--                 enqueued in a caller's transaction, by a schedule or by
--                 enqueue_many, which are never in the index below).
--
-- A retry inserts again with ON CONFLICT DO NOTHING: an earlier attempt
-- that committed makes the insert a no-op, and one still in flight makes it
-- wait for that attempt's outcome (the unique check waits for it).
--
-- A column without a default: adding it rewrites nothing. The index is
-- built empty (no row has a key yet).
ALTER TABLE pgqueue_jobs ADD COLUMN enqueue_key uuid;
CREATE UNIQUE INDEX pgqueue_jobs_enqueue_key ON pgqueue_jobs (enqueue_key)
    WHERE enqueue_key IS NOT NULL;
