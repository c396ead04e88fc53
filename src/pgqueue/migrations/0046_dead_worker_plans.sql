-- The release of a dead worker's jobs (worker_reap_dead) planned without
-- sequential scans (docs/concepts.md, "Plans that ignore statistics"):
-- after an ANALYZE that saw the jobs running, the planner read the whole
-- table for the running jobs of the dead workers (a scan costs less than
-- the index of running jobs when it believes every job runs), where
-- pgqueue_jobs_reap holds only those.
CREATE FUNCTION pgqueue_reap_dead_workers(me text)
RETURNS TABLE (name text, jobs bigint)
LANGUAGE sql VOLATILE
SET enable_seqscan = off AS $$
    WITH sessions AS (
        SELECT pg_stat_get_backend_pid(b) AS pid, pg_stat_get_backend_start(b) AS backend_start
        FROM pg_stat_get_backend_idset() b
    ), dead AS (
        UPDATE pgqueue_workers w
        SET expires_at = least(w.expires_at, now()),
            session_pid = NULL, session_start = NULL, server_start = NULL
        WHERE w.session_pid IS NOT NULL AND w.name <> me
          AND w.server_start = pg_postmaster_start_time()
          AND NOT EXISTS (
              SELECT 1 FROM sessions a
              WHERE a.pid = w.session_pid
                AND (a.backend_start IS NULL OR a.backend_start = w.session_start))
        RETURNING w.name
    ), released AS (
        UPDATE pgqueue_jobs j
        SET lease_expires_at = 'epoch'
        FROM dead
        WHERE j.state = 'running' AND j.worker = dead.name
        RETURNING j.worker
    )
    SELECT d.name, (SELECT count(*) FROM released r WHERE r.worker = d.name) AS jobs
    FROM dead d
$$;
