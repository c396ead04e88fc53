-- The jobs whose lease has ended, read through pgqueue_jobs_reap whatever
-- the statistics say (job_reap calls it).
--
-- Read by a plain query, the planner chose between pgqueue_jobs_reap (the
-- running jobs, at most the workers' slots) and a scan of the whole table
-- by what the statistics said of the running jobs: analyzed while many jobs
-- ran, they said most rows run, and every reap (every few seconds, on every
-- worker) read the whole table: 20,700 rows beside 100 running jobs. A
-- function can say how its query is planned: without sequential scans, the
-- partial index is the way left. (An index on the lease's end would give
-- the order too, but every heartbeat would then write every index of the
-- table instead of none.)
CREATE FUNCTION pgqueue_expired_leases(wanted integer)
RETURNS TABLE (id bigint, error text)
LANGUAGE sql VOLATILE ROWS 10
SET enable_seqscan = off AS $$
    SELECT j.id, format('lease expired (worker %s%s, attempt %s)', j.worker,
                        CASE WHEN j.lease_expires_at = 'epoch' THEN ' whose session ended' END,
                        j.attempts)
    FROM pgqueue_jobs j
    WHERE j.state = 'running' AND j.lease_expires_at < now()
    ORDER BY j.lease_expires_at
    LIMIT wanted
    -- Rows another reaper is handling are skipped, so every worker may
    -- reap at once.
    FOR UPDATE SKIP LOCKED
$$;
