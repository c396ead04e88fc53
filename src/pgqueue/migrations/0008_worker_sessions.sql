-- Fast death detection: each worker records in its registry row the
-- PostgreSQL session of its heartbeat connection (written by worker_register
-- and worker_seen). A SIGKILLed worker's session ends at once, so the
-- reapers (worker_reap_dead) see it gone from pg_stat_activity within a
-- death-check interval and take its jobs back without waiting for their
-- leases. A stalled worker (SIGSTOP, a partition) keeps its session and is
-- left to its leases, as before.
--
-- All NULL: nothing to check (the worker runs behind a transaction-mode
-- pooler, where the session is not its own, or it was already found dead).
-- server_start is pg_postmaster_start_time() when the session was recorded:
-- after a restart or a failover every recorded session is gone, and a
-- session of another server is not checked (its worker records its new
-- session at its next heartbeat), so a restart is never taken for the death
-- of every worker.
--
-- Nullable columns with no default: adding them rewrites nothing.
ALTER TABLE pgqueue_workers
    ADD COLUMN session_pid   integer,
    ADD COLUMN session_start timestamptz,
    ADD COLUMN server_start  timestamptz;

-- The session the calling statement runs on, as worker_register and
-- worker_seen record it: always one row, all NULL unless `wanted`.
CREATE FUNCTION pgqueue_own_session(wanted boolean, OUT pid integer,
                                    OUT backend_start timestamptz, OUT server_start timestamptz)
LANGUAGE sql STABLE AS $$
    SELECT a.pid, a.backend_start, CASE WHEN wanted THEN pg_postmaster_start_time() END
    FROM (SELECT) one
    LEFT JOIN pg_stat_get_activity(pg_backend_pid()) a ON wanted
$$;
