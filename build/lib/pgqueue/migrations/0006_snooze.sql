-- Snoozes: a handler may ask to run again later without spending an attempt
-- (job_snooze gives the claim's attempt back). `snoozes` counts them per
-- job, so that the worker can bound them (max_snoozes); the counters count
-- them per queue, apart from failures.
--
-- Both columns have a constant default, so adding them rewrites nothing and
-- takes the table's lock only for a moment. No CHECK constraint: adding one
-- would scan the whole jobs table under that lock, and only job_snooze and
-- job_retry write the column.
ALTER TABLE pgqueue_jobs ADD COLUMN snoozes integer NOT NULL DEFAULT 0;
ALTER TABLE pgqueue_counters ADD COLUMN snoozed bigint NOT NULL DEFAULT 0;
