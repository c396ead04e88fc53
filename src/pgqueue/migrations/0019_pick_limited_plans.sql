-- pgqueue_pick_limited (0005), which chooses a limited queue's jobs for
-- job_claim, plans its reads without sequential scans, so that it reads the
-- queue's running jobs through pgqueue_jobs_reap and its queued ones through
-- the claim indexes whatever the statistics say (docs/concepts.md, "Plans
-- that ignore statistics"). After an ANALYZE that saw mostly running jobs,
-- counting a queue's running jobs read the whole table on every claim.
ALTER FUNCTION pgqueue_pick_limited(text, integer) SET enable_seqscan = off;
