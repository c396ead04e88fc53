-- Plans that followed the server's version, made independent of it
-- (docs/concepts.md, "Plans that ignore statistics"). On PostgreSQL 15,
-- after an ANALYZE that saw the jobs running (few queued), the planner took
-- a partial index of queued jobs where a probe of the primary key, or the
-- aging index's order, was meant (PostgreSQL 18 did not):
--   * a fair queue's claim locked each job it chose by walking
--     pgqueue_jobs_claim_queue whole: 170 buffers a job, 0.4 s for a claim
--     of 1,000 from 20,000 jobs;
--   * priority aging walked pgqueue_jobs_claim_queue and sorted what it
--     found, instead of reading pgqueue_jobs_aging in its order.

-- No sort either: the aging index gives the order.
ALTER FUNCTION pgqueue_age_priorities(double precision, integer) SET enable_sort = off;

-- pgqueue_pick_fair as 0042 made it, its locks taken by primary key.
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
    -- no further than the `wanted`-th that no other claim holds. Each by
    -- its primary key: the state is compared with a value the planner does
    -- not see, so that no partial index of queued jobs can serve.
    SELECT mine.id, (SELECT now_at FROM clock) FROM in_turn t CROSS JOIN LATERAL (
        SELECT j.id FROM pgqueue_jobs j WHERE j.id = t.id AND j.state = (SELECT 'queued'::text)
        FOR UPDATE SKIP LOCKED) mine
    LIMIT wanted;
END
$$;
