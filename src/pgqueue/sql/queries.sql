-- Every statement pgqueue sends, one named block each. The loader in
-- pgqueue/sql/__init__.py turns this file into a dict keyed by the name.
-- Each block starts with "-- name: <entity>_<action>" and a line saying what
-- it does. Parameters are psycopg named placeholders. Only now() is used as a
-- clock: every time in the table comes from the database.

-- name: job_enqueue
-- Insert one job; with an idempotency key already present, insert nothing.
-- A run_at in the past means now: run_at is when the job became runnable,
-- which the lag gauge and the start-latency histogram measure from.
-- Returns the new row (created = true) or nothing on a key conflict.
WITH inserted AS (
    INSERT INTO pgqueue_jobs (queue, task, payload, priority, run_at, max_attempts,
                              timeout_seconds, idempotency_key, concurrency_key)
    VALUES (%(queue)s, %(task)s, %(payload)s::jsonb, %(priority)s,
            greatest(coalesce(%(run_at)s, now() + make_interval(secs => %(delay)s)), now()),
            %(max_attempts)s, %(timeout_seconds)s, %(idempotency_key)s, %(concurrency_key)s)
    ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING *
), woken AS (
    -- NOTIFY is a hint that work is ready; delayed jobs need none.
    SELECT pg_notify('pgqueue_jobs', queue) FROM inserted WHERE run_at <= now()
)
SELECT inserted.* FROM inserted, (SELECT count(*) FROM woken) w;

-- name: job_get_by_idempotency_key
-- The job holding an idempotency key.
SELECT * FROM pgqueue_jobs WHERE idempotency_key = %(idempotency_key)s;

-- name: job_enqueue_many
-- Insert many jobs in one statement from parallel arrays. Rows whose
-- idempotency key exists are skipped. One notification per queue, not per job.
WITH inserted AS (
    INSERT INTO pgqueue_jobs (queue, task, payload, priority, run_at, max_attempts,
                              timeout_seconds, idempotency_key, concurrency_key)
    SELECT queue, task, payload, priority,
           greatest(coalesce(run_at, now() + make_interval(secs => delay)), now()),
           max_attempts, timeout_seconds, idempotency_key, concurrency_key
    FROM unnest(%(queue)s::text[], %(task)s::text[], %(payload)s::jsonb[],
                %(priority)s::integer[], %(run_at)s::timestamptz[],
                %(delay)s::double precision[], %(max_attempts)s::integer[],
                %(timeout_seconds)s::double precision[], %(idempotency_key)s::text[],
                %(concurrency_key)s::text[])
         AS t(queue, task, payload, priority, run_at, delay, max_attempts,
              timeout_seconds, idempotency_key, concurrency_key)
    ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING id, idempotency_key, queue, run_at
), woken AS (
    SELECT pg_notify('pgqueue_jobs', queue)
    FROM (SELECT DISTINCT queue FROM inserted WHERE run_at <= now()) q
)
SELECT id, idempotency_key FROM inserted, (SELECT count(*) FROM woken) w ORDER BY id;

-- name: job_ids_by_idempotency_keys
-- The ids of the jobs holding these idempotency keys.
SELECT id, idempotency_key FROM pgqueue_jobs
WHERE idempotency_key = ANY(%(idempotency_keys)s::text[]);

-- name: job_reserve_ids
-- Take `count` ids from the jobs' identity sequence, for a COPY that must
-- know the ids it writes.
-- (The identity sequence's name is fixed by the migration.)
SELECT array_agg(nextval('pgqueue_jobs_id_seq')) AS ids FROM generate_series(1, %(count)s);

-- name: job_copy
-- Bulk load of plain jobs (runnable now, no idempotency key): the fastest
-- path into the table. Rows are (id, queue, task, payload, priority,
-- max_attempts, timeout_seconds, concurrency_key); the rest takes the column
-- defaults.
COPY pgqueue_jobs (id, queue, task, payload, priority, max_attempts, timeout_seconds,
                   concurrency_key) FROM STDIN;

-- name: job_notify_queues
-- One "jobs are ready" hint per queue.
SELECT count(pg_notify('pgqueue_jobs', q)) AS notified FROM unnest(%(queues)s::text[]) AS q;

-- name: job_claim
-- Claim up to `limit` runnable jobs of `queues`, at most `shares[i]` of
-- `queues[i]`, asking the queues in that order (transitions.claim makes the
-- round-robin split; the shares may add up to more than `limit`): mark them
-- running, count the attempt, and give each a lease and a fresh fencing
-- token. The queue controls (pgqueue_queues; a queue without a row has
-- none) say how: a paused queue is left out; a limited queue's jobs are
-- chosen by pgqueue_pick_limited, under that queue's lock.
WITH wanted AS (
    SELECT q.name, q.share, q.place, c.paused, c.limited
    FROM unnest(%(queues)s::text[], %(shares)s::integer[]) WITH ORDINALITY AS q(name, share, place)
    LEFT JOIN pgqueue_queues c ON c.name = q.name
), in_limited_queues AS (
    -- In the order of their locks, so that two claimers never wait for each
    -- other's.
    SELECT picked.id, picked.at
    FROM (SELECT name, share FROM wanted WHERE limited AND NOT paused
          ORDER BY hashtext(name)) q
    CROSS JOIN LATERAL pgqueue_pick_limited(q.name, q.share) picked
    LIMIT %(limit)s
), in_free_queues AS (
    -- Each queue walks its own index, pgqueue_jobs_claim_queue, in claim
    -- order: a flood in one queue costs another queue's claim nothing. The
    -- queues are asked in order, and the claim stops at `limit` (which
    -- also keeps the planner's estimate, and so its plan for the update,
    -- right): what the first queues do not take, the later ones do.
    SELECT next.id, NULL::timestamptz AS at
    FROM (SELECT name, share FROM wanted WHERE paused IS NOT TRUE AND limited IS NOT TRUE
          ORDER BY place) q
    CROSS JOIN LATERAL (
        SELECT id FROM pgqueue_jobs
        WHERE queue = q.name AND state = 'queued' AND run_at <= now()
        ORDER BY priority DESC, run_at, id
        LIMIT q.share
        -- SKIP LOCKED lets concurrent claimers take the next free rows
        -- instead of queueing behind each other's row locks.
        FOR UPDATE SKIP LOCKED) next
    LIMIT %(limit)s
), claimed AS (
    UPDATE pgqueue_jobs j
    SET state = 'running', attempts = j.attempts + 1,
        lease_token = nextval('pgqueue_lease_token_seq'),
        lease_expires_at = now() + make_interval(secs => %(lease_seconds)s),
        worker = %(worker)s, started_at = coalesce(picked.at, now())
    FROM (SELECT id, at FROM in_limited_queues UNION ALL SELECT id, at FROM in_free_queues
          LIMIT %(limit)s) picked
    -- A limited queue's jobs were chosen, not locked: the state is checked
    -- again on the row's newest version.
    WHERE j.id = picked.id AND j.state = 'queued'
    RETURNING j.*, j.started_at - j.run_at AS waited
), latency AS (
    INSERT INTO pgqueue_start_latency AS h (queue, shard, bucket, count, sum_seconds)
    SELECT queue, pg_backend_pid() %% 16,
           width_bucket(extract(epoch FROM waited)::double precision, %(latency_bounds)s::double precision[]),
           count(*), sum(extract(epoch FROM waited))
    FROM claimed GROUP BY 1, 2, 3 ORDER BY 1, 2, 3
    ON CONFLICT (queue, shard, bucket) DO UPDATE
    SET count = h.count + excluded.count, sum_seconds = h.sum_seconds + excluded.sum_seconds
)
SELECT * FROM claimed ORDER BY priority DESC, run_at, id;

-- name: job_heartbeat
-- Extend the leases of many held jobs at once, only where the fencing token
-- still matches. Returns the ids whose lease is still held.
UPDATE pgqueue_jobs j
SET lease_expires_at = now() + make_interval(secs => %(lease_seconds)s)
FROM unnest(%(ids)s::bigint[], %(tokens)s::bigint[]) AS held(id, token)
WHERE j.id = held.id AND j.lease_token = held.token AND j.state = 'running'
RETURNING j.id;

-- name: job_finish
-- Record the outcome of many attempts in one statement, each fenced by its
-- token: a worker whose lease was taken over matches no row. A success ends
-- the job; a failure retries it after a backoff, or ends it dead when it is
-- out of attempts or not retryable. Counts outcomes, and wakes waiters.
WITH outcome AS (
    SELECT * FROM unnest(%(ids)s::bigint[], %(tokens)s::bigint[], %(succeeded)s::boolean[],
                         %(results)s::jsonb[], %(errors)s::text[], %(retryable)s::boolean[])
         AS t(id, token, succeeded, result, error, retryable)
), finished AS (
    UPDATE pgqueue_jobs j
    SET state = CASE WHEN o.succeeded THEN 'succeeded'
                     WHEN o.retryable AND j.attempts < j.max_attempts THEN 'queued'
                     ELSE 'dead' END,
        result = CASE WHEN o.succeeded THEN o.result END,
        last_error = CASE WHEN o.succeeded THEN j.last_error ELSE o.error END,
        run_at = CASE WHEN NOT o.succeeded AND o.retryable AND j.attempts < j.max_attempts
                      THEN now() + pgqueue_backoff(j.attempts, %(backoff_base)s, %(backoff_cap)s)
                      ELSE j.run_at END,
        finished_at = CASE WHEN o.succeeded OR NOT o.retryable OR j.attempts >= j.max_attempts
                           THEN now() END,
        lease_expires_at = NULL
    FROM outcome o
    WHERE j.id = o.id AND j.lease_token = o.token AND j.state = 'running'
    RETURNING j.id, j.queue, j.state, o.succeeded
), counted AS (
    INSERT INTO pgqueue_counters AS c (queue, shard, succeeded, failed, dead)
    SELECT queue, pg_backend_pid() %% 16,
           count(*) FILTER (WHERE succeeded), count(*) FILTER (WHERE NOT succeeded),
           count(*) FILTER (WHERE state = 'dead')
    FROM finished GROUP BY 1, 2 ORDER BY 1, 2
    ON CONFLICT (queue, shard) DO UPDATE
    SET succeeded = c.succeeded + excluded.succeeded, failed = c.failed + excluded.failed,
        dead = c.dead + excluded.dead
), woken AS (
    -- The waiters of the jobs that ended (wait()) learn which ones.
    SELECT pgqueue_notify_ended(array_agg(id))
    FROM finished WHERE state <> 'queued' AND %(notify_finished)s
)
SELECT id, state FROM finished, (SELECT count(*) FROM woken) w;

-- name: job_reap
-- Take back up to `limit` jobs whose lease expired (their worker died or
-- stalled). An expired lease is a failed attempt: back to queued after the
-- same backoff as any failure, or dead when out of attempts. Rows another
-- reaper is handling are skipped, so every worker may run this at once.
WITH expired AS (
    SELECT id FROM pgqueue_jobs
    WHERE state = 'running' AND lease_expires_at < now()
    ORDER BY lease_expires_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), reaped AS (
    UPDATE pgqueue_jobs j
    SET state = CASE WHEN j.attempts < j.max_attempts THEN 'queued' ELSE 'dead' END,
        run_at = CASE WHEN j.attempts < j.max_attempts
                      THEN now() + pgqueue_backoff(j.attempts, %(backoff_base)s, %(backoff_cap)s)
                      ELSE j.run_at END,
        finished_at = CASE WHEN j.attempts < j.max_attempts THEN NULL ELSE now() END,
        last_error = format('lease expired (worker %%s, attempt %%s)', j.worker, j.attempts),
        lease_expires_at = NULL
    FROM expired WHERE j.id = expired.id
    RETURNING j.id, j.queue, j.state
), counted AS (
    INSERT INTO pgqueue_counters AS c (queue, shard, failed, dead)
    SELECT queue, pg_backend_pid() %% 16, count(*), count(*) FILTER (WHERE state = 'dead')
    FROM reaped GROUP BY 1, 2 ORDER BY 1, 2
    ON CONFLICT (queue, shard) DO UPDATE
    SET failed = c.failed + excluded.failed, dead = c.dead + excluded.dead
), woken AS (
    -- A job reaped dead has ended: its waiters learn it, as in job_finish.
    SELECT pgqueue_notify_ended(array_agg(id)) FROM reaped WHERE state = 'dead'
)
SELECT id, state FROM reaped, (SELECT count(*) FROM woken) w;

-- name: job_cancel
-- Cancel a queued or running job; a running job's lease is revoked, so its
-- worker's ack matches nothing.
WITH cancelled AS (
    UPDATE pgqueue_jobs
    SET state = 'cancelled', finished_at = now(), lease_expires_at = NULL
    WHERE id = %(id)s AND state IN ('queued', 'running')
    RETURNING *
), counted AS (
    INSERT INTO pgqueue_counters AS c (queue, shard, cancelled)
    SELECT queue, pg_backend_pid() %% 16, 1 FROM cancelled
    ON CONFLICT (queue, shard) DO UPDATE SET cancelled = c.cancelled + 1
), woken AS (
    SELECT pgqueue_notify_ended(array_agg(id)) FROM cancelled
)
SELECT cancelled.* FROM cancelled, (SELECT count(*) FROM woken) w;

-- name: job_retry
-- Put a dead or cancelled job back to queued with a fresh attempt budget.
WITH retried AS (
    UPDATE pgqueue_jobs
    SET state = 'queued', attempts = 0, run_at = now(), finished_at = NULL,
        started_at = NULL, result = NULL, lease_token = NULL, worker = NULL
    WHERE id = %(id)s AND state IN ('dead', 'cancelled')
    RETURNING *
), woken AS (
    SELECT pg_notify('pgqueue_jobs', queue) FROM retried
)
SELECT retried.* FROM retried, (SELECT count(*) FROM woken) w;

-- name: job_retry_dead
-- Put every dead job (of one queue, or of all) back to queued.
WITH retried AS (
    UPDATE pgqueue_jobs
    SET state = 'queued', attempts = 0, run_at = now(), finished_at = NULL,
        started_at = NULL, result = NULL, lease_token = NULL, worker = NULL
    WHERE state = 'dead' AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
    RETURNING id, queue
), woken AS (
    SELECT pg_notify('pgqueue_jobs', queue) FROM (SELECT DISTINCT queue FROM retried) q
)
SELECT count(*) AS retried FROM retried, (SELECT count(*) FROM woken) w;

-- name: job_get
-- One job by id.
SELECT * FROM pgqueue_jobs WHERE id = %(id)s;

-- name: job_list
-- Jobs newest first, filtered, after a keyset cursor (the last id seen).
SELECT * FROM pgqueue_jobs
WHERE (%(state)s::text IS NULL OR state = %(state)s::text)
  AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
  AND (%(task)s::text IS NULL OR task = %(task)s::text)
  AND (%(before_id)s::bigint IS NULL OR id < %(before_id)s::bigint)
ORDER BY id DESC
LIMIT %(limit)s;

-- name: job_list_summary
-- Like job_list, without the heavy columns (payload, result, last_error):
-- what a listing that polls needs, without reading large values.
SELECT id, queue, task, priority, state, run_at, attempts, max_attempts,
       timeout_seconds, idempotency_key, concurrency_key, worker, lease_expires_at,
       enqueued_at, started_at, finished_at
FROM pgqueue_jobs
WHERE (%(state)s::text IS NULL OR state = %(state)s::text)
  AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
  AND (%(task)s::text IS NULL OR task = %(task)s::text)
  AND (%(before_id)s::bigint IS NULL OR id < %(before_id)s::bigint)
ORDER BY id DESC
LIMIT %(limit)s;

-- name: job_prune
-- Delete up to `limit` finished jobs older than the retention period. The
-- counters already hold their outcomes, so metrics do not move.
WITH pruned AS (
DELETE FROM pgqueue_jobs
WHERE id IN (
    SELECT id FROM pgqueue_jobs
    WHERE state IN ('succeeded', 'dead', 'cancelled')
      AND finished_at < now() - make_interval(secs => %(retention_seconds)s)
    ORDER BY finished_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
RETURNING 1
)
SELECT count(*) AS pruned FROM pruned;

-- name: queue_next_wake
-- What an idle worker needs to know to sleep well, for `queues` (NULL:
-- every queue): in how many seconds the earliest delayed job becomes
-- runnable, or a start leaves the window of a rate-limited queue, whichever
-- is first (NULL: neither), and which queues have a concurrency limit (a job
-- of theirs that ends frees a slot). Runnable jobs do not count: the worker
-- has just claimed what it could, so those that are left wait for a limit
-- or a pause, not for time.
SELECT extract(epoch FROM least(
           (SELECT min(run_at) FROM pgqueue_jobs
            WHERE state = 'queued' AND run_at > now()
              AND (%(queues)s::text[] IS NULL OR queue = ANY(%(queues)s::text[]))),
           (SELECT min(s.started_at) + make_interval(secs => c.rate_period_seconds)
            FROM pgqueue_queues c JOIN pgqueue_starts s ON s.queue = c.name
            WHERE c.rate_period_seconds IS NOT NULL AND NOT c.paused
              AND (%(queues)s::text[] IS NULL OR c.name = ANY(%(queues)s::text[]))
              AND s.started_at > now() - make_interval(secs => c.rate_period_seconds)
            GROUP BY c.name, c.rate_period_seconds
            ORDER BY 1 LIMIT 1)
       ) - now())::double precision AS seconds,
       ARRAY(SELECT name FROM pgqueue_queues
             WHERE NOT paused
               AND (concurrency_limit IS NOT NULL OR concurrency_limit_per_key IS NOT NULL)
               AND (%(queues)s::text[] IS NULL OR name = ANY(%(queues)s::text[]))
             ORDER BY name) AS limited;

-- name: queue_names_queued
-- The queues that have queued jobs, in name order: a skip scan of
-- pgqueue_jobs_claim_queue, one probe per queue however many jobs wait in it.
WITH RECURSIVE named(queue) AS (
    (SELECT queue FROM pgqueue_jobs WHERE state = 'queued' ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT j.queue FROM pgqueue_jobs j
            WHERE j.state = 'queued' AND j.queue > n.queue ORDER BY j.queue LIMIT 1)
    FROM named n WHERE n.queue IS NOT NULL
)
SELECT queue FROM named WHERE queue IS NOT NULL;

-- name: queue_controls
-- Every queue's controls (pause, limits), by name.
SELECT * FROM pgqueue_queues ORDER BY name;

-- name: queue_controls_lock
-- A queue's controls, its row made if missing and locked until the
-- transaction ends, for a change (controls.change) that reads, then writes.
INSERT INTO pgqueue_queues AS c (name) VALUES (%(queue)s)
ON CONFLICT (name) DO UPDATE SET name = c.name
RETURNING c.*;

-- name: queue_controls_write
-- Write a queue's controls (all of them; the row is locked by
-- queue_controls_lock). A queue not paused afterwards may have jobs that can
-- start now (it was resumed, or a limit was raised): the workers are woken.
-- The start log of a queue that is no longer rate-limited is dropped.
WITH written AS (
    UPDATE pgqueue_queues
    SET paused = %(paused)s, concurrency_limit = %(concurrency_limit)s,
        concurrency_limit_per_key = %(concurrency_limit_per_key)s,
        rate_limit = %(rate_limit)s, rate_limit_per_key = %(rate_limit_per_key)s,
        rate_period_seconds = %(rate_period_seconds)s, updated_at = now()
    WHERE name = %(queue)s
    RETURNING *
), forgotten AS (
    DELETE FROM pgqueue_starts s USING written w
    WHERE s.queue = w.name AND w.rate_period_seconds IS NULL
), woken AS (
    SELECT pg_notify('pgqueue_jobs', name) FROM written WHERE NOT paused
)
SELECT written.* FROM written, (SELECT count(*) FROM woken) w;

-- name: queue_stats
-- Per queue and live state: how many jobs, and the age of the oldest runnable
-- one. Reads only the partial indexes of queued and running rows: one branch
-- per index, because the planner cannot match "state IN (...)" to a partial
-- index and would scan every finished job instead.
SELECT queue,
       count(*) FILTER (WHERE state = 'queued' AND run_at <= now()) AS queued,
       count(*) FILTER (WHERE state = 'queued' AND run_at > now()) AS scheduled,
       count(*) FILTER (WHERE state = 'running') AS running,
       coalesce(extract(epoch FROM now() - min(run_at) FILTER (WHERE state = 'queued' AND run_at <= now())), 0)::double precision AS oldest_runnable_seconds
FROM (SELECT queue, state, run_at FROM pgqueue_jobs WHERE state = 'queued'
      UNION ALL
      SELECT queue, state, run_at FROM pgqueue_jobs WHERE state = 'running') live
GROUP BY queue
ORDER BY queue;

-- name: queue_throughput
-- Per queue, the jobs that ended within the last `window_seconds`, by how
-- they ended (for the command line's done-per-minute). A range read of the
-- pgqueue_jobs_finished partial index.
SELECT queue,
       count(*) FILTER (WHERE state = 'succeeded') AS succeeded,
       count(*) FILTER (WHERE state = 'dead') AS dead,
       count(*) FILTER (WHERE state = 'cancelled') AS cancelled
FROM pgqueue_jobs
WHERE state IN ('succeeded', 'dead', 'cancelled')
  AND finished_at > now() - make_interval(secs => %(window_seconds)s)
GROUP BY queue
ORDER BY queue;

-- name: counters_totals
-- Outcome totals per queue, summed over shards.
SELECT queue, sum(succeeded)::bigint AS succeeded, sum(failed)::bigint AS failed,
       sum(dead)::bigint AS dead, sum(cancelled)::bigint AS cancelled
FROM pgqueue_counters GROUP BY queue ORDER BY queue;

-- name: start_latency_histogram
-- Enqueue-to-start histogram per queue and bucket, summed over shards.
SELECT queue, bucket, sum(count)::bigint AS count, sum(sum_seconds) AS sum_seconds
FROM pgqueue_start_latency GROUP BY queue, bucket ORDER BY queue, bucket;

-- name: snapshot_begin
-- Make the current transaction one read-only snapshot, so that several reads
-- (the API's /metrics and /queues) see the same moment and the same now().
-- Must be the first statement of the transaction.
SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY;

-- name: db_ping
-- The database answers.
SELECT 1 AS ok;

-- name: server_set_password
-- The embedded server's superuser password, given as a SCRAM verifier made
-- by the client, so the password itself never reaches the server or its
-- logs. A utility statement takes no parameters: run it on a ClientCursor.
ALTER ROLE postgres PASSWORD %(verifier)s;

-- name: listen_jobs
-- Subscribe to "jobs are ready" hints (payload: the queue name).
LISTEN pgqueue_jobs;

-- name: listen_finished
-- Subscribe to "these jobs ended" hints (payload: job ids, comma-separated),
-- for wait().
LISTEN pgqueue_finished;

-- name: migration_lock
-- Serialise concurrent migrators (session-level advisory lock).
SELECT pg_advisory_lock(hashtext('pgqueue.migrate'));

-- name: migration_unlock
-- Release the migrators' lock.
SELECT pg_advisory_unlock(hashtext('pgqueue.migrate'));

-- name: migration_table
-- The record of applied migrations.
CREATE TABLE IF NOT EXISTS pgqueue_migrations (
    version    text PRIMARY KEY,
    applied_at timestamptz NOT NULL DEFAULT now()
);

-- name: migration_table_exists
-- Whether the record of applied migrations exists (false: never migrated).
SELECT to_regclass('pgqueue_migrations') IS NOT NULL AS present;

-- name: migration_applied
-- Versions already applied.
SELECT version FROM pgqueue_migrations ORDER BY version;

-- name: migration_record
-- Record one applied version.
INSERT INTO pgqueue_migrations (version) VALUES (%(version)s);
