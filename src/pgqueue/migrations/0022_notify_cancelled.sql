-- Tell the workers which running attempts a cancel just ended, so that they
-- stop the handlers at once instead of at their next heartbeat (which finds
-- the lease gone). Called by the statements that cancel jobs (job_cancel,
-- job_bulk_cancel, workflow_cancel) with the jobs that were running and
-- their lease tokens; delivered when the cancel commits. One channel for
-- every worker, not one per worker: a worker's name is not an identifier
-- (nor short enough for one), cancels of running jobs are rare, and each
-- worker keeps only the pairs whose token it holds.
--
-- Payload: "id:token" pairs, comma-separated, 150 per notification (at most
-- 150 * 39 + 149 bytes with 19-digit numbers), so that a payload stays under
-- NOTIFY's 8000 bytes whatever the batch. Returns how many notifications it
-- sent; NULL or empty arrays send none.
CREATE FUNCTION pgqueue_notify_cancelled(ids bigint[], tokens bigint[]) RETURNS bigint
LANGUAGE sql VOLATILE AS $$
    SELECT count(pg_notify('pgqueue_cancelled', chunk))
    FROM (SELECT string_agg(id::text || ':' || token::text, ',') AS chunk
          FROM unnest(ids, tokens) WITH ORDINALITY AS running(id, token, n)
          GROUP BY (n - 1) / 150) chunks
$$;
