-- Claims read one index, pgqueue_jobs_claim_queue; the index across all
-- queues, pgqueue_jobs_claim, goes, and delayed jobs get an index of their
-- own, pgqueue_jobs_due, for the question "when is the next one due?".
--
-- A claim asks each queue in turn for its runnable jobs (job_claim). When
-- the statistics said few queued jobs were runnable (taken while the
-- workers kept up, or before a burst), the planner costed both claim
-- indexes alike and could walk pgqueue_jobs_claim, filtering on the queue:
-- a queue with only delayed jobs then read every runnable job of the
-- others, on every claim (20,000 runnable jobs of one queue beside four
-- queues of delayed ones: 2,300 buffers a claim instead of 54). Its one
-- other user was queue_next_wake, which walked its priority levels.
--
-- pgqueue_jobs_due holds the queued jobs that were not runnable when
-- written: delayed, retried after a backoff, snoozed (a job enqueued to run
-- at once has run_at = enqueued_at, the same now()). Its first entry after
-- now() is the next due job of every queue: one probe, whatever the
-- backlog. A claim cannot use it: its predicate is not the claim's.
--
-- DROP INDEX takes the table's lock for a moment; CREATE INDEX holds off
-- writes while it reads the whole table once (finished jobs too: a table
-- that keeps a long history takes longer), and claims and enqueues wait
-- behind it. Migrations run in a transaction, where CONCURRENTLY cannot.
DROP INDEX IF EXISTS pgqueue_jobs_claim;
CREATE INDEX pgqueue_jobs_due ON pgqueue_jobs (run_at)
    WHERE state = 'queued' AND run_at > enqueued_at;
