-- Per-key latency objectives (docs/howto/limits.md, "Latency objectives"):
-- in a fair queue, a key (a concurrency_key, a tenant) may declare the
-- longest its runnable jobs should wait to start. A key whose next job has
-- waited at least half of it is claimed before the round robin: its jobs
-- fill the claim first, the key furthest behind (wait / objective) first,
-- then the other keys share what is left round robin, as before. Without a
-- row here a queue is claimed exactly as 0040 claims it; its claims read
-- this table by its primary key, one probe that finds nothing.
--
-- Operators declare the rows (Queue.set_key_objective, HTTP, CLI): a few
-- per queue, so /metrics may show one series per row.
CREATE TABLE pgqueue_key_objectives (
    queue text NOT NULL,
    key text NOT NULL CHECK (length(key) BETWEEN 1 AND 255),
    max_start_lag_seconds double precision NOT NULL CHECK (max_start_lag_seconds > 0),
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (queue, key)
);

-- Each key of `of_queue` with an objective, and how long its next job (its
-- head, the one a claim would take first: pgqueue_jobs_claim_key's order)
-- has waited at `at_time` (0: none is runnable). The claims below read it
-- to find the keys behind; Queue.key_objectives and /metrics show it, so
-- that what an operator sees is what the claim weighs. One probe of the
-- claim index per declared key. SQL and STABLE, so that the planner can
-- inline it into the claim's statement.
CREATE FUNCTION pgqueue_key_lags(of_queue text, at_time timestamptz)
RETURNS TABLE (key text, max_start_lag_seconds double precision, wait_seconds double precision)
LANGUAGE sql STABLE AS $$
    SELECT o.key, o.max_start_lag_seconds,
           coalesce(greatest(0, extract(epoch FROM at_time - head.run_at)), 0)::double precision
    FROM pgqueue_key_objectives o LEFT JOIN LATERAL (
        SELECT j.run_at FROM pgqueue_jobs j
        WHERE j.queue = o.queue AND j.concurrency_key = o.key AND j.state = 'queued'
        ORDER BY j.priority DESC, j.run_at, j.id LIMIT 1) head ON true
    WHERE o.queue = of_queue
$$;

-- pgqueue_pick_fair as 0040 made it, with the keys behind their objective
-- first.
CREATE OR REPLACE FUNCTION pgqueue_pick_fair(claim_queue text, wanted integer)
RETURNS TABLE (id bigint, at timestamptz)
LANGUAGE plpgsql VOLATILE ROWS 10
-- As 0019 set pgqueue_pick_limited: no sequential scans, whatever the
-- statistics say.
SET enable_seqscan = off AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH RECURSIVE clock AS MATERIALIZED (
        SELECT clock_timestamp() AS now_at
    ), behind AS MATERIALIZED (
        -- The keys whose next job has waited at least half of their
        -- objective, and how far behind it each is (a probe of
        -- pgqueue_key_objectives' primary key, which finds nothing in a
        -- queue without objectives).
        SELECT l.key, l.wait_seconds / l.max_start_lag_seconds AS urgency
        FROM clock CROSS JOIN LATERAL pgqueue_key_lags(claim_queue, clock.now_at) l
        WHERE l.wait_seconds >= l.max_start_lag_seconds / 2
    ), queued_key(key, priority, run_at, id) AS (
        -- Every key with queued jobs and its first job (its head), by a skip
        -- scan of pgqueue_jobs_claim_key: one probe per key.
        (SELECT j.concurrency_key, j.priority, j.run_at, j.id FROM pgqueue_jobs j
         WHERE j.queue = claim_queue AND j.state = 'queued' AND j.concurrency_key IS NOT NULL
         ORDER BY j.concurrency_key, j.priority DESC, j.run_at, j.id LIMIT 1)
        UNION ALL
        SELECT head.* FROM queued_key k CROSS JOIN LATERAL (
            SELECT j.concurrency_key, j.priority, j.run_at, j.id FROM pgqueue_jobs j
            WHERE j.queue = claim_queue AND j.state = 'queued' AND j.concurrency_key > k.key
            ORDER BY j.concurrency_key, j.priority DESC, j.run_at, j.id LIMIT 1) head
    ), key_room AS (
        -- As in pgqueue_pick_limited: only the first `wanted` keys, in the
        -- claim order of their heads, can have a job among the first
        -- `wanted`, and the one at place i at most wanted - i + 1.
        SELECT k.key, wanted - row_number() OVER (
                   ORDER BY k.priority DESC, k.run_at, k.id) + 1 AS n
        FROM queued_key k
        ORDER BY k.priority DESC, k.run_at, k.id
        LIMIT wanted
    ), candidate AS (
        -- Each of those keys' next jobs (but those of the keys behind their
        -- objective, taken before the round robin), as many as it has room
        -- for and `wanted` more...
        SELECT next.* FROM key_room k CROSS JOIN LATERAL (
            SELECT j.id, j.priority, j.run_at, j.concurrency_key AS key FROM pgqueue_jobs j
            WHERE j.queue = claim_queue AND j.concurrency_key = k.key AND j.state = 'queued'
              AND j.run_at <= (SELECT now_at FROM clock)
            ORDER BY j.priority DESC, j.run_at, j.id
            LIMIT 2 * k.n) next
        WHERE k.key NOT IN (SELECT b.key FROM behind b)
        UNION ALL
        -- ...and the jobs without a key among the queue's next 1,000.
        SELECT ahead.id, ahead.priority, ahead.run_at, NULL FROM (
            SELECT j.id, j.priority, j.run_at, j.concurrency_key FROM pgqueue_jobs j
            WHERE j.queue = claim_queue AND j.state = 'queued'
              AND j.run_at <= (SELECT now_at FROM clock)
            ORDER BY j.priority DESC, j.run_at, j.id
            LIMIT 1000) ahead
        WHERE ahead.concurrency_key IS NULL
    ), in_turn AS MATERIALIZED (
        -- First the next jobs of the keys behind their objective, wherever
        -- their heads are, the furthest behind first, as many as the whole
        -- claim and `wanted` more...
        (SELECT late.id FROM behind b CROSS JOIN LATERAL (
             SELECT j.id, j.priority, j.run_at FROM pgqueue_jobs j
             WHERE j.queue = claim_queue AND j.concurrency_key = b.key AND j.state = 'queued'
               AND j.run_at <= (SELECT now_at FROM clock)
             ORDER BY j.priority DESC, j.run_at, j.id
             LIMIT 2 * wanted) late
         ORDER BY b.urgency DESC, late.priority DESC, late.run_at, late.id)
        UNION ALL
        -- ...then each other key's first job, then each key's second, ...:
        -- round robin, sorted as 0040 sorts it. (One sort led by the
        -- urgency, NULL for all but a few keys, took 1.4 times as long as
        -- 0040's claim without objectives: the NULL slows every
        -- comparison's reading of the columns after it.) The statement
        -- locks rows, so its plan is not parallel: the Append returns its
        -- branches one after the other, each in its order.
        (SELECT c.id FROM candidate c
         ORDER BY row_number() OVER (PARTITION BY c.key ORDER BY c.priority DESC, c.run_at, c.id),
                  c.priority DESC, c.run_at, c.id)
    )
    -- Locked in that order (the scan of a materialized CTE keeps it), and
    -- no further than the `wanted`-th that no other claim holds.
    SELECT mine.id, (SELECT now_at FROM clock) FROM in_turn t CROSS JOIN LATERAL (
        SELECT j.id FROM pgqueue_jobs j WHERE j.id = t.id AND j.state = 'queued'
        FOR UPDATE SKIP LOCKED) mine
    LIMIT wanted;
END
$$;

-- pgqueue_pick_limited as 0040 made it, with the keys of a fair queue
-- behind their objective first, within their per-key limits.
CREATE OR REPLACE FUNCTION pgqueue_pick_limited(claim_queue text, wanted integer)
RETURNS TABLE (id bigint, at timestamptz)
LANGUAGE plpgsql VOLATILE ROWS 10
-- As 0019 set it: no sequential scans, whatever the statistics say.
SET enable_seqscan = off AS $$
#variable_conflict use_column
DECLARE
    c pgqueue_queues;
    per_key boolean;
    period interval;
    now_at timestamptz;
    picked bigint[];
BEGIN
    SELECT * INTO c FROM pgqueue_queues q WHERE q.name = claim_queue AND NOT q.paused;
    IF NOT FOUND OR wanted < 1 THEN
        RETURN;
    END IF;
    IF c.fair AND c.concurrency_limit IS NULL AND c.concurrency_limit_per_key IS NULL
       AND c.rate_limit IS NULL AND c.rate_limit_per_key IS NULL THEN
        RETURN QUERY SELECT * FROM pgqueue_pick_fair(claim_queue, wanted);
        RETURN;
    END IF;
    -- Limits count the queue's running jobs and recent starts: the claims
    -- of a limited queue take turns, each counting what the last one did.
    PERFORM pg_advisory_xact_lock(hashtext('pgqueue.claim'), hashtext(claim_queue));
    -- Read again under the lock: a pause or a limit that committed while
    -- this claim waited for it counts.
    SELECT * INTO c FROM pgqueue_queues q WHERE q.name = claim_queue AND NOT q.paused;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    -- A fair queue shares its room across keys: it reads them as per-key
    -- limits do (one probe per key), each key with room for all of it.
    per_key := c.concurrency_limit_per_key IS NOT NULL OR c.rate_limit_per_key IS NOT NULL
               OR c.fair IS TRUE;
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
        SELECT j.id, j.priority, j.run_at, NULL::text AS key FROM pgqueue_jobs j
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
    ), behind AS MATERIALIZED (
        -- In a fair queue, as in pgqueue_pick_fair: the keys whose next job
        -- has waited at least half of their objective, and how far behind.
        SELECT l.key, l.wait_seconds / l.max_start_lag_seconds AS urgency
        FROM clock CROSS JOIN LATERAL pgqueue_key_lags(claim_queue, clock.now_at) l
        WHERE c.fair AND l.wait_seconds >= l.max_start_lag_seconds / 2
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
        -- the one at place i at most room - i + 1; a key behind its
        -- objective, wherever its head is, as many as its own room allows.
        SELECT ordered.key,
               least(ordered.n, (SELECT n FROM room)
                     - CASE WHEN ordered.key IN (SELECT late.key FROM behind late) THEN 0
                            ELSE ordered.place - 1 END) AS n
        FROM (
            -- (No per-key limit, in a fair queue: room for all of it.)
            SELECT k.key, row_number() OVER (ORDER BY k.priority DESC, k.run_at, k.id) AS place,
                   coalesce(least(c.concurrency_limit_per_key - coalesce(b.n, 0),
                                  c.rate_limit_per_key - coalesce(r.n, 0)),
                            (SELECT n FROM room)) AS n
            FROM queued_key k
            LEFT JOIN busy b ON b.key = k.key
            LEFT JOIN recent r ON r.key = k.key
            WHERE coalesce(least(c.concurrency_limit_per_key - coalesce(b.n, 0),
                                 c.rate_limit_per_key - coalesce(r.n, 0)),
                           (SELECT n FROM room)) > 0
        ) ordered
        WHERE ordered.place <= (SELECT n FROM room)
           OR ordered.key IN (SELECT late.key FROM behind late)
    ), by_key AS (
        -- Each of those keys' next jobs (but those of the keys behind their
        -- objective, taken first below), as many as it has room for...
        SELECT next.* FROM key_room k CROSS JOIN LATERAL (
            SELECT j.id, j.priority, j.run_at, j.concurrency_key AS key FROM pgqueue_jobs j
            WHERE j.queue = claim_queue AND j.concurrency_key = k.key AND j.state = 'queued'
              AND j.run_at <= (SELECT now_at FROM clock)
            ORDER BY j.priority DESC, j.run_at, j.id
            LIMIT k.n) next
        WHERE k.key NOT IN (SELECT late.key FROM behind late)
        UNION ALL
        -- ...and the jobs without a key among the queue's next 1,000.
        SELECT ahead.id, ahead.priority, ahead.run_at, NULL FROM (
            SELECT j.id, j.priority, j.run_at, j.concurrency_key FROM pgqueue_jobs j
            WHERE per_key AND j.queue = claim_queue AND j.state = 'queued'
              AND j.run_at <= (SELECT now_at FROM clock)
            ORDER BY j.priority DESC, j.run_at, j.id
            LIMIT 1000) ahead
        WHERE ahead.concurrency_key IS NULL
    )
    SELECT (SELECT now_at FROM clock),
           -- A fair queue takes the jobs of the keys behind their
           -- objective first, the furthest behind first; then each other
           -- key's first job, then each key's second, ... (the jobs without
           -- a key count as one key): round robin, so a key with a million
           -- jobs waiting cannot hold back one with ten. Otherwise the
           -- claim order. (Two sorts, as in pgqueue_pick_fair: the round
           -- robin's sorted as 0040 sorts it. The Append returns them one
           -- after the other, each in its order.)
           ARRAY(SELECT turn.id FROM (
                     (SELECT next.id FROM key_room k JOIN behind late ON late.key = k.key
                      CROSS JOIN LATERAL (
                          SELECT j.id, j.priority, j.run_at FROM pgqueue_jobs j
                          WHERE j.queue = claim_queue AND j.concurrency_key = k.key
                            AND j.state = 'queued' AND j.run_at <= (SELECT now_at FROM clock)
                          ORDER BY j.priority DESC, j.run_at, j.id
                          LIMIT k.n) next
                      ORDER BY late.urgency DESC, next.priority DESC, next.run_at, next.id)
                     UNION ALL
                     (SELECT p.id FROM (SELECT * FROM in_order UNION ALL SELECT * FROM by_key) p
                      ORDER BY CASE WHEN c.fair THEN row_number() OVER (
                                   PARTITION BY p.key ORDER BY p.priority DESC, p.run_at, p.id) END,
                               p.priority DESC, p.run_at, p.id)) turn
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
