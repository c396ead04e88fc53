-- The SQL enqueue of a job with dependencies (0038) takes an archived
-- parent back into the hot table before locking it, as the library's
-- enqueue does (queries.sql job_unarchive; the archive is 0034's): a
-- succeeded job that was archived can still be depended on.
CREATE OR REPLACE FUNCTION pgqueue_enqueue_dependent(
    field text, new_task text, new_payload jsonb, new_queue text, new_priority bigint,
    new_run_at timestamptz, new_max_attempts bigint, new_timeout_seconds double precision,
    new_concurrency_key text, new_metadata jsonb, deps bigint[], policy text
) RETURNS bigint LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    locked bigint[];
    unfinished integer;
    failed boolean;
    first_state text;
    new_id bigint;
BEGIN
    -- queries.sql job_unarchive: archived parents come back to the hot
    -- table first, so that the edge, has_dependents and the child's claim
    -- find them where every other parent is.
    WITH restored AS (
        DELETE FROM pgqueue_jobs_archive a WHERE a.id = ANY(deps) RETURNING a.*
    )
    INSERT INTO pgqueue_jobs SELECT * FROM restored;
    -- queries.sql job_lock_parents: in id order, so that two enqueues never
    -- deadlock; a parent's finish waits for the new edge.
    SELECT coalesce(array_agg(p.id), '{}'),
           count(*) FILTER (WHERE p.state IN ('waiting', 'queued', 'running')),
           coalesce(bool_or(p.state IN ('dead', 'cancelled')), false)
    INTO locked, unfinished, failed
    FROM (SELECT id, state FROM pgqueue_jobs WHERE id = ANY(deps) ORDER BY id
          FOR NO KEY UPDATE) p;
    IF cardinality(locked) < cardinality(deps) THEN
        PERFORM pgqueue_invalid_job(field || 'depends_on', 'no job with id ' || (
            SELECT string_agg(i::text, ', ' ORDER BY n)
            FROM unnest(deps) WITH ORDINALITY AS u(i, n) WHERE i <> ALL (locked)));
    END IF;
    -- dependencies.plan, for one job.
    first_state := CASE WHEN failed AND policy = 'cancel' THEN 'cancelled'
                        WHEN unfinished > 0 THEN 'waiting' ELSE 'queued' END;
    -- queries.sql job_insert_graph, for one job.
    INSERT INTO pgqueue_jobs (queue, task, payload, priority, run_at, max_attempts,
                              timeout_seconds, concurrency_key, state, waiting_on,
                              on_dependency_failure, depends_on, finished_at, last_error,
                              metadata)
    VALUES (new_queue, new_task, new_payload, new_priority, new_run_at, new_max_attempts,
            new_timeout_seconds, new_concurrency_key, first_state,
            CASE WHEN first_state = 'cancelled' THEN 0 ELSE unfinished END, policy, deps,
            CASE WHEN first_state = 'cancelled' THEN now() END,
            CASE WHEN first_state = 'cancelled'
                 THEN 'cancelled: a job it depends on failed or was cancelled' END,
            new_metadata)
    RETURNING id INTO new_id;
    INSERT INTO pgqueue_job_deps (parent, child) SELECT parent, new_id FROM unnest(deps) AS parent;
    UPDATE pgqueue_jobs SET has_dependents = true WHERE id = ANY(deps) AND NOT has_dependents;
    IF first_state = 'cancelled' THEN
        INSERT INTO pgqueue_counters AS c (queue, shard, cancelled)
        VALUES (new_queue, pg_backend_pid() % 16, 1)
        ON CONFLICT (queue, shard) DO UPDATE SET cancelled = c.cancelled + excluded.cancelled;
    ELSIF first_state = 'queued' AND new_run_at <= now() THEN
        PERFORM pg_notify('pgqueue_jobs', new_queue);
    END IF;
    INSERT INTO pgqueue_enqueued (queue, n) VALUES (new_queue, 1);
    RETURN new_id;
END
$$;
