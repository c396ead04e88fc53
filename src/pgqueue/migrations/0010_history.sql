-- History without scanning the jobs: each job's failed attempts, and per
-- queue per minute snapshots of the counters.
--
-- errors: one element per failed attempt, oldest first, the last 20 kept
-- ({"attempt", "error", "worker", "at"}), appended by the statement that
-- records the failure (job_finish, job_reap). NULL while no attempt failed,
-- so a job that succeeds first time stores and writes nothing more.
ALTER TABLE pgqueue_jobs ADD COLUMN errors jsonb;

-- Jobs enqueued, counted by the statements that insert them (as outcomes are
-- counted by the statements that end them), in two steps: each statement
-- appends (queue, how many) to pgqueue_enqueued, and maintenance folds those
-- rows into pgqueue_counters.enqueued. An enqueue may run in a caller's long
-- transaction: an append takes no lock that another producer could wait for
-- (an update of a shared counter row would, until that transaction ends).
ALTER TABLE pgqueue_counters ADD COLUMN enqueued bigint NOT NULL DEFAULT 0;
CREATE TABLE pgqueue_enqueued (
    queue text   NOT NULL,
    n     bigint NOT NULL
) WITH (
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_vacuum_cost_delay = 0
);

-- Every queue's cumulative numbers now: the counters summed over their
-- shards (enqueued: with the appends not folded yet), and the start-latency
-- histogram as {"bucket": count}. A few rows per queue, whatever the history.
CREATE VIEW pgqueue_queue_totals AS
SELECT coalesce(c.queue, l.queue) AS queue,
       coalesce(c.enqueued, 0) AS enqueued, coalesce(c.succeeded, 0) AS succeeded,
       coalesce(c.failed, 0) AS failed, coalesce(c.dead, 0) AS dead,
       coalesce(l.latency, '{}'::jsonb) AS latency
FROM (SELECT queue, sum(enqueued)::bigint AS enqueued, sum(succeeded)::bigint AS succeeded,
             sum(failed)::bigint AS failed, sum(dead)::bigint AS dead
      FROM (SELECT queue, enqueued, succeeded, failed, dead FROM pgqueue_counters
            UNION ALL
            SELECT queue, n, 0, 0, 0 FROM pgqueue_enqueued) counted
      GROUP BY queue) c
FULL JOIN (SELECT queue, jsonb_object_agg(bucket, count ORDER BY bucket) AS latency
           FROM (SELECT queue, bucket, sum(count)::bigint AS count
                 FROM pgqueue_start_latency GROUP BY queue, bucket) b
           GROUP BY queue) l ON l.queue = c.queue;

-- The minutes a snapshot was taken in (one per minute, whichever worker's
-- maintenance comes first). A minute without one had no worker running.
CREATE TABLE pgqueue_history_snapshots (
    minute   timestamptz PRIMARY KEY,
    taken_at timestamptz NOT NULL DEFAULT now()
);

-- A queue's cumulative numbers (pgqueue_queue_totals) as a snapshot found
-- them at `minute`, written only when they changed since the queue's
-- previous row: an idle queue adds no rows. What happened between two
-- snapshots is the difference of the rows in force at each.
CREATE TABLE pgqueue_queue_minutes (
    queue     text        NOT NULL,
    minute    timestamptz NOT NULL,
    enqueued  bigint      NOT NULL,
    succeeded bigint      NOT NULL,
    failed    bigint      NOT NULL,
    dead      bigint      NOT NULL,
    latency   jsonb       NOT NULL,
    PRIMARY KEY (queue, minute)
);
-- Retention reads the oldest rows.
CREATE INDEX pgqueue_queue_minutes_minute ON pgqueue_queue_minutes (minute);

-- A job's errors with one more failed attempt appended, the oldest dropped
-- past the last 20 (each error's first 2,000 characters: the exception and
-- the head of its traceback). Called in the SET of the statements that
-- record a failure, so that the failure and its history are one write.
CREATE FUNCTION pgqueue_errors_append(errors jsonb, attempt integer, error text, worker text)
RETURNS jsonb LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN jsonb_array_length(appended) > 20 THEN appended - 0 ELSE appended END
    FROM (SELECT coalesce(errors, '[]'::jsonb)
                 || jsonb_build_array(jsonb_build_object(
                        'attempt', attempt, 'error', left(error, 2000),
                        'worker', worker, 'at', now())) AS appended) a
$$;
