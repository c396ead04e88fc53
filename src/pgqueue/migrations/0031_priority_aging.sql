-- Priority aging (setting priority_aging_seconds, off by default): the
-- workers' maintenance raises by one the priority of each runnable queued
-- job of negative priority that waited priority_aging_seconds since it
-- became runnable or since its last step (job_age_priorities), up to 0, so
-- that a stream of default-priority jobs never starves a low-priority one.
-- The claim's order is left as it is (by the claim index, 0016): aging
-- changes the rows, not the claim.
--
-- aged_at: when the job's priority last rose (NULL: never). The index holds
-- the jobs aging can raise, by when they may take their next step: only
-- queued jobs of negative priority, so that jobs of priority 0 or more (the
-- common case) are never written to it, and a job leaves it when it starts
-- or reaches 0. ADD COLUMN without a default rewrites nothing; CREATE INDEX
-- holds off writes while it reads the table once.
ALTER TABLE pgqueue_jobs ADD COLUMN aged_at timestamptz;
CREATE INDEX pgqueue_jobs_aging ON pgqueue_jobs (greatest(run_at, aged_at))
    WHERE state = 'queued' AND priority < 0;
