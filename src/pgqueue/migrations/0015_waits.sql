-- Who waits for which job, so that the statements that end jobs notify
-- pgqueue_finished only for the jobs somebody waits for (wait()).
--
-- A transaction that sends a NOTIFY takes a lock shared by the whole
-- database from just before its commit until after its commit's WAL flush.
-- Every ack notified, for every job, so acks committed one after another,
-- never several in one WAL flush, and the enqueues' commits (whose NOTIFY
-- wakes the workers) queued behind them: under an open-loop producer, a
-- producer's COMMIT waited up to 137 ms behind them. Most jobs have no
-- waiter: their acks now send nothing.
--
-- wait() registers itself as it first reads the job (job_watch);
-- pgqueue_notify_ended takes the registrations of the jobs it is told of
-- and notifies their ids. A registration outlives a waiter that gave up or
-- died until `until` (its timeout), then maintenance deletes it
-- (wait_prune). Unlogged: a registration lives no longer than its wait,
-- writing one flushes no WAL, and after a crash, when the table comes back
-- empty, waiters re-read their jobs every second as they always do. So does
-- a wait() of an earlier version, which registers nothing, until upgraded.
CREATE UNLOGGED TABLE pgqueue_waits (
    job_id bigint      NOT NULL,
    until  timestamptz NOT NULL
);
CREATE INDEX pgqueue_waits_job ON pgqueue_waits (job_id);
CREATE INDEX pgqueue_waits_until ON pgqueue_waits (until);

-- As in 0002: ids comma-separated, 300 per notification; now only those of
-- jobs with a registered waiter, whose registrations it deletes.
CREATE OR REPLACE FUNCTION pgqueue_notify_ended(ids bigint[]) RETURNS bigint
LANGUAGE sql VOLATILE AS $$
    WITH waited AS (
        DELETE FROM pgqueue_waits WHERE job_id = ANY(ids) RETURNING job_id
    ), ended AS (
        SELECT job_id, row_number() OVER (ORDER BY job_id) AS n
        FROM (SELECT DISTINCT job_id FROM waited) distinct_ids
    )
    SELECT count(pg_notify('pgqueue_finished', chunk))
    FROM (SELECT string_agg(job_id::text, ',') AS chunk FROM ended
          GROUP BY (n - 1) / 300) chunks
$$;
