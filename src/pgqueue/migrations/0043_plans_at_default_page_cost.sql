-- Two reads whose plans followed the server's random_page_cost, planned
-- without the scans that cost lets the planner prefer (docs/concepts.md,
-- "Plans that ignore statistics").
--
-- The embedded server sets random_page_cost = 1.1; PostgreSQL's default is
-- 4, what a server of the user's own runs. There, an index probe is priced
-- at four pages read, and the planner chose:
--   * for the queue statistics (/metrics, /queues, `pgqueue queues`, the
--     doctor), after churn (claim indexes large but nearly empty), a scan of
--     the whole table: every finished job not yet archived, read at every
--     scrape (up to archive_after_seconds of them: five minutes of jobs);
--   * for priority aging, with statistics that saw no job of negative
--     priority, a bitmap scan of pgqueue_jobs_aging, which reads every due
--     job and sorts them all, where `limit` was wanted.
-- (The claim's own reads are made independent of it in job_claim itself.)

-- Per queue and live state: how many jobs, and the age of the oldest
-- runnable one (queue_stats). One branch per partial index of the live
-- states: the planner cannot match "state IN (...)" to a partial index.
CREATE FUNCTION pgqueue_live_counts()
RETURNS TABLE (queue text, queued bigint, scheduled bigint, running bigint,
               waiting bigint, oldest_runnable_seconds double precision)
LANGUAGE sql STABLE
SET enable_seqscan = off AS $$
    SELECT live.queue,
           count(*) FILTER (WHERE live.state = 'queued' AND live.run_at <= now()),
           count(*) FILTER (WHERE live.state = 'queued' AND live.run_at > now()),
           count(*) FILTER (WHERE live.state = 'running'),
           count(*) FILTER (WHERE live.state = 'waiting'),
           coalesce(extract(epoch FROM now() - min(live.run_at)
                    FILTER (WHERE live.state = 'queued' AND live.run_at <= now())), 0)::double precision
    FROM (SELECT j.queue, j.state, j.run_at FROM pgqueue_jobs j WHERE j.state = 'queued'
          UNION ALL
          SELECT j.queue, j.state, j.run_at FROM pgqueue_jobs j WHERE j.state = 'running'
          UNION ALL
          SELECT j.queue, j.state, j.run_at FROM pgqueue_jobs j WHERE j.state = 'waiting') live
    GROUP BY live.queue
    ORDER BY live.queue
$$;

-- Raise by one the priority of up to `wanted` queued jobs of negative
-- priority that became runnable, or took their last step, `aging_seconds`
-- ago or more (job_age_priorities), oldest first, in the order of
-- pgqueue_jobs_aging: neither a bitmap scan of it nor a scan of the table.
CREATE FUNCTION pgqueue_age_priorities(aging_seconds double precision, wanted integer)
RETURNS TABLE (id bigint)
LANGUAGE sql VOLATILE ROWS 10
SET enable_seqscan = off SET enable_bitmapscan = off AS $$
    WITH due AS (
        SELECT j.id FROM pgqueue_jobs j
        WHERE j.state = 'queued' AND j.priority < 0
          AND greatest(j.run_at, j.aged_at) <= now() - make_interval(secs => aging_seconds)
        ORDER BY greatest(j.run_at, j.aged_at)
        LIMIT wanted
        -- Rows another transaction holds (a claim) are skipped.
        FOR UPDATE SKIP LOCKED
    )
    UPDATE pgqueue_jobs j SET priority = j.priority + 1, aged_at = now()
    FROM due
    WHERE j.id = due.id
    RETURNING j.id
$$;
