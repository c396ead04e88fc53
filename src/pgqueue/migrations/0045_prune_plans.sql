-- The prune (job_prune) planned without the scans the statistics could
-- lead it to (docs/concepts.md, "Plans that ignore statistics"). With
-- statistics that saw no finished job (never analyzed, or analyzed empty),
-- its walk of the jobs past retention was a bitmap scan of
-- pgqueue_jobs_finished that reads every such job and sorts them all for
-- `limit` of them (a backlog past retention read whole at each round), and on
-- PostgreSQL 15 the check that a workflow has no job left was a hash of a
-- scan of the whole table. As a function with those scans (and sorts: the
-- index gives the order) off, the walk reads pgqueue_jobs_finished in its
-- order and everything else is reached by primary key.
CREATE FUNCTION pgqueue_prune(retention_seconds double precision, wanted integer)
RETURNS bigint
LANGUAGE sql VOLATILE
SET enable_seqscan = off SET enable_bitmapscan = off SET enable_sort = off AS $$
    WITH pruned AS (
        DELETE FROM pgqueue_jobs
        WHERE id IN (
            SELECT id FROM pgqueue_jobs
            WHERE state IN ('succeeded', 'dead', 'cancelled')
              AND finished_at < now() - make_interval(secs => retention_seconds)
            ORDER BY finished_at
            LIMIT wanted
            FOR UPDATE SKIP LOCKED)
        RETURNING id, has_dependents, workflow_id
    ), unlinked AS (
        DELETE FROM pgqueue_job_deps d USING pruned p WHERE p.has_dependents AND d.parent = p.id
    ), steps_deleted AS (
        -- A job's steps (job.step()) go with it: one probe of the steps'
        -- primary key per pruned job.
        DELETE FROM pgqueue_job_steps s USING pruned p WHERE s.job_id = p.id
    ), signals_deleted AS (
        -- And its signals not consumed (Queue.signal()), by the same prefix.
        DELETE FROM pgqueue_job_signals s USING pruned p WHERE s.job_id = p.id
    ), emptied AS (
        -- This statement still sees the rows it deletes: they are left out by id.
        DELETE FROM pgqueue_workflows w
        WHERE w.id IN (SELECT workflow_id FROM pruned WHERE workflow_id IS NOT NULL)
          AND NOT EXISTS (
              SELECT 1 FROM pgqueue_jobs j
              WHERE j.id BETWEEN w.first_job AND w.last_job AND j.workflow_id = w.id
                AND j.id NOT IN (SELECT id FROM pruned))
    ), batches_pruned AS (
        DELETE FROM pgqueue_batches
        WHERE id IN (
            SELECT id FROM pgqueue_batches
            WHERE state = 'finished'
              AND finished_at < now() - make_interval(secs => retention_seconds)
            ORDER BY finished_at
            LIMIT wanted
            FOR UPDATE SKIP LOCKED)
    )
    SELECT count(*) FROM pruned
$$;
