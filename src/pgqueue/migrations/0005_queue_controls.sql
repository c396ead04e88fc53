-- Queue controls: pause, concurrency limits and rate limits, all enforced by
-- the claim statement (job_claim in sql/queries.sql).
--
-- A queue without a row here, or with a row that sets nothing, is claimed as
-- before, with no lock. A paused queue is left out of the claim. A limited
-- queue's jobs are chosen by pgqueue_pick_limited (below), which job_claim
-- calls: under a transaction-level advisory lock of that queue, held until
-- the claim statement ends, so that two claimers cannot both see room for the
-- last slot. No row is updated per claim or per finish: the limits count the
-- running jobs, and the log of starts.
CREATE TABLE pgqueue_queues (
    name                       text PRIMARY KEY,
    paused                     boolean NOT NULL DEFAULT false,
    -- At most this many jobs of the queue running at once, across every worker.
    concurrency_limit          integer CHECK (concurrency_limit >= 1),
    -- At most this many running at once per concurrency_key (jobs without a
    -- key are not limited per key).
    concurrency_limit_per_key  integer CHECK (concurrency_limit_per_key >= 1),
    -- At most this many starts within any window of rate_period_seconds,
    -- for the queue and per concurrency_key.
    rate_limit                 integer CHECK (rate_limit >= 1),
    rate_limit_per_key         integer CHECK (rate_limit_per_key >= 1),
    rate_period_seconds        double precision CHECK (rate_period_seconds > 0),
    -- Whether job_claim must take this queue's lock (it then claims the
    -- queue on its own).
    limited boolean GENERATED ALWAYS AS (
        concurrency_limit IS NOT NULL OR concurrency_limit_per_key IS NOT NULL
        OR rate_limit IS NOT NULL OR rate_limit_per_key IS NOT NULL
    ) STORED,
    updated_at                 timestamptz NOT NULL DEFAULT now(),
    CHECK ((rate_limit IS NULL AND rate_limit_per_key IS NULL) = (rate_period_seconds IS NULL))
);

-- What per-key limits count by (a tenant, a customer, an API account...).
ALTER TABLE pgqueue_jobs ADD COLUMN concurrency_key text;

-- The queued jobs of each key, in claim order, so that a claim under a
-- per-key limit finds the next job of every key with room in one probe per
-- key, however many jobs of a full key wait ahead. Jobs without a key are not
-- in it, so it costs nothing to queues that do not use keys.
CREATE INDEX pgqueue_jobs_claim_key ON pgqueue_jobs (queue, concurrency_key, priority DESC, run_at, id)
    WHERE state = 'queued' AND concurrency_key IS NOT NULL;

-- The starts of rate-limited queues: one row per claim and key, with how
-- many jobs it started. A rate limit is exact over any window because it
-- counts these, not the jobs (a retried job starts again; a pruned job is
-- gone); a row per claim, not per job, keeps the window a few rows long.
-- Rows older than the period are deleted by the next claim of the queue.
CREATE TABLE pgqueue_starts (
    queue           text        NOT NULL,
    concurrency_key text,
    started_at      timestamptz NOT NULL,
    jobs            integer     NOT NULL
);
CREATE INDEX pgqueue_starts_window ON pgqueue_starts (queue, started_at);

-- Which jobs of a limited queue may start now: up to `wanted` of them, within
-- its limits. job_claim calls it for each limited queue it claims from, and
-- starts the jobs it returns (rechecking that each is still queued).
--
-- Why a function: its first statement takes the queue's claim lock, held
-- until the claim's transaction ends, and each later statement of a VOLATILE
-- function reads a snapshot taken after that: it counts every job that an
-- earlier claim started. A lock taken inside the claim statement itself
-- would come after the statement's snapshot, and two claimers could both see
-- room for the last slot.
--
-- `at`, the jobs' started_at, is read once, by the statement that counts and
-- chooses, after its snapshot: so a job is never recorded as started before
-- a job whose end made room for it, and the claims of one queue are in order
-- of their starts, which is what makes the rate limit exact over every
-- window (a rate-limited queue logs each start in pgqueue_starts).
--
-- Jobs without a concurrency_key are not limited per key; under per-key
-- limits they are looked for among the queue's next 1,000 jobs (keyed jobs,
-- through pgqueue_jobs_claim_key, however many wait ahead of them).
CREATE FUNCTION pgqueue_pick_limited(claim_queue text, wanted integer)
RETURNS TABLE (id bigint, at timestamptz)
LANGUAGE plpgsql VOLATILE ROWS 10 AS $$
#variable_conflict use_column
DECLARE
    c pgqueue_queues;
    per_key boolean;
    period interval;
    now_at timestamptz;
    picked bigint[];
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('pgqueue.claim'), hashtext(claim_queue));
    SELECT * INTO c FROM pgqueue_queues q WHERE q.name = claim_queue AND NOT q.paused;
    IF NOT FOUND OR wanted < 1 THEN
        RETURN;
    END IF;
    per_key := c.concurrency_limit_per_key IS NOT NULL OR c.rate_limit_per_key IS NOT NULL;
    period := make_interval(secs => c.rate_period_seconds);
    WITH RECURSIVE clock AS MATERIALIZED (
        SELECT clock_timestamp() AS now_at
    ), room AS (
        -- How many may start now (least() ignores the limits that are NULL).
        SELECT greatest(0, least(
            wanted,
            c.concurrency_limit - (SELECT count(*) FROM pgqueue_jobs j
                                   WHERE j.queue = claim_queue AND j.state = 'running'),
            c.rate_limit - (SELECT coalesce(sum(s.jobs), 0) FROM pgqueue_starts s, clock
                            WHERE s.queue = claim_queue AND s.started_at > clock.now_at - period)
        )) AS n
    ), in_order AS (
        -- Without per-key limits: the queue's next jobs, in claim order.
        SELECT j.id, j.priority, j.run_at FROM pgqueue_jobs j
        WHERE NOT per_key AND j.queue = claim_queue AND j.state = 'queued'
          AND j.run_at <= (SELECT now_at FROM clock)
        ORDER BY j.priority DESC, j.run_at, j.id
        LIMIT (SELECT n FROM room)
    ), queued_key(key, priority, run_at, id) AS (
        -- With per-key limits: every key with queued jobs and its first job
        -- (its head), by a skip scan of pgqueue_jobs_claim_key: one probe per
        -- key, however many jobs of a key wait.
        (SELECT j.concurrency_key, j.priority, j.run_at, j.id FROM pgqueue_jobs j
         WHERE per_key AND j.queue = claim_queue AND j.state = 'queued'
           AND j.concurrency_key IS NOT NULL
         ORDER BY j.concurrency_key, j.priority DESC, j.run_at, j.id LIMIT 1)
        UNION ALL
        SELECT head.* FROM queued_key k CROSS JOIN LATERAL (
            SELECT j.concurrency_key, j.priority, j.run_at, j.id FROM pgqueue_jobs j
            WHERE j.queue = claim_queue AND j.state = 'queued' AND j.concurrency_key > k.key
            ORDER BY j.concurrency_key, j.priority DESC, j.run_at, j.id LIMIT 1) head
    ), busy AS (
        SELECT j.concurrency_key AS key, count(*) AS n FROM pgqueue_jobs j
        WHERE per_key AND j.queue = claim_queue AND j.state = 'running'
          AND j.concurrency_key IS NOT NULL
        GROUP BY 1
    ), recent AS (
        SELECT s.concurrency_key AS key, sum(s.jobs) AS n FROM pgqueue_starts s, clock
        WHERE per_key AND s.queue = claim_queue AND s.started_at > clock.now_at - period
          AND s.concurrency_key IS NOT NULL
        GROUP BY 1
    ), key_room AS (
        -- The keys with room, in the claim order of their heads: only the
        -- first `room` of them can have a job among the first `room`, and
        -- the one at place i at most room - i + 1.
        SELECT ordered.key, least(ordered.n, (SELECT n FROM room) - ordered.place + 1) AS n
        FROM (
            SELECT k.key, row_number() OVER (ORDER BY k.priority DESC, k.run_at, k.id) AS place,
                   least(c.concurrency_limit_per_key - coalesce(b.n, 0),
                         c.rate_limit_per_key - coalesce(r.n, 0)) AS n
            FROM queued_key k
            LEFT JOIN busy b ON b.key = k.key
            LEFT JOIN recent r ON r.key = k.key
            WHERE least(c.concurrency_limit_per_key - coalesce(b.n, 0),
                        c.rate_limit_per_key - coalesce(r.n, 0)) > 0
            ORDER BY k.priority DESC, k.run_at, k.id
            LIMIT (SELECT n FROM room)
        ) ordered
    ), by_key AS (
        -- Each of those keys' next jobs, as many as it has room for...
        SELECT next.* FROM key_room k CROSS JOIN LATERAL (
            SELECT j.id, j.priority, j.run_at FROM pgqueue_jobs j
            WHERE j.queue = claim_queue AND j.concurrency_key = k.key AND j.state = 'queued'
              AND j.run_at <= (SELECT now_at FROM clock)
            ORDER BY j.priority DESC, j.run_at, j.id
            LIMIT k.n) next
        UNION ALL
        -- ...and the jobs without a key among the queue's next 1,000.
        SELECT ahead.id, ahead.priority, ahead.run_at FROM (
            SELECT j.id, j.priority, j.run_at, j.concurrency_key FROM pgqueue_jobs j
            WHERE per_key AND j.queue = claim_queue AND j.state = 'queued'
              AND j.run_at <= (SELECT now_at FROM clock)
            ORDER BY j.priority DESC, j.run_at, j.id
            LIMIT 1000) ahead
        WHERE ahead.concurrency_key IS NULL
    )
    SELECT (SELECT now_at FROM clock),
           ARRAY(SELECT p.id FROM (SELECT * FROM in_order UNION ALL SELECT * FROM by_key) p
                 ORDER BY p.priority DESC, p.run_at, p.id
                 LIMIT (SELECT n FROM room))
    INTO now_at, picked;
    IF c.rate_period_seconds IS NOT NULL AND picked <> '{}' THEN
        DELETE FROM pgqueue_starts s
        WHERE s.queue = claim_queue AND s.started_at <= now_at - period;
        INSERT INTO pgqueue_starts (queue, concurrency_key, started_at, jobs)
        SELECT claim_queue, j.concurrency_key, now_at, count(*) FROM pgqueue_jobs j
        WHERE j.id = ANY(picked) GROUP BY j.concurrency_key;
    END IF;
    RETURN QUERY SELECT p.id, now_at FROM unnest(picked) AS p(id);
END
$$;
