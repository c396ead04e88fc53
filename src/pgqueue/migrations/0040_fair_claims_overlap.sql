-- A fair queue without limits (docs/howto/limits.md, "Fair queues") is
-- claimed under row locks instead of its queue's lock, so that two claims
-- of it overlap instead of taking turns: a key that comes beside a large
-- backlog waits for whichever claim begins next, not for the one holding
-- the lock to commit. Limits still need the lock (their counts of running
-- jobs and recent starts must not change under a claim): a fair queue with
-- limits, and every limited queue, is claimed as 0032 made it.

-- A fair queue's next `wanted` jobs, round robin across its keys (the jobs
-- without a key count as one key), each locked FOR UPDATE SKIP LOCKED: a
-- concurrent claim takes the jobs after them instead of the same ones.
-- Called by pgqueue_pick_limited for a fair queue without limits.
--
-- The jobs are chosen as pgqueue_pick_limited chooses them, without locks,
-- each key's walk going `wanted` jobs further for those that claims beside
-- this one may hold; then they are locked one by one in their round-robin
-- order, those another claim holds skipped, until `wanted` are. So a claim
-- locks only the jobs it takes (locking each key's next jobs as they are
-- walked would lock up to wanted * (wanted + 1) / 2 of them with many
-- keys, each lock a write, and hold the jobs it does not take from the
-- claims beside it until it commits).
CREATE FUNCTION pgqueue_pick_fair(claim_queue text, wanted integer)
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
        -- Each of those keys' next jobs, as many as it has room for and
        -- `wanted` more...
        SELECT next.* FROM key_room k CROSS JOIN LATERAL (
            SELECT j.id, j.priority, j.run_at, j.concurrency_key AS key FROM pgqueue_jobs j
            WHERE j.queue = claim_queue AND j.concurrency_key = k.key AND j.state = 'queued'
              AND j.run_at <= (SELECT now_at FROM clock)
            ORDER BY j.priority DESC, j.run_at, j.id
            LIMIT 2 * k.n) next
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
        -- Each key's first job, then each key's second, ...: round robin.
        SELECT c.id FROM candidate c
        ORDER BY row_number() OVER (PARTITION BY c.key ORDER BY c.priority DESC, c.run_at, c.id),
                 c.priority DESC, c.run_at, c.id
    )
    -- Locked in that order (the scan of a materialized CTE keeps it), and
    -- no further than the `wanted`-th that no other claim holds.
    SELECT mine.id, (SELECT now_at FROM clock) FROM in_turn t CROSS JOIN LATERAL (
        SELECT j.id FROM pgqueue_jobs j WHERE j.id = t.id AND j.state = 'queued'
        FOR UPDATE SKIP LOCKED) mine
    LIMIT wanted;
END
$$;

-- pgqueue_pick_limited as 0032 made it, but a fair queue without limits
-- goes to pgqueue_pick_fair, without the queue's lock.
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
    -- Read again under the lock, as before 0040: a pause or a limit that
    -- committed while this claim waited for it counts.
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
            ORDER BY k.priority DESC, k.run_at, k.id
            LIMIT (SELECT n FROM room)
        ) ordered
    ), by_key AS (
        -- Each of those keys' next jobs, as many as it has room for...
        SELECT next.* FROM key_room k CROSS JOIN LATERAL (
            SELECT j.id, j.priority, j.run_at, j.concurrency_key AS key FROM pgqueue_jobs j
            WHERE j.queue = claim_queue AND j.concurrency_key = k.key AND j.state = 'queued'
              AND j.run_at <= (SELECT now_at FROM clock)
            ORDER BY j.priority DESC, j.run_at, j.id
            LIMIT k.n) next
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
           -- A fair queue takes each key's first job, then each key's
           -- second, ... (the jobs without a key count as one key): round
           -- robin, so a key with a million jobs waiting cannot hold back
           -- one with ten. Otherwise the claim order.
           ARRAY(SELECT p.id FROM (SELECT * FROM in_order UNION ALL SELECT * FROM by_key) p
                 ORDER BY CASE WHEN c.fair THEN row_number() OVER (
                              PARTITION BY p.key ORDER BY p.priority DESC, p.run_at, p.id) END,
                          p.priority DESC, p.run_at, p.id
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
