-- pgqueue_release (0011, 0013) reads and writes its rows by key whatever
-- the statistics say, as the statements of job_finish do (docs/concepts.md,
-- "Plans that ignore statistics").
--
-- 0013 named every row by key, but left the planner free to reach them
-- another way, and it did: after an ANALYZE that saw no waiting job, the
-- release of 1,000 children read the whole table (a hash join over a
-- sequential scan of pgqueue_jobs, 20,000 rows) and every edge
-- (pgqueue_job_deps). Now the function plans its statements without
-- sequential scans, hash or merge joins, so each step is the key lookup it
-- names, and the state a child must still be in is a join condition (a
-- one-row relation the planner cannot fold) rather than a filter it would
-- estimate from the statistics: with only nested loops left, a filter
-- estimated at one row could otherwise put the table outside the loop and
-- match every child against every waiting row. Step for step the same
-- behaviour as 0013 (its comments say what each step does and why).
CREATE OR REPLACE FUNCTION pgqueue_release(parents bigint[], ok boolean[]) RETURNS integer
LANGUAGE plpgsql VOLATILE
SET enable_seqscan = off SET enable_hashjoin = off SET enable_mergejoin = off AS $$
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
            FROM unnest(children, ended, failed) AS p(child, n, failed),
                 (SELECT 'waiting'::text OFFSET 0) AS expected(state)
            WHERE j.id = p.child AND j.state = expected.state
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
