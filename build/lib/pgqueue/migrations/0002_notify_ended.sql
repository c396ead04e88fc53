-- Tell the waiters of jobs that ended (wait(): one LISTEN connection per
-- queue object, waiters keyed by job id) which jobs those are: their ids,
-- comma-separated, 300 per notification, so that a payload stays under
-- NOTIFY's 8000 bytes whatever the batch size. Called by the statements that
-- end jobs (job_finish, job_cancel, job_reap); returns how many notifications
-- it sent. NULL or an empty array sends none.
CREATE FUNCTION pgqueue_notify_ended(ids bigint[]) RETURNS bigint
LANGUAGE sql VOLATILE AS $$
    SELECT count(pg_notify('pgqueue_finished', chunk))
    FROM (SELECT string_agg(id::text, ',') AS chunk
          FROM unnest(ids) WITH ORDINALITY AS ended(id, n)
          GROUP BY (n - 1) / 300) chunks
$$;
