-- pgqueue_release finds the dependents of the jobs that ended by primary key
-- only, so that releasing them is O(dependents) under any statistics.
--
-- The function of 0011 joined the edges to the `waiting` rows, and the
-- planner was free to read every waiting row (pgqueue_jobs_waiting) or every
-- edge (a sequential scan of pgqueue_job_deps) to do it. It took that choice
-- exactly when it hurts: a fan-out inserts thousands of waiting rows at once,
-- the statistics still say the table is nearly empty, and the first release
-- leaves thousands of dead entries in pgqueue_jobs_waiting that bitmap scans
-- never clear. A fan-in over 10,000 children then paid a scan of 10,000
-- entries on every ack batch (6 to 8 ms instead of a fraction of one).
--
-- Here each step names its rows by key: the edges of the ended parents by
-- the edges' primary key (parent first), the children by the jobs' primary
-- key, and nothing compares a row with a long list element by element. The state test is written `(state = 'waiting') IS TRUE`, which the
-- planner cannot match to pgqueue_jobs_waiting's predicate, so no plan can
-- swap the key lookups for a read of every waiting row. Same behaviour as
-- 0011, step for step (its comment says what each step does and why).
CREATE OR REPLACE FUNCTION pgqueue_release(parents bigint[], ok boolean[]) RETURNS integer
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    changed integer := 0;
    n integer;
    any_failed boolean;
    all_failed boolean;
    failed_parents bigint[];
    children bigint[];
    ended integer[];
    failed boolean[];
    cancelled_ids bigint[];
BEGIN
    WHILE coalesce(cardinality(parents), 0) > 0 LOOP
        -- Whether a child saw a parent fail: an ack batch has usually none
        -- and a cancellation only failed ones, so the list of the failed is
        -- searched only when the batch mixes both (at most an ack batch).
        any_failed := false = ANY(ok);
        all_failed := NOT (true = ANY(ok));
        failed_parents := CASE WHEN any_failed AND NOT all_failed THEN
            ARRAY(SELECT e.id FROM unnest(parents, ok) AS e(id, ok) WHERE NOT e.ok) END;
        -- Per child of the ended parents (the edges by their primary key,
        -- parent first): how many of its parents ended, and whether one failed.
        SELECT array_agg(c.child ORDER BY c.child), array_agg(c.n ORDER BY c.child),
               array_agg(c.failed ORDER BY c.child)
        INTO children, ended, failed
        FROM (
            SELECT d.child, count(*)::integer AS n,
                   CASE WHEN NOT any_failed THEN false
                        WHEN all_failed THEN true
                        ELSE bool_or(d.parent = ANY(failed_parents)) END AS failed
            FROM pgqueue_job_deps d
            WHERE d.parent = ANY(parents)
            GROUP BY d.child
        ) c;
        -- The waiting ones, locked in id order (see 0011: no deadlock between
        -- two releases of one fan-in, and each child released once).
        PERFORM 1 FROM pgqueue_jobs j
        WHERE j.id = ANY(children) AND (j.state = 'waiting') IS TRUE
        ORDER BY j.id FOR NO KEY UPDATE;
        WITH moved AS (
            UPDATE pgqueue_jobs j
            SET state = CASE WHEN p.failed AND j.on_dependency_failure = 'cancel' THEN 'cancelled'
                             WHEN j.waiting_on - p.n <= 0 THEN 'queued'
                             ELSE 'waiting' END,
                waiting_on = greatest(j.waiting_on - p.n, 0),
                run_at = CASE WHEN j.waiting_on - p.n <= 0 THEN greatest(j.run_at, now())
                              ELSE j.run_at END,
                finished_at = CASE WHEN p.failed AND j.on_dependency_failure = 'cancel'
                                   THEN now() END,
                last_error = CASE WHEN p.failed AND j.on_dependency_failure = 'cancel'
                                  THEN 'cancelled: a job it depends on failed or was cancelled'
                                  ELSE j.last_error END
            FROM unnest(children, ended, failed) AS p(child, n, failed)
            WHERE j.id = p.child AND (j.state = 'waiting') IS TRUE
            RETURNING j.id, j.queue, j.state, j.has_dependents
        ), counted AS (
            INSERT INTO pgqueue_counters AS c (queue, shard, cancelled)
            SELECT queue, 16 + pg_backend_pid() % 16, count(*)
            FROM moved WHERE state = 'cancelled' GROUP BY 1, 2 ORDER BY 1, 2
            ON CONFLICT (queue, shard) DO UPDATE SET cancelled = c.cancelled + excluded.cancelled
        ), woken AS (
            SELECT pg_notify('pgqueue_jobs', queue)
            FROM (SELECT DISTINCT queue FROM moved WHERE state = 'queued') q
        ), ended_now AS (
            SELECT pgqueue_notify_ended(array_agg(id)) FROM moved WHERE state = 'cancelled'
        )
        SELECT count(*), array_agg(id) FILTER (WHERE state = 'cancelled' AND has_dependents)
        INTO n, cancelled_ids
        FROM moved, (SELECT count(*) FROM woken) w, (SELECT count(*) FROM ended_now) e;
        changed := changed + n;
        parents := cancelled_ids;
        ok := array_fill(false, ARRAY[coalesce(cardinality(cancelled_ids), 0)]);
    END LOOP;
    RETURN changed;
END
$$;
