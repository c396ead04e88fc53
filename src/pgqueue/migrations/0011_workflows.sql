-- Workflows: jobs that wait for other jobs (dependencies, chains, fan-out,
-- fan-in), grouped by a workflow id.
--
-- A job enqueued with unfinished dependencies is `waiting`: no claim index
-- covers that state, so it is never claimed. The statement that ends its
-- last dependency (job_finish, job_reap, the cancels) moves it to `queued`
-- in the same transaction, through pgqueue_release below: no crash between
-- an ack and the next step can lose the step.
--
-- Columns (all NULL or false for a job without dependencies or dependents,
-- so adding them rewrites nothing):
--   workflow_id        groups the jobs of one workflow (GET /workflows/{id})
--   depends_on         the job's parents in the order given: the order of
--                      `job.parents`, the results its handler receives
--   waiting_on         how many parents have not ended yet (decremented by
--                      pgqueue_release; 0 once released)
--   on_dependency_failure  when a parent dies or is cancelled: 'cancel' this job
--                      (and, through it, its own dependents) or 'run' it
--                      anyway, as if that parent had succeeded
--   has_dependents     set on a parent when a dependent is enqueued: the
--                      statements that end jobs look at the edges only for
--                      rows where it is true, so plain jobs pay nothing
ALTER TABLE pgqueue_jobs
    ADD COLUMN workflow_id uuid,
    ADD COLUMN depends_on bigint[],
    ADD COLUMN waiting_on integer,
    ADD COLUMN on_dependency_failure text,
    ADD COLUMN has_dependents boolean NOT NULL DEFAULT false;

-- The state list gains 'waiting'. NOT VALID then VALIDATE: the check of the
-- existing rows does not hold the table's exclusive lock.
ALTER TABLE pgqueue_jobs DROP CONSTRAINT pgqueue_jobs_state_check;
ALTER TABLE pgqueue_jobs ADD CONSTRAINT pgqueue_jobs_state_check
    CHECK (state IN ('waiting', 'queued', 'running', 'succeeded', 'dead', 'cancelled')) NOT VALID;
ALTER TABLE pgqueue_jobs VALIDATE CONSTRAINT pgqueue_jobs_state_check;

-- The edges: one row per (parent, child). The primary key leads with the
-- parent, so the children of an ended job are one index range:
-- releasing them is O(dependents), never a scan.
CREATE TABLE pgqueue_job_deps (
    parent bigint NOT NULL,
    child  bigint NOT NULL,
    PRIMARY KEY (parent, child)
);
-- A workflow's jobs, and the edges into them (GET /workflows/{id}).
CREATE INDEX pgqueue_job_deps_child ON pgqueue_job_deps (child);
-- Partial indexes: a plain job is in neither, so its claim and ack (not HOT
-- updates: the state changes) add no entry to them.
CREATE INDEX pgqueue_jobs_workflow ON pgqueue_jobs (workflow_id) WHERE workflow_id IS NOT NULL;
CREATE INDEX pgqueue_jobs_waiting ON pgqueue_jobs (queue) WHERE state = 'waiting';

-- Release the dependents of jobs that just ended: `parents` ended with
-- `ok` (true: succeeded). Called by the statements that end jobs, only for
-- rows with has_dependents, in the same transaction. For each waiting child
-- of those parents:
--   * a parent that failed (dead, cancelled) and a child whose policy is
--     'cancel': the child is cancelled, and its own dependents follow in the
--     next round (transitively, round by round);
--   * otherwise the parent counts as done: waiting_on goes down, and a child
--     whose last parent just ended becomes queued (run_at: now, or its own
--     later run_at), its queue's workers woken.
-- The children are locked in id order first: two statements releasing
-- overlapping children (two parents of one fan-in acked at once) take the
-- locks in the same order, so one waits for the other instead of
-- deadlocking, and the second decrements the row the first wrote: each
-- child is released once. Returns how many children it changed.
CREATE FUNCTION pgqueue_release(parents bigint[], ok boolean[]) RETURNS integer
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    changed integer := 0;
    n integer;
    cancelled_ids bigint[];
BEGIN
    WHILE coalesce(cardinality(parents), 0) > 0 LOOP
        PERFORM 1 FROM pgqueue_jobs j
        WHERE j.id IN (SELECT d.child FROM pgqueue_job_deps d WHERE d.parent = ANY(parents))
          AND j.state = 'waiting'
        ORDER BY j.id FOR NO KEY UPDATE;
        WITH ended AS (
            SELECT * FROM unnest(parents, ok) AS e(id, ok)
        ), per_child AS (
            SELECT d.child, count(*) AS n, bool_or(NOT e.ok) AS failed
            FROM ended e JOIN pgqueue_job_deps d ON d.parent = e.id
            GROUP BY d.child
        ), moved AS (
            UPDATE pgqueue_jobs j
            SET state = CASE WHEN p.failed AND j.on_dependency_failure = 'cancel' THEN 'cancelled'
                             WHEN j.waiting_on - p.n <= 0 THEN 'queued'
                             ELSE 'waiting' END,
                waiting_on = greatest(j.waiting_on - p.n, 0),
                -- Only when it is released: a child that still waits then
                -- changes no indexed column, so its decrement is a HOT update
                -- (a fan-in's row takes one per ack statement).
                run_at = CASE WHEN j.waiting_on - p.n <= 0 THEN greatest(j.run_at, now())
                              ELSE j.run_at END,
                finished_at = CASE WHEN p.failed AND j.on_dependency_failure = 'cancel'
                                   THEN now() END,
                last_error = CASE WHEN p.failed AND j.on_dependency_failure = 'cancel'
                                  THEN 'cancelled: a job it depends on failed or was cancelled'
                                  ELSE j.last_error END
            FROM per_child p
            WHERE j.id = p.child AND j.state = 'waiting'
            RETURNING j.id, j.queue, j.state, j.has_dependents
        ), counted AS (
            INSERT INTO pgqueue_counters AS c (queue, shard, cancelled)
            -- Shards 16 to 31: the statement that called this function
            -- writes its own shard (0 to 15) at its end, in the same
            -- command, and one command cannot write a row twice.
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
