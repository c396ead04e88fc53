-- Every statement pgqueue sends, one named block each. The loader in
-- pgqueue/sql/__init__.py turns this file into a dict keyed by the name.
-- Each block starts with "-- name: <entity>_<action>" and a line saying what
-- it does. Parameters are psycopg named placeholders. Only now() is used as a
-- clock: every time in the table comes from the database.

-- name: job_enqueue
-- Insert one job; when another job holds its key (pgqueue_jobs_key: the
-- predicate is the index's), insert nothing. `id` is the one the call
-- reserved (job_reserve_ids), or NULL for the column's default (a caller's
-- transaction, which is not retried): a retry whose earlier attempt
-- committed the job meets its id in the primary key, a unique violation
-- that the driver raises into the flow as KeyTaken. `call_key` is the
-- call's (enqueue.CallKey), by which a retry tells its own job from
-- another call's under the same id; NULL in a caller's transaction.
-- A run_at in the past means now: run_at is when the job became runnable,
-- which the lag gauge and the start-latency histogram measure from.
-- A job that joins a batch (`batch_id`; the flow locked it first: batch_lock)
-- counts in it.
-- Returns the new row (created = true) or nothing on a conflict.
WITH inserted AS (
    INSERT INTO pgqueue_jobs (id, queue, task, payload, priority, run_at, max_attempts,
                              timeout_seconds, idempotency_key, unique_scope,
                              concurrency_key, metadata, call_key, batch_id)
    VALUES (coalesce(%(id)s::bigint, nextval('pgqueue_jobs_id_seq')),
            %(queue)s, %(task)s, %(payload)s::jsonb, %(priority)s,
            greatest(coalesce(%(run_at)s, now() + make_interval(secs => %(delay)s)), now()),
            %(max_attempts)s, %(timeout_seconds)s, %(idempotency_key)s, %(unique_scope)s,
            %(concurrency_key)s, %(metadata)s::jsonb, %(call_key)s::uuid, %(batch_id)s::uuid)
    ON CONFLICT (idempotency_key)
        WHERE idempotency_key IS NOT NULL AND pgqueue_key_held(unique_scope, state, started_at)
        DO NOTHING
    RETURNING *
), woken AS (
    -- NOTIFY is a hint that work is ready; delayed jobs need none.
    SELECT pg_notify('pgqueue_jobs', queue) FROM inserted WHERE run_at <= now()
), counted AS (
    -- Counted for the per-minute history. Appended, not added to a counter
    -- row: a caller's transaction holds no lock another producer could wait on.
    INSERT INTO pgqueue_enqueued (queue, n) SELECT queue, 1 FROM inserted
), joined AS (
    -- Its batch counts it (migrations/0027). A plain job calls nothing.
    SELECT pgqueue_batch_moved(array_agg(batch_id), array_agg(NULL::text), array_agg(state))
    FROM inserted WHERE batch_id IS NOT NULL HAVING count(*) > 0
)
SELECT inserted.* FROM inserted, (SELECT count(*) FROM woken) w, (SELECT count(*) FROM joined) b;

-- name: job_debounce
-- An enqueue's on_conflict (replace or extend; enqueue.py), after its insert
-- found the key held: write the new job's payload, metadata and priority into
-- the job that holds the key, if it is still waiting (queued, its first
-- attempt not started); with extend, move its run_at later to the new job's
-- (never earlier: a debounce, "run after the last event's delay"). The
-- holder is found by the key alone, through its index (pgqueue_jobs_key),
-- and then reached by id whatever the statistics say, as job_heartbeat
-- reaches its rows: the state it must still be in comes from a one-row
-- relation the planner cannot fold (asked for queued jobs as a filter, it
-- walked a claim index after an ANALYZE that saw none). Under READ COMMITTED a
-- concurrent claim or debounce of the row is waited for and the row checked
-- again: a job that started meanwhile is left alone (no row returned), and
-- concurrent extends keep the latest run_at. The database's clock. Returns
-- the changed row.
WITH holder AS MATERIALIZED (
    SELECT id FROM pgqueue_jobs
    WHERE idempotency_key = %(idempotency_key)s
      AND pgqueue_key_held(unique_scope, state, started_at)
)
UPDATE pgqueue_jobs j SET
    payload = %(payload)s::jsonb,
    metadata = %(metadata)s::jsonb,
    priority = %(priority)s,
    run_at = CASE WHEN %(on_conflict)s::text = 'extend'
                  THEN greatest(j.run_at, coalesce(%(run_at)s,
                                                   now() + make_interval(secs => %(delay)s)))
                  ELSE j.run_at END
FROM holder, (SELECT 'queued'::text OFFSET 0) AS expected(state)
WHERE j.id = holder.id AND j.state = expected.state AND j.started_at IS NULL
RETURNING j.*;

-- name: job_get_by_idempotency_key
-- The job holding a key now (jobs that held it before may share it).
SELECT * FROM pgqueue_jobs
WHERE idempotency_key = %(idempotency_key)s
  AND pgqueue_key_held(unique_scope, state, started_at);

-- name: job_enqueue_many
-- Insert many jobs in one statement from parallel arrays, with the ids the
-- call reserved (job_reserve_ids). Rows whose key is held (by another job,
-- or by an earlier row of the same array) are skipped, and so are rows an
-- earlier attempt of the same call committed (their id exists): no conflict
-- target, so that the primary key is an arbiter too. (The chunks of one
-- call go in one after another: keys are ordered within a chunk.) Every
-- row carries the call's key (`call_key`: one for all, see job_enqueue).
-- One notification per queue, not per job. Jobs that join a batch count in
-- it (as in job_enqueue).
WITH inserted AS (
    INSERT INTO pgqueue_jobs (id, queue, task, payload, priority, run_at, max_attempts,
                              timeout_seconds, idempotency_key, unique_scope,
                              concurrency_key, metadata, call_key, batch_id)
    SELECT id, queue, task, payload, priority,
           greatest(coalesce(run_at, now() + make_interval(secs => delay)), now()),
           max_attempts, timeout_seconds, idempotency_key, unique_scope, concurrency_key,
           metadata, %(call_key)s::uuid, batch_id
    FROM unnest(%(id)s::bigint[], %(queue)s::text[], %(task)s::text[], %(payload)s::jsonb[],
                %(priority)s::integer[], %(run_at)s::timestamptz[],
                %(delay)s::double precision[], %(max_attempts)s::integer[],
                %(timeout_seconds)s::double precision[], %(idempotency_key)s::text[],
                %(unique_scope)s::text[], %(concurrency_key)s::text[], %(metadata)s::jsonb[],
                %(batch_id)s::uuid[])
         AS t(id, queue, task, payload, priority, run_at, delay, max_attempts,
              timeout_seconds, idempotency_key, unique_scope, concurrency_key, metadata,
              batch_id)
    -- In key order: two calls whose keys overlap take them in the same
    -- order, so that neither waits for a key the other holds while it
    -- holds one the other waits for (a deadlock). Of the rows of one key,
    -- the first given (the lowest id) goes in; the others may then replace
    -- or extend it, in their order (on_conflict).
    ORDER BY idempotency_key, id
    ON CONFLICT DO NOTHING
    RETURNING id, queue, run_at, state, batch_id
), woken AS (
    SELECT pg_notify('pgqueue_jobs', queue)
    FROM (SELECT DISTINCT queue FROM inserted WHERE run_at <= now()) q
), counted AS (
    INSERT INTO pgqueue_enqueued (queue, n) SELECT queue, count(*) FROM inserted GROUP BY 1
), joined AS (
    SELECT pgqueue_batch_moved(array_agg(batch_id), array_agg(NULL::text), array_agg(state))
    FROM inserted WHERE batch_id IS NOT NULL HAVING count(*) > 0
)
SELECT id FROM inserted, (SELECT count(*) FROM woken) w, (SELECT count(*) FROM joined) b;

-- name: job_get_many
-- The jobs of a group commit (enqueue.enqueue_group) by id: those it
-- created and those holding the keys of the jobs it did not.
SELECT * FROM pgqueue_jobs WHERE id = ANY(%(ids)s::bigint[]);

-- name: job_enqueue_found
-- For the rows job_enqueue_many skipped: which of their ids exist
-- (`reserved`; an earlier attempt of the same call committed the row if it
-- carries the call's key, `call_key`: enqueue.made_by), and the jobs
-- holding their keys now (`holds_key`: the key a row holds, else NULL).
-- Also what a retry whose batch closed meanwhile reads to learn whether
-- its first attempt committed (enqueue._committed_before).
SELECT id, id = ANY(%(ids)s::bigint[]) AS reserved,
       CASE WHEN pgqueue_key_held(unique_scope, state, started_at)
            THEN idempotency_key END AS holds_key,
       call_key
FROM pgqueue_jobs
WHERE id = ANY(%(ids)s::bigint[])
   OR (idempotency_key = ANY(%(idempotency_keys)s::text[])
       AND pgqueue_key_held(unique_scope, state, started_at));

-- name: job_reserve_ids
-- Take `count` ids from the jobs' identity sequence, for an enqueue that
-- must know the ids it writes: a COPY, and a call that may be retried (its
-- ids are its key across attempts).
-- (The identity sequence's name is fixed by the migration.)
SELECT array_agg(nextval('pgqueue_jobs_id_seq')) AS ids FROM generate_series(1, %(count)s);

-- name: job_copy
-- Bulk load of plain jobs (runnable now, no idempotency key): the fastest
-- path into the table. Rows are (id, queue, task, payload, priority,
-- max_attempts, timeout_seconds, concurrency_key, metadata, call_key); the
-- rest takes the column defaults.
COPY pgqueue_jobs (id, queue, task, payload, priority, max_attempts, timeout_seconds,
                   concurrency_key, metadata, call_key) FROM STDIN;

-- name: job_lock_parents
-- The existing jobs new jobs will depend on, and their states, locked until
-- the enqueue commits: a parent's finish waits for the new edges, so that
-- its release (pgqueue_release) sees them, and a parent that ended before
-- is seen ended here. In id order, so that two enqueues never deadlock.
SELECT id, state FROM pgqueue_jobs
WHERE id = ANY(%(ids)s::bigint[])
ORDER BY id
FOR NO KEY UPDATE;

-- name: job_insert_graph
-- Insert jobs that depend on others (dependencies.enqueue_graph), with the
-- ids job_reserve_ids gave and the first state the flow planned (waiting,
-- queued, or cancelled when a parent had already failed); their edges
-- (`parents[i]` -> `children[i]`, each child's parents in the order given,
-- which is the order of its depends_on); and has_dependents on the existing
-- parents (`outside`, locked by job_lock_parents). Jobs due now wake the
-- workers of their queue. Returns the new rows.
WITH edge AS (
    SELECT * FROM unnest(%(parents)s::bigint[], %(children)s::bigint[]) WITH ORDINALITY
        AS e(parent, child, n)
), parents_of AS (
    SELECT child, array_agg(parent ORDER BY n) AS depends_on FROM edge GROUP BY child
), inserted AS (
    INSERT INTO pgqueue_jobs (id, queue, task, payload, priority, run_at, max_attempts,
                              timeout_seconds, concurrency_key, state, waiting_on,
                              on_dependency_failure, has_dependents, workflow_id, depends_on,
                              finished_at, last_error, metadata)
    SELECT t.id, t.queue, t.task, t.payload, t.priority,
           greatest(coalesce(t.run_at, now() + make_interval(secs => t.delay)), now()),
           t.max_attempts, t.timeout_seconds, t.concurrency_key, t.state, t.waiting_on,
           t.policy, t.has_dependents, %(workflow_id)s::uuid, p.depends_on,
           CASE WHEN t.state = 'cancelled' THEN now() END,
           CASE WHEN t.state = 'cancelled'
                THEN 'cancelled: a job it depends on failed or was cancelled' END,
           t.metadata
    FROM unnest(%(ids)s::bigint[], %(queue)s::text[], %(task)s::text[], %(payload)s::jsonb[],
                %(priority)s::integer[], %(run_at)s::timestamptz[],
                %(delay)s::double precision[], %(max_attempts)s::integer[],
                %(timeout_seconds)s::double precision[], %(concurrency_key)s::text[],
                %(state)s::text[], %(waiting_on)s::integer[], %(policy)s::text[],
                %(has_dependents)s::boolean[], %(metadata)s::jsonb[])
         AS t(id, queue, task, payload, priority, run_at, delay, max_attempts,
              timeout_seconds, concurrency_key, state, waiting_on, policy, has_dependents,
              metadata)
    LEFT JOIN parents_of p ON p.child = t.id
    RETURNING *
), edges AS (
    INSERT INTO pgqueue_job_deps (parent, child) SELECT DISTINCT parent, child FROM edge
), workflow AS (
    -- Where the workflow's jobs are: the range of their ids (migration 0014).
    INSERT INTO pgqueue_workflows (id, first_job, last_job)
    SELECT %(workflow_id)s::uuid, min(i), max(i) FROM unnest(%(ids)s::bigint[]) AS i
    HAVING %(workflow_id)s::uuid IS NOT NULL
), marked AS (
    UPDATE pgqueue_jobs SET has_dependents = true
    WHERE id = ANY(%(outside)s::bigint[]) AND NOT has_dependents
), counted AS (
    INSERT INTO pgqueue_counters AS c (queue, shard, cancelled)
    SELECT queue, pg_backend_pid() %% 16, count(*)
    FROM inserted WHERE state = 'cancelled' GROUP BY 1, 2 ORDER BY 1, 2
    ON CONFLICT (queue, shard) DO UPDATE SET cancelled = c.cancelled + excluded.cancelled
), woken AS (
    SELECT pg_notify('pgqueue_jobs', queue)
    FROM (SELECT DISTINCT queue FROM inserted WHERE state = 'queued' AND run_at <= now()) q
), enqueued AS (
    -- For the per-minute history, as every enqueue.
    INSERT INTO pgqueue_enqueued (queue, n) SELECT queue, count(*) FROM inserted GROUP BY 1
)
SELECT inserted.* FROM inserted, (SELECT count(*) FROM woken) w ORDER BY id;

-- name: job_copied
-- After a job_copy in the same transaction: the jobs it inserted counted as
-- enqueued (`counts[i]` of `queues[i]`; a COPY cannot count them itself),
-- and one "jobs are ready" hint per queue.
WITH counted AS (
    INSERT INTO pgqueue_enqueued (queue, n)
    SELECT * FROM unnest(%(queues)s::text[], %(counts)s::bigint[])
)
SELECT count(pg_notify('pgqueue_jobs', q)) AS notified FROM unnest(%(queues)s::text[]) AS q;

-- fragment: plain_insert
-- A few plain jobs (job_copy's columns: runnable now, no key, no batch)
-- counted as enqueued, their queues woken: one statement, which on its own,
-- outside a transaction, commits all of them or none. No ON CONFLICT: an
-- id that is taken fails the whole statement (KeyTaken), and the flow
-- looks at whose job holds it (enqueue.enqueue_plain).
WITH inserted AS (
    INSERT INTO pgqueue_jobs (id, queue, task, payload, priority, max_attempts,
                              timeout_seconds, concurrency_key, metadata, call_key)
    SELECT t.*, %(call_key)s::uuid
    FROM unnest(%(id)s::bigint[], %(queue)s::text[], %(task)s::text[], %(payload)s::jsonb[],
                %(priority)s::integer[], %(max_attempts)s::integer[],
                %(timeout_seconds)s::double precision[], %(concurrency_key)s::text[],
                %(metadata)s::jsonb[]) AS t
    RETURNING *
), counted AS (
    INSERT INTO pgqueue_enqueued (queue, n) SELECT queue, count(*) FROM inserted GROUP BY 1
), woken AS (
    SELECT count(pg_notify('pgqueue_jobs', q)) AS notified
    FROM (SELECT DISTINCT queue FROM inserted) AS d(q)
)

-- name: job_enqueue_plain
-- plain_insert for enqueue_many, which knows its jobs' ids.
--> plain_insert
SELECT notified FROM woken;

-- name: job_enqueue_plain_rows
-- plain_insert for a group commit, which answers each caller with its job.
--> plain_insert
SELECT inserted.* FROM inserted, woken;

-- name: job_claim
-- Claim up to `limit` runnable jobs of `queues`, at most `shares[i]` of
-- `queues[i]`, asking the queues in that order (transitions.claim makes the
-- round-robin split; the shares may add up to more than `limit`): mark them
-- running, count the attempt, and give each a lease and a fresh fencing
-- token. The queue controls (pgqueue_queues; a queue without a row has
-- none) say how: a paused queue is left out; a limited queue's jobs are
-- chosen by pgqueue_pick_limited, under that queue's lock (a fair queue
-- without limits: by pgqueue_pick_fair, under row locks, migration 0040).
WITH wanted AS (
    SELECT q.name, q.share, q.place, c.paused, c.limited
    FROM unnest((SELECT %(queues)s::text[]), (SELECT %(shares)s::integer[]))
         WITH ORDINALITY AS q(name, share, place)
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
), picked AS (
    -- As arrays, unnested below: the planner cannot count them, so that it
    -- reaches each row by primary key (as job_finish does). Joined to the
    -- picks as a set of known size (a claim of 1,000), on a server with
    -- PostgreSQL's default random_page_cost of 4, it hashed them against a
    -- scan of the whole table, which it prices below 1,000 index probes
    -- while the table holds fewer than some 250,000 rows.
    SELECT array_agg(id) AS ids, array_agg(at) AS ats
    FROM (SELECT id, at FROM in_limited_queues UNION ALL SELECT id, at FROM in_free_queues
          LIMIT %(limit)s) p
), claimed AS (
    UPDATE pgqueue_jobs j
    SET state = 'running', attempts = j.attempts + 1,
        lease_token = nextval('pgqueue_lease_token_seq'),
        lease_expires_at = now() + make_interval(secs => %(lease_seconds)s),
        worker = %(worker)s, started_at = coalesce(one.at, now())
    FROM picked CROSS JOIN LATERAL unnest(picked.ids, picked.ats) AS one(id, at),
         (SELECT 'queued'::text OFFSET 0) AS expected(state)
    -- A limited queue's jobs were chosen, not locked (a fair queue's
    -- without limits were locked): the state is checked again on the
    -- row's newest version. Against `expected`, a join
    -- condition (as in job_heartbeat), so that the rows are reached by
    -- primary key whatever the statistics say: neither through a partial
    -- index on the state (under a backlog that grows faster than ANALYZE
    -- runs, the statistics say few rows are queued, and the planner read
    -- every queued row of the claim index once per claimed job: 42,000 for
    -- each of 111, 150 ms a claim) nor by a scan of the table.
    WHERE j.id = one.id AND j.state = expected.state
    RETURNING j.*
), latency AS (
    INSERT INTO pgqueue_start_latency AS h (queue, shard, bucket, count, sum_seconds)
    SELECT queue, pg_backend_pid() %% 16,
           width_bucket(extract(epoch FROM started_at - run_at)::double precision,
                        %(latency_bounds)s::double precision[]),
           count(*), sum(extract(epoch FROM started_at - run_at))
    FROM claimed GROUP BY 1, 2, 3 ORDER BY 1, 2, 3
    ON CONFLICT (queue, shard, bucket) DO UPDATE
    SET count = h.count + excluded.count, sum_seconds = h.sum_seconds + excluded.sum_seconds
)
-- A job with dependencies comes with its parents' results, in the order of
-- depends_on (NULL for a parent that did not succeed or was pruned): no
-- second statement per batch. A plain job's depends_on is NULL: it reads
-- nothing.
SELECT c.*, CASE WHEN c.depends_on IS NOT NULL THEN (
        SELECT jsonb_agg(p.result ORDER BY u.place)
        FROM unnest(c.depends_on) WITH ORDINALITY AS u(id, place)
        LEFT JOIN pgqueue_jobs p ON p.id = u.id AND (p.state = 'succeeded') IS TRUE
    ) END AS parents
FROM claimed c ORDER BY priority DESC, run_at, id;

-- name: job_heartbeat
-- Extend the leases of many held jobs at once, only where the fencing token
-- still matches. Returns the ids whose lease is still held.
-- Like every statement that changes held jobs by id, it reaches each row by
-- its primary key whatever the statistics say, by two devices (see
-- docs/concepts.md "Plans that ignore statistics"):
-- * the batch's arrays are read through scalar subqueries, `(SELECT ...)`,
--   so the planner guesses a batch of 10 instead of counting it: a batch
--   counted at 1,000 made a hash join over the whole table look cheaper than
--   1,000 index probes;
-- * the state a held job must still be in comes from a one-row relation the
--   planner cannot fold (`expected`, kept apart by OFFSET 0), so it is a join
--   condition and not a filter on the table, which the planner would
--   estimate from the statistics: after an ANALYZE that saw no running job it
--   expected one row, put the table's scan outside a nested loop and matched
--   every outcome of the batch against every running job (2.5 s an ack).
UPDATE pgqueue_jobs j
SET lease_expires_at = now() + make_interval(secs => %(lease_seconds)s)
FROM unnest((SELECT %(ids)s::bigint[]), (SELECT %(tokens)s::bigint[])) AS held(id, token),
     (SELECT 'running'::text OFFSET 0) AS expected(state)
WHERE j.id = held.id AND j.lease_token = held.token AND j.state = expected.state
RETURNING j.id;

-- name: job_finish
-- Record the outcome of many attempts in one statement, each fenced by its
-- token: a worker whose lease was taken over matches no row. A success ends
-- the job; a failure retries it after a backoff, or ends it dead when it is
-- out of attempts or not retryable. Counts outcomes, and wakes waiters.
WITH outcome AS (
    -- Reached by primary key whatever the statistics say (job_heartbeat).
    SELECT * FROM unnest((SELECT %(ids)s::bigint[]), (SELECT %(tokens)s::bigint[]),
                         (SELECT %(succeeded)s::boolean[]), (SELECT %(results)s::jsonb[]),
                         (SELECT %(errors)s::text[]), (SELECT %(retryable)s::boolean[]))
         AS t(id, token, succeeded, result, error, retryable)
), finished AS (
    UPDATE pgqueue_jobs j
    SET state = CASE WHEN o.succeeded THEN 'succeeded'
                     WHEN o.retryable AND j.attempts < j.max_attempts THEN 'queued'
                     ELSE 'dead' END,
        result = CASE WHEN o.succeeded THEN o.result END,
        last_error = CASE WHEN o.succeeded THEN j.last_error ELSE o.error END,
        -- A failure's history is written with the failure (a success's
        -- errors stay as they are, NULL when none).
        errors = CASE WHEN o.succeeded THEN j.errors
                      ELSE pgqueue_errors_append(j.errors, j.attempts, o.error, j.worker) END,
        run_at = CASE WHEN NOT o.succeeded AND o.retryable AND j.attempts < j.max_attempts
                      THEN now() + pgqueue_backoff(j.attempts, %(backoff_base)s, %(backoff_cap)s)
                      ELSE j.run_at END,
        finished_at = CASE WHEN o.succeeded OR NOT o.retryable OR j.attempts >= j.max_attempts
                           THEN now() END,
        lease_expires_at = NULL
    FROM outcome o, (SELECT 'running'::text OFFSET 0) AS expected(state)
    WHERE j.id = o.id AND j.lease_token = o.token AND j.state = expected.state
    RETURNING j.id, j.queue, j.state, o.succeeded, j.has_dependents, j.batch_id
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
), released AS (
    -- The dependents of the jobs that ended (workflows): queued when their
    -- last dependency succeeded, or as their policy says when one died.
    -- Only rows with has_dependents reach it; a batch with none calls nothing.
    SELECT pgqueue_release(array_agg(id), array_agg(state = 'succeeded'))
    FROM finished WHERE has_dependents AND state <> 'queued'
    HAVING count(*) > 0
), batched AS (
    -- The batches of the jobs that ended count them; the last job of a
    -- closed batch enqueues its callbacks (migrations/0027). Only rows with
    -- a batch_id reach it; a batch of plain jobs calls nothing.
    SELECT pgqueue_batch_moved(array_agg(batch_id), array_agg('running'::text), array_agg(state))
    FROM finished WHERE batch_id IS NOT NULL AND state <> 'queued'
    HAVING count(*) > 0
)
SELECT id, state FROM finished, (SELECT count(*) FROM woken) w, (SELECT count(*) FROM released) r,
       (SELECT count(*) FROM batched) b;

-- name: job_snooze
-- Put held jobs back to queued because their handlers asked to run again
-- later (Snooze), each fenced by its token like job_finish. The attempt is
-- given back (the claim counted it), the job counts one more snooze, and the
-- queue's counters count a snooze, not a failure. run_at is now() plus the
-- delay asked for; jobs due at once are a hint to the workers of their queue.
-- An error (a task's exception retried without an attempt) becomes
-- last_error and joins the job's errors (under the attempt given back);
-- without one, both stay.
-- A separate statement, so that job_finish costs nothing more when nobody snoozes.
WITH request AS (
    -- Reached by primary key whatever the statistics say (job_heartbeat).
    SELECT * FROM unnest((SELECT %(ids)s::bigint[]), (SELECT %(tokens)s::bigint[]),
                         (SELECT %(seconds)s::double precision[]), (SELECT %(errors)s::text[]))
         AS t(id, token, seconds, error)
), snoozed AS (
    UPDATE pgqueue_jobs j
    SET state = 'queued', attempts = j.attempts - 1, snoozes = j.snoozes + 1,
        run_at = now() + make_interval(secs => r.seconds), lease_expires_at = NULL,
        last_error = coalesce(r.error, j.last_error),
        errors = CASE WHEN r.error IS NULL THEN j.errors
                      ELSE pgqueue_errors_append(j.errors, j.attempts, r.error, j.worker) END
    FROM request r, (SELECT 'running'::text OFFSET 0) AS expected(state)
    WHERE j.id = r.id AND j.lease_token = r.token AND j.state = expected.state
    RETURNING j.id, j.queue, j.state, j.run_at
), counted AS (
    INSERT INTO pgqueue_counters AS c (queue, shard, snoozed)
    SELECT queue, pg_backend_pid() %% 16, count(*)
    FROM snoozed GROUP BY 1, 2 ORDER BY 1, 2
    ON CONFLICT (queue, shard) DO UPDATE SET snoozed = c.snoozed + excluded.snoozed
), woken AS (
    SELECT pg_notify('pgqueue_jobs', queue)
    FROM (SELECT DISTINCT queue FROM snoozed WHERE run_at <= now()) q
)
SELECT id, state FROM snoozed, (SELECT count(*) FROM woken) w;

-- name: job_cancel_held
-- End held jobs as cancelled because their handlers asked to (CancelJob),
-- each fenced by its token: no retry, the reason in last_error. Counted as
-- cancelled, as an operator's cancel is (not as a failed attempt), and
-- waiters are woken as by job_finish.
WITH request AS (
    -- Reached by primary key whatever the statistics say (job_heartbeat).
    SELECT * FROM unnest((SELECT %(ids)s::bigint[]), (SELECT %(tokens)s::bigint[]),
                         (SELECT %(reasons)s::text[]))
         AS t(id, token, reason)
), cancelled AS (
    UPDATE pgqueue_jobs j
    SET state = 'cancelled', last_error = r.reason, finished_at = now(), lease_expires_at = NULL
    FROM request r, (SELECT 'running'::text OFFSET 0) AS expected(state)
    WHERE j.id = r.id AND j.lease_token = r.token AND j.state = expected.state
    RETURNING j.id, j.queue, j.state, j.has_dependents, j.batch_id
), counted AS (
    INSERT INTO pgqueue_counters AS c (queue, shard, cancelled)
    SELECT queue, pg_backend_pid() %% 16, count(*)
    FROM cancelled GROUP BY 1, 2 ORDER BY 1, 2
    ON CONFLICT (queue, shard) DO UPDATE SET cancelled = c.cancelled + excluded.cancelled
), woken AS (
    SELECT pgqueue_notify_ended(array_agg(id)) FROM cancelled WHERE %(notify_finished)s
), released AS (
    -- Their dependents follow their policies (as in job_finish).
    SELECT pgqueue_release(array_agg(id), array_agg(false))
    FROM cancelled WHERE has_dependents HAVING count(*) > 0
), batched AS (
    -- Their batches count them (as in job_finish).
    SELECT pgqueue_batch_moved(array_agg(batch_id), array_agg('running'::text), array_agg(state))
    FROM cancelled WHERE batch_id IS NOT NULL HAVING count(*) > 0
)
SELECT id, state FROM cancelled, (SELECT count(*) FROM woken) w, (SELECT count(*) FROM released) r,
       (SELECT count(*) FROM batched) b;

-- name: job_progress
-- Record the latest progress of many running jobs (job.progress(), written
-- by their worker at most once a second), each fenced by its token like
-- job_heartbeat: a report of an attempt that lost its lease matches no row.
-- The value is overwritten, no row per report. The jobs that someone waits
-- for (a registration in pgqueue_waits, kept: the end still needs it) are
-- notified on pgqueue_progress, their ids comma-separated, 300 per
-- notification as pgqueue_notify_ended does; jobs nobody waits for notify
-- nobody. Returns the ids written.
WITH report AS (
    -- Reached by primary key whatever the statistics say (job_heartbeat).
    SELECT * FROM unnest((SELECT %(ids)s::bigint[]), (SELECT %(tokens)s::bigint[]),
                         (SELECT %(fractions)s::double precision[]),
                         (SELECT %(infos)s::jsonb[]))
         AS t(id, token, fraction, info)
), reported AS (
    UPDATE pgqueue_jobs j
    SET progress_fraction = r.fraction, progress_info = r.info, progress_at = now()
    FROM report r, (SELECT 'running'::text OFFSET 0) AS expected(state)
    WHERE j.id = r.id AND j.lease_token = r.token AND j.state = expected.state
    RETURNING j.id
), waited AS (
    SELECT id, row_number() OVER (ORDER BY id) AS n
    FROM reported WHERE EXISTS (SELECT FROM pgqueue_waits w WHERE w.job_id = reported.id)
), woken AS (
    SELECT count(pg_notify('pgqueue_progress', chunk)) AS n
    FROM (SELECT string_agg(id::text, ',') AS chunk FROM waited GROUP BY (n - 1) / 300) chunks
)
SELECT id FROM reported, woken;

-- name: job_steps
-- The steps a job's handlers completed (job.step()), read once by each
-- attempt, at its first step: name and result.
SELECT name, result FROM pgqueue_job_steps WHERE job_id = %(id)s;

-- name: job_step_record
-- Store a completed step's result, fenced by the attempt's token: nothing
-- is stored (no row returned) unless the job is running with `token`.
-- FOR SHARE makes the fence hold against a claim in flight: a claim that
-- gives the job a new token waits for this insert to commit (so the new
-- attempt's read of the steps sees it), and an insert that comes after
-- such a claim reads the new token, and stores nothing.
-- Its commit does not wait for the WAL flush (synchronous_commit off for
-- this statement's transaction only, `quick`): a step is at least once
-- (core/steps.py), and what a crash of the server (not of the worker) can
-- lose is the last fraction of a second of steps, which run again; any
-- later commit that waits (the job's ack, another attempt's claim)
-- flushes them first. Ten steps of a handler then cost ten round trips,
-- not ten disk flushes.
INSERT INTO pgqueue_job_steps (job_id, name, result)
SELECT j.id, %(name)s, %(result)s::jsonb
FROM pgqueue_jobs j, (SELECT set_config('synchronous_commit', 'off', true)) AS quick
WHERE j.id = %(id)s AND j.lease_token = %(token)s AND j.state = 'running'
FOR SHARE OF j
RETURNING job_id;

-- name: job_checkpoint
-- Overwrite a running job's checkpoint (job.checkpoint()), fenced by the
-- attempt's token like job_progress; returns the id if written. Its commit
-- does not wait for the WAL flush, as job_step_record's.
UPDATE pgqueue_jobs
SET last_checkpoint = %(value)s::jsonb
FROM (SELECT set_config('synchronous_commit', 'off', true)) AS quick
WHERE id = %(id)s AND lease_token = %(token)s AND state = 'running'
RETURNING id;

-- name: job_sealed_page
-- A key rotation's next page (core/sealing.py): the jobs after `after`, by
-- id (the primary key's order), whose payload is sealed with another key
-- than `primary`. Any state: a finished job's payload is at rest too.
SELECT id, payload
FROM pgqueue_jobs
WHERE id > %(after)s AND payload ? 'pgqueue:sealed'
  AND payload ->> 'key' IS DISTINCT FROM %(primary)s
ORDER BY id
LIMIT %(limit)s;

-- name: job_reseal
-- Store a rotation page's payloads sealed again with `primary`; a row
-- resealed meanwhile (another rotation) is left as it is. Returns the ids
-- written.
UPDATE pgqueue_jobs AS j
SET payload = v.payload
FROM unnest(%(ids)s::bigint[], %(payloads)s::jsonb[]) AS v(id, payload)
WHERE j.id = v.id AND j.payload ->> 'key' IS DISTINCT FROM %(primary)s
RETURNING j.id;

-- name: job_sleep
-- A handler's durable sleep (job.sleep(), job.sleep_until()), fenced by
-- the attempt's token (FOR NO KEY UPDATE: a claim or cancel in flight waits
-- for it, as for job_step_record). The first call stores the wake time
-- (`until`, or now() + `seconds`: the database clock) as the job's step
-- `name`; a later attempt's call finds it and keeps it. While the wake time
-- is ahead, the job goes back to queued until then, in this same
-- statement: the attempt given back (as a snooze gives it back), the lease
-- ended; not one of the job's snoozes (max_snoozes does not bound sleeps),
-- though the queue's counters count it as snoozed. Returns the wake time
-- and whether the job went to sleep; no row for a stale attempt.
WITH job AS (
    -- Reached by primary key whatever the statistics say (job_heartbeat):
    -- the state, hidden from the planner, cannot pick the partial index
    -- of running jobs.
    SELECT j.id FROM pgqueue_jobs j, (SELECT 'running'::text OFFSET 0) AS expected(state)
    WHERE j.id = %(id)s AND j.lease_token = %(token)s AND j.state = expected.state
    FOR NO KEY UPDATE OF j
), stored AS (
    INSERT INTO pgqueue_job_steps (job_id, name, result)
    SELECT id, %(name)s, jsonb_build_object('wake_at', coalesce(
        %(until)s::timestamptz, now() + make_interval(secs => %(seconds)s::double precision)))
    FROM job
    ON CONFLICT (job_id, name) DO NOTHING
    RETURNING result
), wake AS (
    -- The wake time stored now, or by an earlier attempt (this statement's
    -- snapshot sees that row; the insert above then did nothing).
    SELECT (coalesce((SELECT result FROM stored),
                     (SELECT s.result FROM pgqueue_job_steps s
                      WHERE s.job_id = %(id)s AND s.name = %(name)s)) ->> 'wake_at')::timestamptz
           AS at
    FROM job
), slept AS (
    UPDATE pgqueue_jobs j
    SET state = 'queued', attempts = j.attempts - 1, run_at = w.at, lease_expires_at = NULL
    FROM wake w
    WHERE j.id = %(id)s AND w.at > now()
    RETURNING j.queue
), counted AS (
    INSERT INTO pgqueue_counters AS c (queue, shard, snoozed)
    SELECT queue, pg_backend_pid() %% 16, 1 FROM slept
    ON CONFLICT (queue, shard) DO UPDATE SET snoozed = c.snoozed + 1
)
SELECT w.at AS wake_at, (SELECT count(*) FROM slept) > 0 AS asleep FROM wake w;

-- name: job_lock_running
-- Lock a running job's row, fenced by the attempt's token, for the rest of
-- the transaction (job.wait_for_signal(): the wait's job_signal_wait
-- follows, and a signal sent meanwhile waits for both; see job_signal).
-- Returns the id, or nothing for a stale attempt.
-- Reached by primary key whatever the statistics say (job_sleep).
SELECT j.id FROM pgqueue_jobs j, (SELECT 'running'::text OFFSET 0) AS expected(state)
WHERE j.id = %(id)s AND j.lease_token = %(token)s AND j.state = expected.state
FOR NO KEY UPDATE OF j;

-- name: job_signal_wait
-- A handler's wait for the signal `signal` (job.wait_for_signal()), after
-- job_lock_running in the same transaction. The wait is the job's step
-- `name`: stored on the first call with its deadline (now() + `timeout`:
-- the database clock, so that a later attempt does not move it), and with
-- its outcome once decided: "received" (the oldest signal of that name
-- not consumed, deleted here: consumed once, as its payload is stored) or
-- "timed_out" (the deadline passed first). A decided wait stays decided for
-- every later attempt. Undecided, the job goes back to queued until the
-- deadline, as job_sleep puts it to sleep; job_signal wakes it sooner.
-- Returns the wait's step result.
WITH prior AS (
    SELECT result FROM pgqueue_job_steps WHERE job_id = %(id)s AND name = %(name)s
), taken AS (
    DELETE FROM pgqueue_job_signals s
    WHERE s.job_id = %(id)s AND s.name = %(signal)s
      AND s.id = (SELECT min(o.id) FROM pgqueue_job_signals o
                  WHERE o.job_id = %(id)s AND o.name = %(signal)s)
      AND NOT EXISTS (SELECT FROM prior WHERE result ? 'outcome')
    RETURNING s.payload
), wait AS (
    SELECT coalesce((SELECT result FROM prior),
                    jsonb_build_object('signal', %(signal)s::text, 'deadline',
                                       now() + make_interval(secs => %(timeout)s::double precision)))
           AS result
), decided AS (
    SELECT CASE
        WHEN w.result ? 'outcome' THEN w.result
        WHEN EXISTS (SELECT FROM taken)
            THEN w.result || jsonb_build_object('outcome', 'received',
                                                'payload', (SELECT payload FROM taken))
        WHEN (w.result ->> 'deadline')::timestamptz <= now()
            THEN w.result || jsonb_build_object('outcome', 'timed_out')
        ELSE w.result END AS result
    FROM wait w
), stored AS (
    INSERT INTO pgqueue_job_steps (job_id, name, result)
    SELECT %(id)s, %(name)s, result FROM decided
    ON CONFLICT (job_id, name) DO UPDATE SET result = excluded.result
    WHERE pgqueue_job_steps.result IS DISTINCT FROM excluded.result
), slept AS (
    UPDATE pgqueue_jobs j
    SET state = 'queued', attempts = j.attempts - 1,
        run_at = (d.result ->> 'deadline')::timestamptz, lease_expires_at = NULL
    FROM decided d, (SELECT 'running'::text OFFSET 0) AS expected(state)
    WHERE j.id = %(id)s AND j.lease_token = %(token)s AND j.state = expected.state
      AND NOT d.result ? 'outcome'
    RETURNING j.queue
), counted AS (
    INSERT INTO pgqueue_counters AS c (queue, shard, snoozed)
    SELECT queue, pg_backend_pid() %% 16, 1 FROM slept
    ON CONFLICT (queue, shard) DO UPDATE SET snoozed = c.snoozed + 1
)
SELECT d.result, (SELECT count(*) FROM slept) > 0 AS asleep FROM decided d;

-- name: job_signal_lock
-- Lock a job's row for a signal sent to it (Queue.signal()), for the rest
-- of the transaction, and return its state (nothing: no such job). Taken
-- before job_signal looks at the job, so that a wait deciding at the same
-- moment (job_lock_running, then job_signal_wait) is wholly before or
-- wholly after it: either the wait consumes the signal, or the signal
-- finds the job asleep for it and wakes it. Never both missing each other.
SELECT state FROM pgqueue_jobs WHERE id = %(id)s FOR NO KEY UPDATE;

-- name: job_signal
-- Store a signal for a job (after job_signal_lock, which found it not
-- finished); if the job is asleep waiting for a signal of that name (an
-- undecided wait step, job_signal_wait), it runs now: run_at now(), and
-- its queue's workers are told. Returns whether it was woken.
WITH sent AS (
    INSERT INTO pgqueue_job_signals (job_id, name, payload)
    VALUES (%(id)s, %(name)s, %(payload)s::jsonb)
), woken AS (
    -- By primary key: the state is compared with a value the planner does
    -- not see, so that no partial index of queued jobs can serve (on
    -- PostgreSQL 15, with statistics that saw few queued jobs, it planned a
    -- walk of pgqueue_jobs_claim_queue for the job).
    UPDATE pgqueue_jobs j
    SET run_at = now()
    WHERE j.id = %(id)s AND j.state = (SELECT 'queued'::text) AND j.run_at > now()
      AND EXISTS (
          SELECT FROM pgqueue_job_steps s
          WHERE s.job_id = %(id)s AND s.name LIKE 'pgqueue:wait:%%'
            AND s.result ->> 'signal' = %(name)s AND NOT s.result ? 'outcome')
    RETURNING j.queue
), notified AS (
    SELECT pg_notify('pgqueue_jobs', queue) FROM woken
)
SELECT (SELECT count(*) FROM woken) > 0 AS woken, (SELECT count(*) FROM notified) AS n;

-- name: job_release
-- Give back claimed jobs that never started (a stopping worker's prefetched
-- jobs), each fenced by its token: queued again at once in their old place
-- (run_at unchanged), the attempt the claim counted given back, the lease
-- ended. Not a failure, so nothing is counted; their queues' workers are woken.
WITH released AS (
    UPDATE pgqueue_jobs j
    SET state = 'queued', attempts = j.attempts - 1, lease_expires_at = NULL
    -- Reached by primary key whatever the statistics say (job_heartbeat).
    FROM unnest((SELECT %(ids)s::bigint[]), (SELECT %(tokens)s::bigint[])) AS r(id, token),
         (SELECT 'running'::text OFFSET 0) AS expected(state)
    WHERE j.id = r.id AND j.lease_token = r.token AND j.state = expected.state
    RETURNING j.id, j.queue
), woken AS (
    SELECT pg_notify('pgqueue_jobs', queue) FROM (SELECT DISTINCT queue FROM released) q
)
SELECT id FROM released, (SELECT count(*) FROM woken) w;

-- name: job_reap
-- Take back up to `limit` jobs whose lease expired (their worker died or
-- stalled), or was ended by worker_reap_dead (their worker's session
-- ended: 'epoch', taken first). An expired lease is a failed attempt:
-- back to queued after the same backoff as any failure, or dead when out of
-- attempts. Rows another reaper is handling are skipped, so every worker
-- may run this at once.
WITH expired AS (
    -- Earliest first, through pgqueue_jobs_reap whatever the statistics say
    -- (migrations/0017).
    SELECT id, error FROM pgqueue_expired_leases(%(limit)s)
), reaped AS (
    UPDATE pgqueue_jobs j
    SET state = CASE WHEN j.attempts < j.max_attempts THEN 'queued' ELSE 'dead' END,
        run_at = CASE WHEN j.attempts < j.max_attempts
                      THEN now() + pgqueue_backoff(j.attempts, %(backoff_base)s, %(backoff_cap)s)
                      ELSE j.run_at END,
        finished_at = CASE WHEN j.attempts < j.max_attempts THEN NULL ELSE now() END,
        last_error = expired.error,
        errors = pgqueue_errors_append(j.errors, j.attempts, expired.error, j.worker),
        lease_expires_at = NULL
    FROM expired WHERE j.id = expired.id
    RETURNING j.id, j.queue, j.state, j.has_dependents, j.batch_id
), counted AS (
    INSERT INTO pgqueue_counters AS c (queue, shard, failed, dead)
    SELECT queue, pg_backend_pid() %% 16, count(*), count(*) FILTER (WHERE state = 'dead')
    FROM reaped GROUP BY 1, 2 ORDER BY 1, 2
    ON CONFLICT (queue, shard) DO UPDATE
    SET failed = c.failed + excluded.failed, dead = c.dead + excluded.dead
), woken AS (
    -- A job reaped dead has ended: its waiters learn it, as in job_finish.
    SELECT pgqueue_notify_ended(array_agg(id)) FROM reaped WHERE state = 'dead'
), released AS (
    -- The dependents of a job reaped dead follow their policies (as in job_finish).
    SELECT pgqueue_release(array_agg(id), array_agg(false))
    FROM reaped WHERE state = 'dead' AND has_dependents HAVING count(*) > 0
), batched AS (
    -- The batches of the jobs reaped dead count them (as in job_finish).
    SELECT pgqueue_batch_moved(array_agg(batch_id), array_agg('running'::text), array_agg(state))
    FROM reaped WHERE state = 'dead' AND batch_id IS NOT NULL HAVING count(*) > 0
)
SELECT id, state FROM reaped, (SELECT count(*) FROM woken) w, (SELECT count(*) FROM released) r,
       (SELECT count(*) FROM batched) b;

-- name: job_cancel
-- Cancel a waiting, queued or running job; a running job's lease is
-- revoked, so its worker's ack matches nothing, and its worker is told at
-- commit (pgqueue_notify_cancelled) to stop the handler. Its dependents
-- follow their policies (as in job_finish).
WITH picked AS (
    -- Locked first, to know the state it is cancelled from (RETURNING
    -- gives the new one): a claim that committed meanwhile is seen.
    SELECT id, state FROM pgqueue_jobs
    WHERE id = %(id)s AND state IN ('waiting', 'queued', 'running')
    FOR NO KEY UPDATE
), cancelled AS (
    UPDATE pgqueue_jobs j
    SET state = 'cancelled', finished_at = now(), lease_expires_at = NULL
    FROM picked p
    WHERE j.id = p.id AND j.state IN ('waiting', 'queued', 'running')
    RETURNING j.*
), counted AS (
    INSERT INTO pgqueue_counters AS c (queue, shard, cancelled)
    SELECT queue, pg_backend_pid() %% 16, 1 FROM cancelled
    ON CONFLICT (queue, shard) DO UPDATE SET cancelled = c.cancelled + 1
), woken AS (
    SELECT pgqueue_notify_ended(array_agg(id)) FROM cancelled
), stopped AS (
    SELECT pgqueue_notify_cancelled(array_agg(c.id), array_agg(c.lease_token))
    FROM cancelled c JOIN picked p ON p.id = c.id WHERE p.state = 'running'
    HAVING count(*) > 0
), released AS (
    SELECT pgqueue_release(array_agg(id), array_agg(false))
    FROM cancelled WHERE has_dependents HAVING count(*) > 0
), batched AS (
    -- Its batch counts it (as in job_finish).
    SELECT pgqueue_batch_moved(array_agg(c.batch_id), array_agg(p.state), array_agg(c.state))
    FROM cancelled c JOIN picked p ON p.id = c.id WHERE c.batch_id IS NOT NULL
    HAVING count(*) > 0
)
SELECT cancelled.* FROM cancelled, (SELECT count(*) FROM woken) w,
       (SELECT count(*) FROM stopped) s, (SELECT count(*) FROM released) r,
       (SELECT count(*) FROM batched) b;

-- name: job_retry
-- Put a dead or cancelled job back to queued with a fresh budget of attempts
-- and snoozes.
-- Nothing when that would make it hold a key another job holds now (the
-- flow then says which job).
-- A job of a batch that has not finished counts in it as not ended again.
WITH picked AS (
    -- Locked first, to know the state it is retried from.
    SELECT id, state FROM pgqueue_jobs
    WHERE id = %(id)s AND state IN ('dead', 'cancelled')
    FOR NO KEY UPDATE
), retried AS (
    UPDATE pgqueue_jobs j
    SET state = 'queued', attempts = 0, snoozes = 0, run_at = now(), finished_at = NULL,
        started_at = NULL, result = NULL, lease_token = NULL, worker = NULL
    FROM picked p
    WHERE j.id = p.id AND j.state IN ('dead', 'cancelled')
      AND NOT EXISTS (
          SELECT 1 FROM pgqueue_jobs o
          WHERE o.idempotency_key = j.idempotency_key AND o.id <> j.id
            AND pgqueue_key_held(o.unique_scope, o.state, o.started_at))
    RETURNING j.*, p.state AS was
), woken AS (
    SELECT pg_notify('pgqueue_jobs', queue) FROM retried
), batched AS (
    SELECT pgqueue_batch_moved(array_agg(batch_id), array_agg(was), array_agg(state))
    FROM retried WHERE batch_id IS NOT NULL HAVING count(*) > 0
)
SELECT retried.* FROM retried, (SELECT count(*) FROM woken) w, (SELECT count(*) FROM batched) b;

-- fragment: job_filter
-- The filters that the job listings and the bulk actions share (the
-- library's list_jobs and JobFilter, GET /jobs, POST /jobs/bulk/*, the
-- CLI's jobs list and bulk commands), each off when its parameter is NULL.
      AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
      AND (%(task)s::text IS NULL OR task = %(task)s::text)
      AND (%(error_contains)s::text IS NULL OR strpos(last_error, %(error_contains)s::text) > 0)
      AND (%(error_kind)s::text IS NULL OR pgqueue_error_kind(last_error) = %(error_kind)s::text)

-- fragment: job_list_page
-- The rest of a listing's filter (job_list, job_list_summary: each branch),
-- then its page: the newest `limit` matches before the cursor `before_id`.
      AND (%(payload_contains)s::jsonb IS NULL OR payload @> %(payload_contains)s::jsonb)
      AND (%(metadata_contains)s::jsonb IS NULL OR metadata @> %(metadata_contains)s::jsonb)
      AND (%(before_id)s::bigint IS NULL OR id < %(before_id)s::bigint)
    ORDER BY id DESC
    LIMIT %(limit)s

-- fragment: job_summary_columns
-- job_list_summary's columns: all but the heavy ones.
    SELECT id, queue, task, priority, state, run_at, attempts, max_attempts, snoozes,
           timeout_seconds, idempotency_key, unique_scope, concurrency_key, worker,
           lease_expires_at,
           enqueued_at, started_at, finished_at, workflow_id, depends_on,
           progress_fraction, progress_at, batch_id

-- name: job_bulk_cancel
-- One batch of a bulk cancel: up to `limit` waiting, queued or running jobs (of
-- `states`) that match the filter; with `dry_run`, how many match (no
-- limit), and nothing else. As job_cancel: a running job's lease is
-- revoked, so its worker's ack matches nothing, and its worker is told. The flow repeats it until a
-- batch cancels nothing. Only jobs enqueued by `started_at` (the database's
-- now() when the action began) match, so that a producer still flooding the
-- queue cannot keep it going.
WITH candidate AS (
    -- One branch per partial index (the planner cannot match "state IN
    -- (...)" to one); a branch whose state is not in `states` is a one-time
    -- false filter, so it reads nothing.
    SELECT id, queue, task, enqueued_at, last_error FROM pgqueue_jobs
    WHERE state = 'queued' AND 'queued' = ANY(%(states)s::text[])
    UNION ALL
    SELECT id, queue, task, enqueued_at, last_error FROM pgqueue_jobs
    WHERE state = 'running' AND 'running' = ANY(%(states)s::text[])
    UNION ALL
    SELECT id, queue, task, enqueued_at, last_error FROM pgqueue_jobs
    WHERE state = 'waiting' AND 'waiting' = ANY(%(states)s::text[])
), matching AS (
    -- The filter, written once: the planner pushes it into each branch.
    SELECT id FROM candidate
    WHERE enqueued_at <= %(started_at)s::timestamptz
      AND (%(enqueued_before)s::timestamptz IS NULL
           OR enqueued_at < %(enqueued_before)s::timestamptz)
    --> job_filter
      AND (%(ids)s::bigint[] IS NULL OR id = ANY(%(ids)s::bigint[]))
    LIMIT %(limit)s
), picked AS (
    -- Rows a worker or another statement holds are skipped, not waited for:
    -- a batch neither waits for nor deadlocks with a claim or an ack. A
    -- later batch finds them again.
    -- Its state as locked (the newest): the one it is cancelled from.
    SELECT j.id, j.state FROM pgqueue_jobs j JOIN matching m ON m.id = j.id
    WHERE NOT %(dry_run)s
    FOR UPDATE OF j SKIP LOCKED
), cancelled AS (
    -- The state again: a row claimed after the batch's snapshot is judged
    -- as it is now.
    UPDATE pgqueue_jobs j
    SET state = 'cancelled', finished_at = now(), lease_expires_at = NULL
    FROM picked p
    WHERE j.id = p.id AND j.state = ANY(%(states)s::text[])
    RETURNING j.id, j.queue, j.has_dependents, j.lease_token, p.state = 'running' AS was_running,
              j.batch_id, p.state AS was
), counted AS (
    INSERT INTO pgqueue_counters AS c (queue, shard, cancelled)
    SELECT queue, pg_backend_pid() %% 16, count(*) FROM cancelled GROUP BY 1, 2 ORDER BY 1, 2
    ON CONFLICT (queue, shard) DO UPDATE SET cancelled = c.cancelled + excluded.cancelled
), ended AS (
    SELECT pgqueue_notify_ended(array_agg(id)) FROM cancelled
), stopped AS (
    -- Their workers stop the handlers of the running ones (as in job_cancel).
    SELECT pgqueue_notify_cancelled(array_agg(id), array_agg(lease_token))
    FROM cancelled WHERE was_running HAVING count(*) > 0
), released AS (
    -- Dependents follow their policies (as in job_finish).
    SELECT pgqueue_release(array_agg(id), array_agg(false))
    FROM cancelled WHERE has_dependents HAVING count(*) > 0
), batched AS (
    -- Their batches count them (as in job_finish).
    SELECT pgqueue_batch_moved(array_agg(batch_id), array_agg(was), array_agg('cancelled'::text))
    FROM cancelled WHERE batch_id IS NOT NULL HAVING count(*) > 0
)
SELECT (SELECT count(*) FROM matching) AS matched, (SELECT count(*) FROM cancelled) AS affected
FROM (SELECT count(*) FROM ended) e, (SELECT count(*) FROM stopped) s,
     (SELECT count(*) FROM released) r, (SELECT count(*) FROM batched) b;

-- name: job_bulk_finished
-- One batch of a bulk retry or delete (`action`) of finished jobs (of
-- `states`) that match the filter; with `dry_run`, how many match (no
-- limit), and nothing else.
--   retry   back to queued with a fresh attempt budget (as job_retry); a job
--           whose key another job holds now is left as it is
--   delete  the rows go, their steps too; the counters keep their outcomes (as job_prune)
-- Jobs go in finished order after the keyset cursor (`after_at`,
-- `after_id`: the last job of the previous batch), so that a batch never
-- reads again the finished history that did not match. Only jobs finished
-- by `started_at` match, so that a retried job that dies again is not
-- retried again.
WITH matching AS (
    SELECT id, finished_at FROM pgqueue_jobs
    WHERE state IN ('succeeded', 'dead', 'cancelled') AND state = ANY(%(states)s::text[])
      AND finished_at <= %(started_at)s::timestamptz
      AND finished_at >= coalesce(%(after_at)s::timestamptz, '-infinity')
      AND (finished_at > %(after_at)s::timestamptz OR id > %(after_id)s::bigint
           OR %(after_at)s::timestamptz IS NULL)
      AND (%(enqueued_before)s::timestamptz IS NULL
           OR enqueued_at < %(enqueued_before)s::timestamptz)
      AND (%(finished_before)s::timestamptz IS NULL
           OR finished_at < %(finished_before)s::timestamptz)
    --> job_filter
      AND (%(ids)s::bigint[] IS NULL OR id = ANY(%(ids)s::bigint[]))
    ORDER BY finished_at, id
    LIMIT %(limit)s
), picked AS (
    -- Skipped, not waited for, when another statement holds them (a pruner,
    -- another action).
    SELECT j.id, j.idempotency_key, j.state FROM pgqueue_jobs j JOIN matching m ON m.id = j.id
    WHERE NOT %(dry_run)s
    FOR UPDATE OF j SKIP LOCKED
), retried AS (
    UPDATE pgqueue_jobs j
    SET state = 'queued', attempts = 0, snoozes = 0, run_at = now(), finished_at = NULL,
        started_at = NULL, result = NULL, lease_token = NULL, worker = NULL
    FROM (
        -- One job per key, so that two retried jobs never both take one.
        SELECT DISTINCT ON (p.idempotency_key, CASE WHEN p.idempotency_key IS NULL THEN p.id END)
               p.id, p.state
        FROM picked p
        WHERE %(action)s::text = 'retry'
          AND NOT EXISTS (
              SELECT 1 FROM pgqueue_jobs o
              WHERE o.idempotency_key = p.idempotency_key AND o.id <> p.id
                AND pgqueue_key_held(o.unique_scope, o.state, o.started_at))
        ORDER BY p.idempotency_key, CASE WHEN p.idempotency_key IS NULL THEN p.id END, p.id
    ) r
    WHERE j.id = r.id AND j.state = ANY(%(states)s::text[])
    RETURNING j.id, j.queue, j.batch_id, r.state AS was
), deleted AS (
    DELETE FROM pgqueue_jobs j USING picked p
    WHERE %(action)s::text = 'delete' AND j.id = p.id AND j.state = ANY(%(states)s::text[])
    RETURNING j.id
), steps_deleted AS (
    DELETE FROM pgqueue_job_steps s USING deleted d WHERE s.job_id = d.id
), signals_deleted AS (
    DELETE FROM pgqueue_job_signals s USING deleted d WHERE s.job_id = d.id
), ready AS (
    SELECT pg_notify('pgqueue_jobs', queue) FROM (SELECT DISTINCT queue FROM retried) q
), batched AS (
    -- A retried job of a batch that has not finished counts in it as not
    -- ended again (as in job_retry); a deleted one stays counted as it ended.
    SELECT pgqueue_batch_moved(array_agg(batch_id), array_agg(was), array_agg('queued'::text))
    FROM retried WHERE batch_id IS NOT NULL HAVING count(*) > 0
)
SELECT (SELECT count(*) FROM matching) AS matched,
       (SELECT count(*) FROM retried) + (SELECT count(*) FROM deleted) AS affected,
       last.finished_at AS last_at, last.id AS last_id
FROM (SELECT count(*) FROM ready) r, (SELECT count(*) FROM batched) b
LEFT JOIN (SELECT finished_at, id FROM matching ORDER BY finished_at DESC, id DESC LIMIT 1) last
    ON true;

-- name: job_bulk_archived
-- The archive's part of a bulk delete (job_bulk_finished walks the hot
-- table): up to `limit` archived jobs (succeeded ones, migration 0034) that
-- match the filter, in id order after `after_id`, deleted; with `dry_run`,
-- how many match (no limit), and nothing else. An archived row is never
-- updated, so none is locked: one taken back meanwhile (job_unarchive) is
-- found gone. It has no steps or signals left (job_archive deleted them),
-- and its outcome stays counted, as job_prune's do. The partitions are
-- pruned by `finished_before` when given.
WITH matching AS (
    SELECT id, finished_at FROM pgqueue_jobs_archive
    WHERE 'succeeded' = ANY(%(states)s::text[])
      AND finished_at <= %(started_at)s::timestamptz
      AND id > coalesce(%(after_id)s::bigint, 0)
      AND (%(enqueued_before)s::timestamptz IS NULL
           OR enqueued_at < %(enqueued_before)s::timestamptz)
      AND (%(finished_before)s::timestamptz IS NULL
           OR finished_at < %(finished_before)s::timestamptz)
    --> job_filter
      AND (%(ids)s::bigint[] IS NULL OR id = ANY(%(ids)s::bigint[]))
    ORDER BY id
    LIMIT %(limit)s
), deleted AS (
    DELETE FROM pgqueue_jobs_archive a USING matching m
    WHERE NOT %(dry_run)s AND a.id = m.id AND a.finished_at = m.finished_at
    RETURNING a.id
)
SELECT (SELECT count(*) FROM matching) AS matched, (SELECT count(*) FROM deleted) AS affected,
       NULL::timestamptz AS last_at, (SELECT max(id) FROM matching) AS last_id;

-- name: job_get
-- One job by id: in the hot table, else in the archive (migration 0034).
-- The archive is read only when the hot table has no such row (a one-time
-- filter), so a live job's read never probes its partitions; one snapshot
-- sees a job in exactly one of the two.
WITH hot AS (
    SELECT * FROM pgqueue_jobs WHERE id = %(id)s
)
SELECT * FROM hot
UNION ALL
SELECT * FROM pgqueue_jobs_archive WHERE id = %(id)s AND NOT EXISTS (SELECT FROM hot);

-- name: job_dependents
-- The jobs that wait (or waited) for one job: the edges out of it, a range
-- of pgqueue_job_deps' primary key (migration 0011). One row when the job
-- exists (its dependents, the first `limit` by id), none otherwise.
-- An archived job counts as existing (it has no dependents: a job given one
-- is taken back from the archive first, job_unarchive).
SELECT j.id,
       ARRAY(SELECT d.child FROM pgqueue_job_deps d WHERE d.parent = j.id
             ORDER BY d.child LIMIT %(limit)s) AS dependents
FROM (SELECT id FROM pgqueue_jobs WHERE id = %(id)s
      UNION ALL
      SELECT id FROM pgqueue_jobs_archive WHERE id = %(id)s) j;

-- name: job_watch
-- One job by id, as job_get reads it, for wait(): unless it has ended, its
-- waiter is registered (until `seconds` from now), so that the statement
-- that ends it notifies pgqueue_finished (pgqueue_notify_ended, migration
-- 0015); other jobs' ends notify nobody. An archived job (ended) is read
-- as job_get reads it.
WITH hot AS (
    SELECT * FROM pgqueue_jobs WHERE id = %(id)s
), job AS (
    SELECT * FROM hot
    UNION ALL
    SELECT * FROM pgqueue_jobs_archive WHERE id = %(id)s AND NOT EXISTS (SELECT FROM hot)
), watched AS (
    INSERT INTO pgqueue_waits (job_id, until)
    SELECT id, now() + make_interval(secs => %(seconds)s) FROM job
    WHERE state NOT IN ('succeeded', 'dead', 'cancelled')
)
SELECT * FROM job;

-- name: wait_prune
-- Registrations of waiters (job_watch) past their timeout: the waiter gave
-- up or died before its job ended.
DELETE FROM pgqueue_waits WHERE until < now();

-- name: job_list
-- Jobs newest first, filtered, after a keyset cursor (the last id seen):
-- a walk down the primary key that stops after `limit` matches, so a page
-- costs the same on page 1 and page 20,000 (no OFFSET). `scheduled` and
-- `retrying` narrow queued jobs to those waiting for a future run_at, and to
-- those that failed before (transitions.list_filters). Archived jobs
-- (migration 0034) come in the same order: each table's branch stops after
-- `limit` matches (the archive's is a Merge Append of its partitions' id
-- indexes), and the archive's is not read at all (a one-time filter) for
-- a state it never holds.
(
    SELECT * FROM pgqueue_jobs
    WHERE (%(state)s::text IS NULL OR state = %(state)s::text)
      AND (NOT %(scheduled)s OR run_at > now())
      AND (NOT %(retrying)s OR attempts > 0)
    --> job_filter
    --> job_list_page
)
UNION ALL (
    SELECT * FROM pgqueue_jobs_archive
    -- The archive holds ended jobs only: for another state this branch
    -- reads nothing.
    WHERE (%(state)s::text IS NULL OR %(state)s::text IN ('succeeded', 'dead', 'cancelled'))
      AND NOT %(scheduled)s AND NOT %(retrying)s
      AND (%(state)s::text IS NULL OR state = %(state)s::text)
    --> job_filter
    --> job_list_page
)
ORDER BY id DESC
LIMIT %(limit)s;

-- name: job_list_summary
-- Like job_list, without the heavy columns (payload, result, last_error,
-- progress_info): what a listing that polls needs, without reading large
-- values. The archive as in job_list.
(
    --> job_summary_columns
    FROM pgqueue_jobs
    WHERE (%(state)s::text IS NULL OR state = %(state)s::text)
      AND (NOT %(scheduled)s OR run_at > now())
      AND (NOT %(retrying)s OR attempts > 0)
    --> job_filter
    --> job_list_page
)
UNION ALL (
    --> job_summary_columns
    FROM pgqueue_jobs_archive
    -- The archive holds ended jobs only: for another state this branch
    -- reads nothing.
    WHERE (%(state)s::text IS NULL OR %(state)s::text IN ('succeeded', 'dead', 'cancelled'))
      AND NOT %(scheduled)s AND NOT %(retrying)s
      AND (%(state)s::text IS NULL OR state = %(state)s::text)
    --> job_filter
    --> job_list_page
)
ORDER BY id DESC
LIMIT %(limit)s;

-- name: job_dead_groups
-- Dead jobs by task and the kind of their last error (pgqueue_error_kind:
-- its first line, ids and numbers replaced), the biggest group first: the dashboard's dead letters
-- (bulk.dead_letters). Bounded: the newest `scan` dead jobs are read, through
-- the index of finished jobs, and `limit` groups returned; `scanned` and
-- `group_count` say how many jobs and groups there were before the limit.
SELECT task, error, count(*)::bigint AS jobs,
       array_agg(DISTINCT queue ORDER BY queue) AS queues,
       min(finished_at) AS first_at, max(finished_at) AS last_at, max(id) AS latest_id,
       sum(count(*)) OVER ()::bigint AS scanned, count(*) OVER ()::bigint AS group_count
FROM (
    SELECT task, queue, finished_at, id,
           pgqueue_error_kind(last_error) AS error
    FROM pgqueue_jobs
    WHERE state = 'dead'
    ORDER BY finished_at DESC
    LIMIT %(scan)s
) newest
GROUP BY task, error
ORDER BY jobs DESC, last_at DESC, task, error
LIMIT %(limit)s;

-- name: job_age_priorities
-- Priority aging (maintenance, every half priority_aging_seconds): raise by
-- one the priority of up to `limit` queued jobs of negative priority that
-- became runnable, or took their last step, `aging_seconds` ago or more;
-- up to 0. Through pgqueue_jobs_aging, oldest first, whatever the server's
-- costs and version (pgqueue_age_priorities, migrations 0043, 0044); rows another
-- transaction holds (a claim) are skipped, and a row that changed meanwhile
-- (started, or aged by another worker) is checked again and left. Every
-- worker runs it: a job takes one step per interval whichever does.
-- Returns the ids raised.
SELECT id FROM pgqueue_age_priorities(%(aging_seconds)s::double precision, %(limit)s::integer);

-- name: job_prune
-- Delete up to `limit` finished jobs older than the retention period. The
-- counters already hold their outcomes, so metrics do not move. The edges
-- from pruned jobs to their dependents go too (only for jobs that have
-- some: a plain job's prune does not look at the edges), and so does the
-- row of a workflow whose last job this prunes. Batches finished before the
-- retention period go too, up to `limit` (pgqueue_batches_finished).
-- The statement is pgqueue_prune's (migration 0045), planned without
-- sequential or bitmap scans and sorts whatever the statistics say.
SELECT pgqueue_prune(%(retention_seconds)s::double precision, %(limit)s::integer) AS pruned;

-- name: job_archive_partitions
-- The archive's day partitions (migration 0034) for every day a job the
-- next job_archive may move finished on, up to tomorrow (a round of moves
-- that runs past midnight finds the new day's): run in a transaction of its
-- own before the moves (creating a partition takes the archive's lock for a
-- moment). The oldest such job is found in pgqueue_jobs_finished from
-- `after` (as job_archive's walk). Returns how many partitions it created.
SELECT pgqueue_archive_partitions(
           (SELECT min(finished_at) FROM pgqueue_jobs
            WHERE state = 'succeeded'
              AND finished_at < now() - make_interval(secs => %(archive_after_seconds)s)
              AND finished_at >= coalesce(%(after)s::timestamptz, '-infinity')),
           now() + interval '1 day') AS created;

-- name: job_archive
-- Move up to `limit` succeeded jobs finished more than
-- `archive_after_seconds` ago from the hot table to the archive, oldest
-- first, in one statement: the rows a statement deletes are the rows it
-- inserts, so a crash or a rollback moves all or none. Rows another mover
-- (or a reader's lock) holds are skipped, never waited for: concurrent
-- movers take disjoint rows. Only rows nothing refers to any more move:
-- not a workflow's (its views, cancel and retry read its id range), not a
-- batch's (GET /batches/{id} counts its jobs), not a parent (its edges),
-- not one holding a unique key (a key held `always` is held until
-- retention: an enqueue must still find it). Those stay until job_prune.
-- Their steps and signals go as job_prune deletes them: a succeeded job
-- never runs again. `after` (NULL: from the oldest) starts the walk of
-- pgqueue_jobs_finished there: the jobs that stay (dead, cancelled,
-- workflows', batches', parents', key holders) pile up at the old end of
-- that index until retention, and a worker's mover that moved everything
-- finished before some moment does not walk them again
-- (Maintenance.archive). Returns how many moved, and the moment before
-- which every job that may move was due (`cutoff`).
WITH moved AS (
DELETE FROM pgqueue_jobs
WHERE id IN (
    SELECT id FROM pgqueue_jobs
    WHERE state = 'succeeded'
      AND finished_at < now() - make_interval(secs => %(archive_after_seconds)s)
      AND finished_at >= coalesce(%(after)s::timestamptz, '-infinity')
      AND workflow_id IS NULL AND batch_id IS NULL AND NOT has_dependents
      AND NOT (idempotency_key IS NOT NULL
               AND pgqueue_key_held(unique_scope, state, started_at))
    ORDER BY finished_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
RETURNING *
), archived AS (
    INSERT INTO pgqueue_jobs_archive SELECT * FROM moved
), steps_deleted AS (
    DELETE FROM pgqueue_job_steps s USING moved m WHERE s.job_id = m.id
), signals_deleted AS (
    DELETE FROM pgqueue_job_signals s USING moved m WHERE s.job_id = m.id
)
SELECT count(*) AS moved, now() - make_interval(secs => %(archive_after_seconds)s) AS cutoff
FROM moved;

-- name: job_archive_drop
-- Retention of the archive: drop its day partitions wholly older than
-- `retention_seconds` (pgqueue_archive_drop, migration 0034), each as one
-- file: no row is read. Their rows live up to a day past retention.
SELECT partition_name, estimated_rows
FROM pgqueue_archive_drop(now() - make_interval(secs => %(retention_seconds)s));

-- name: job_unarchive
-- Take archived jobs back into the hot table (as they were): the parents
-- of jobs being enqueued (dependencies.enqueue_graph), before job_lock_parents
-- locks them, so that the edges, has_dependents and the children's claims
-- (their parents' results) find them where every other parent is.
WITH restored AS (
    DELETE FROM pgqueue_jobs_archive WHERE id = ANY(%(ids)s::bigint[]) RETURNING *
)
INSERT INTO pgqueue_jobs SELECT * FROM restored
RETURNING id;

-- name: queue_next_wake
-- What an idle worker needs to know to sleep well, for `queues` (NULL:
-- every queue): in how many seconds the earliest delayed job becomes
-- runnable, or a start leaves the window of a rate-limited queue, whichever
-- is first (NULL: neither), and which queues have a concurrency limit (a job
-- of theirs that ends frees a slot). Runnable jobs do not count: the worker
-- has just claimed what it could, so those that are left wait for a limit
-- or a pause, not for time.
-- The earliest delayed job: a plain min(run_at) would read every queued row
-- (90 ms with a million scheduled jobs, once per poll interval per idle
-- worker). For every queue, pgqueue_jobs_due (the queued jobs that were
-- delayed when written) has it as its first entry after now(). For given
-- queues, pgqueue_jobs_claim_queue holds each queue's priority levels in
-- run_at order: this walks the levels with one index probe each (a loose
-- index scan) and takes each level's first job after now().
WITH firsts AS (
    -- run_at > enqueued_at: the index's predicate, true of every job due
    -- after now() (enqueued_at is its enqueue's now(), never later).
    SELECT (SELECT run_at FROM pgqueue_jobs
            WHERE state = 'queued' AND run_at > enqueued_at AND run_at > now()
            ORDER BY run_at LIMIT 1) AS run_at
    WHERE %(queues)s::text[] IS NULL
  UNION ALL
    SELECT first.run_at
    FROM unnest(%(queues)s::text[]) AS wanted(name) CROSS JOIN LATERAL (
        WITH RECURSIVE queue_levels AS (
            SELECT max(priority) AS priority FROM pgqueue_jobs
            WHERE state = 'queued' AND queue = wanted.name
          UNION ALL
            SELECT (SELECT max(priority) FROM pgqueue_jobs
                    WHERE state = 'queued' AND queue = wanted.name
                      AND priority < queue_levels.priority)
            FROM queue_levels WHERE queue_levels.priority IS NOT NULL
        )
        SELECT (SELECT run_at FROM pgqueue_jobs
                WHERE state = 'queued' AND queue = wanted.name
                  AND priority = queue_levels.priority AND run_at > now()
                ORDER BY run_at LIMIT 1) AS run_at
        FROM queue_levels WHERE queue_levels.priority IS NOT NULL
    ) first
)
SELECT extract(epoch FROM least(
           (SELECT min(run_at) FROM firsts),
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
-- It walks the index backwards: a queue's entries begin with those of its
-- jobs claimed since the last vacuum (dead, but in the index until then),
-- and a forward probe read them all (300 pages, 1 to 6 ms under load,
-- growing until the next autovacuum), while a backward one lands on the
-- queue's newest entries at once (a dozen pages).
WITH RECURSIVE named(queue) AS (
    (SELECT queue FROM pgqueue_jobs WHERE state = 'queued' ORDER BY queue DESC LIMIT 1)
    UNION ALL
    SELECT (SELECT j.queue FROM pgqueue_jobs j
            WHERE j.state = 'queued' AND j.queue < n.queue ORDER BY j.queue DESC LIMIT 1)
    FROM named n WHERE n.queue IS NOT NULL
)
SELECT queue FROM named WHERE queue IS NOT NULL ORDER BY queue;

-- name: queue_claim_hints
-- What a worker's claims weigh besides the round robin, for `queues` (NULL:
-- every queue): which are fair (their claims are kept short, so that a key
-- that comes beside a large backlog waits for one short claim, not a long
-- one), and their latency objectives. The lookout reads it once per poll
-- interval; pgqueue_queues has a row per queue ever controlled, a few rows.
SELECT name, fair IS TRUE AS fair, max_start_lag_seconds FROM pgqueue_queues
WHERE NOT paused AND (fair OR max_start_lag_seconds IS NOT NULL)
  AND (%(queues)s::text[] IS NULL OR name = ANY(%(queues)s::text[]))
ORDER BY name;

-- name: queue_start_lags
-- For each of `queues`, how long its oldest runnable job has waited
-- (database clock; 0: none waits): a worker whose queues have latency
-- objectives reads it before each claim, to ask first the queues furthest
-- behind theirs. pgqueue_jobs_claim_queue holds each queue's priority levels
-- in run_at order: a loose index scan, one probe per level, reads each
-- level's first job (as queue_next_wake does), however many jobs wait.
SELECT wanted.name AS queue,
       coalesce(extract(epoch FROM now() - min(first.run_at) FILTER (
           WHERE first.run_at <= now())), 0)::double precision AS lag_seconds
FROM unnest(%(queues)s::text[]) AS wanted(name) LEFT JOIN LATERAL (
    WITH RECURSIVE queue_levels AS (
        SELECT max(priority) AS priority FROM pgqueue_jobs
        WHERE state = 'queued' AND queue = wanted.name
      UNION ALL
        SELECT (SELECT max(priority) FROM pgqueue_jobs
                WHERE state = 'queued' AND queue = wanted.name
                  AND priority < queue_levels.priority)
        FROM queue_levels WHERE queue_levels.priority IS NOT NULL
    )
    SELECT (SELECT run_at FROM pgqueue_jobs
            WHERE state = 'queued' AND queue = wanted.name
              AND priority = queue_levels.priority
            ORDER BY run_at LIMIT 1) AS run_at
    FROM queue_levels WHERE queue_levels.priority IS NOT NULL
) first ON true
GROUP BY wanted.name
ORDER BY wanted.name;

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
        rate_period_seconds = %(rate_period_seconds)s, fair = %(fair)s,
        max_start_lag_seconds = %(max_start_lag_seconds)s, updated_at = now()
    WHERE name = %(queue)s
    RETURNING *
), forgotten AS (
    DELETE FROM pgqueue_starts s USING written w
    WHERE s.queue = w.name AND w.rate_period_seconds IS NULL
), woken AS (
    SELECT pg_notify('pgqueue_jobs', name) FROM written WHERE NOT paused
)
SELECT written.* FROM written, (SELECT count(*) FROM woken) w;

-- name: key_objective_set
-- Declare a key's latency objective in a fair queue (core/key_objectives.py),
-- or change it.
INSERT INTO pgqueue_key_objectives AS o (queue, key, max_start_lag_seconds)
VALUES (%(queue)s, %(key)s, %(max_start_lag_seconds)s)
ON CONFLICT (queue, key) DO UPDATE
SET max_start_lag_seconds = excluded.max_start_lag_seconds, updated_at = now();

-- name: key_objective_remove
-- Remove a key's latency objective (nothing to remove is no error).
DELETE FROM pgqueue_key_objectives WHERE queue = %(queue)s AND key = %(key)s;

-- name: key_objective_list
-- The key objectives of `queue` (NULL: of every queue), each with the wait
-- of its key's next job as the claims weigh it (pgqueue_key_lags, migration
-- 0042): the rows an operator declared, a few per queue, and one probe of
-- the claim index per row.
SELECT q.queue, l.key, l.max_start_lag_seconds, l.wait_seconds
FROM (SELECT DISTINCT o.queue FROM pgqueue_key_objectives o
      WHERE %(queue)s::text IS NULL OR o.queue = %(queue)s::text) q
CROSS JOIN LATERAL pgqueue_key_lags(q.queue, now()) l
ORDER BY q.queue, l.key;

-- name: worker_register
-- A worker process starts: its row in the registry (a restarted name
-- starts afresh). With `session`, the PostgreSQL session this statement
-- runs on (the worker's heartbeat connection) is recorded, so that the
-- reapers notice at once when it ends (worker_reap_dead).
INSERT INTO pgqueue_workers AS w (name, host, pid, version, queues, concurrency, expires_at,
                                  session_pid, session_start, server_start)
SELECT %(name)s, %(host)s, %(pid)s, %(version)s, %(queues)s::text[], %(concurrency)s,
       now() + make_interval(secs => %(expires_in)s), s.pid, s.backend_start, s.server_start
FROM pgqueue_own_session(%(session)s) s
ON CONFLICT (name) DO UPDATE
SET host = excluded.host, pid = excluded.pid, version = excluded.version,
    queues = excluded.queues, concurrency = excluded.concurrency,
    started_at = now(), last_seen_at = now(), expires_at = excluded.expires_at,
    held = 0, running = 0, hung = 0, claimed = 0, last_claim_at = NULL,
    session_pid = excluded.session_pid, session_start = excluded.session_start,
    server_start = excluded.server_start;

-- name: worker_seen
-- A worker's heartbeat: it is alive, and this is what it holds. Its last
-- claim comes as seconds ago (the worker's own clock only measures
-- durations). The session is recorded again (as in worker_register): after
-- a reconnect or a restart it is a new one. Returns nothing when the row is
-- gone (pruned while the worker was cut off): the worker then registers again.
UPDATE pgqueue_workers w
SET last_seen_at = now(), expires_at = now() + make_interval(secs => %(expires_in)s),
    held = %(held)s, running = %(running)s, hung = %(hung)s, claimed = %(claimed)s,
    last_claim_at = CASE WHEN %(claim_seconds_ago)s::double precision IS NULL THEN NULL
                         ELSE now() - make_interval(secs => %(claim_seconds_ago)s) END,
    session_pid = s.pid, session_start = s.backend_start, server_start = s.server_start
FROM pgqueue_own_session(%(session)s) s
WHERE w.name = %(name)s
RETURNING w.name;

-- name: worker_leave
-- A worker stops gracefully: its row goes.
DELETE FROM pgqueue_workers WHERE name = %(name)s;

-- name: worker_prune
-- Rows of workers that stopped heartbeating (killed, cut off) longer ago
-- than `retention_seconds`.
WITH pruned AS (
    DELETE FROM pgqueue_workers
    WHERE expires_at < now() - make_interval(secs => %(retention_seconds)s)
    RETURNING 1
)
SELECT count(*) AS pruned FROM pruned;

-- name: worker_reap_dead
-- Workers whose recorded session has ended (killed, crashed, or their
-- connection cut by the server): marked dead at once (expired, the session
-- forgotten, so that only one reaper finds each), and the leases of their
-- running jobs ended (set to 'epoch', 1970-01-01, a time no real lease
-- has: job_reap takes those back first and says why). Never the calling
-- worker itself, and only sessions recorded on this server since it
-- started (server_start; after a restart or failover the leases decide
-- until each worker records its new session). A session is
-- gone when no backend has its pid, or one has it that started at another
-- time (the pid was reused). Every role sees every backend's pid, but its
-- start only for its own role's sessions (or with pg_read_all_stats); a
-- session whose start it cannot see counts as alive, and its worker is left
-- to its leases. Cost: one pass over the backends (the pg_stat_get_backend_*
-- functions, cheaper than pg_stat_activity) hashed against the registry; the
-- jobs are read only when some worker is dead.
-- The statement is pgqueue_reap_dead_workers's (migration 0046), planned
-- without sequential scans whatever the statistics say.
SELECT name, jobs FROM pgqueue_reap_dead_workers(%(worker)s::text);

-- name: worker_list
-- The registry, with what the rows do not say themselves: whether each
-- worker is alive (its last heartbeat has not expired), and whether it is
-- stalled: alive, with free slots, yet it has not claimed since a job of its
-- queues became runnable `stall_seconds` ago or more (its claim loop is not
-- doing its job). One probe of the claim index per worker.
SELECT w.name, w.host, w.pid, w.version, w.queues, w.concurrency, w.started_at,
       w.last_seen_at, w.expires_at, w.held, w.running, w.hung, w.claimed, w.last_claim_at,
       w.expires_at > now() AS alive,
       extract(epoch FROM now() - w.last_seen_at)::double precision AS last_seen_seconds,
       w.expires_at > now() AND w.running + w.hung < w.concurrency AND EXISTS (
           SELECT 1 FROM pgqueue_jobs j
           WHERE j.state = 'queued'
             AND j.run_at <= now() - make_interval(secs => %(stall_seconds)s)
             AND j.run_at > coalesce(w.last_claim_at, w.started_at)
             AND (w.queues IS NULL OR j.queue = ANY(w.queues))
       ) AS stalled
FROM pgqueue_workers w
ORDER BY w.name;

-- name: queue_stats
-- Per queue and live state: how many jobs, and the age of the oldest runnable
-- one. Reads only the partial indexes of queued, running and waiting rows,
-- whatever the server's costs (pgqueue_live_counts, migration 0043), never
-- the finished jobs.
SELECT * FROM pgqueue_live_counts();

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
       sum(dead)::bigint AS dead, sum(cancelled)::bigint AS cancelled,
       sum(snoozed)::bigint AS snoozed
FROM pgqueue_counters GROUP BY queue ORDER BY queue;

-- name: start_latency_histogram
-- Enqueue-to-start histogram per queue and bucket, summed over shards.
SELECT queue, bucket, sum(count)::bigint AS count, sum(sum_seconds) AS sum_seconds
FROM pgqueue_start_latency GROUP BY queue, bucket ORDER BY queue, bucket;

-- name: history_fold
-- Move the enqueue counts appended since the last fold (pgqueue_enqueued)
-- into pgqueue_counters.enqueued, so that the appends stay few. A fold that
-- meets rows another fold is moving waits for it, then finds them gone.
WITH folded AS (
    DELETE FROM pgqueue_enqueued RETURNING queue, n
)
INSERT INTO pgqueue_counters AS c (queue, shard, enqueued)
SELECT queue, pg_backend_pid() %% 16, sum(n) FROM folded GROUP BY 1, 2 ORDER BY 1, 2
ON CONFLICT (queue, shard) DO UPDATE SET enqueued = c.enqueued + excluded.enqueued;

-- name: history_snapshot
-- Once a minute: record each queue's cumulative numbers
-- (pgqueue_queue_totals) for the current minute of the database clock (or
-- for `minute`, when given: tests write chosen minutes this way), where they
-- changed since the queue's previous row. Of the workers that call it in a
-- minute, the first takes the minute (its row in pgqueue_history_snapshots)
-- and writes; the others write nothing. Reads the counters, never the jobs.
WITH taken AS (
    INSERT INTO pgqueue_history_snapshots (minute)
    VALUES (date_trunc('minute', coalesce(%(minute)s::timestamptz, now())))
    ON CONFLICT (minute) DO NOTHING
    RETURNING minute
), written AS (
    INSERT INTO pgqueue_queue_minutes (queue, minute, enqueued, succeeded, failed, dead, latency)
    SELECT t.queue, taken.minute, t.enqueued, t.succeeded, t.failed, t.dead, t.latency
    FROM taken CROSS JOIN pgqueue_queue_totals t
    LEFT JOIN LATERAL (
        -- The queue's numbers in force before: one probe of the primary key.
        SELECT * FROM pgqueue_queue_minutes p
        WHERE p.queue = t.queue AND p.minute < taken.minute
        ORDER BY p.minute DESC LIMIT 1
    ) prev ON true
    WHERE prev.queue IS NULL
       OR (prev.enqueued, prev.succeeded, prev.failed, prev.dead, prev.latency)
          IS DISTINCT FROM (t.enqueued, t.succeeded, t.failed, t.dead, t.latency)
    RETURNING 1
)
SELECT (SELECT count(*) FROM taken) AS taken, count(*) AS written FROM written;

-- name: history_prune
-- Forget the snapshots older than `retention_seconds`, except each queue's
-- newest row among them: the numbers in force when what is kept begins.
WITH cutoff AS (
    SELECT now() - make_interval(secs => %(retention_seconds)s) AS at
), marks AS (
    DELETE FROM pgqueue_history_snapshots s USING cutoff WHERE s.minute < cutoff.at
), pruned AS (
    DELETE FROM pgqueue_queue_minutes m USING cutoff
    WHERE m.minute < cutoff.at
      AND EXISTS (SELECT 1 FROM pgqueue_queue_minutes n
                  WHERE n.queue = m.queue AND n.minute > m.minute AND n.minute < cutoff.at)
    RETURNING 1
)
SELECT count(*) AS pruned FROM pruned;

-- name: history_marks
-- The database's current minute, and the minutes of the last `minutes`
-- (the current one included) that have a snapshot, oldest first.
SELECT date_trunc('minute', now()) AS current_minute,
       ARRAY(SELECT minute FROM pgqueue_history_snapshots
             WHERE minute > date_trunc('minute', now()) - make_interval(mins => %(minutes)s)
               AND minute <= date_trunc('minute', now())
             ORDER BY minute) AS marks;

-- name: history_rows
-- A queue's snapshot rows from `first` to `last`, and the one in force at
-- `first` (its newest before), oldest first: two ranges of the primary key.
(SELECT * FROM pgqueue_queue_minutes
 WHERE queue = %(queue)s AND minute < %(first)s ORDER BY minute DESC LIMIT 1)
UNION ALL
(SELECT * FROM pgqueue_queue_minutes
 WHERE queue = %(queue)s AND minute >= %(first)s AND minute <= %(last)s ORDER BY minute);

-- name: history_live
-- A queue's cumulative numbers now (no row: it has none yet).
SELECT * FROM pgqueue_queue_totals WHERE queue = %(queue)s;

-- name: schedule_upsert
-- Create or update the schedules a worker's code declares, from parallel
-- arrays (sorted by name, so that workers starting together lock rows in the
-- same order). A schedule whose timing (cron, every_seconds, tz) changed, that
-- was retired, or that had no tick planned starts again from its first tick
-- after now (`next_run_at`); any other keeps its place, so that a restart
-- catches up what it missed. `enabled` belongs to the operators and is not
-- written. Rows already as declared are not written at all, nor is a runtime
-- schedule of the same name (origin 'runtime': schedule_shadowed finds them).
-- Returns the names of the rows written.
INSERT INTO pgqueue_schedules AS s (name, task, payload, queue, priority, max_attempts,
                                    timeout_seconds, cron, every_seconds, tz, catch_up,
                                    catch_up_limit, next_run_at)
SELECT * FROM unnest(%(name)s::text[], %(task)s::text[], %(payload)s::jsonb[], %(queue)s::text[],
                     %(priority)s::integer[], %(max_attempts)s::integer[],
                     %(timeout_seconds)s::double precision[], %(cron)s::text[],
                     %(every_seconds)s::integer[], %(tz)s::text[], %(catch_up)s::text[],
                     %(catch_up_limit)s::integer[], %(next_run_at)s::timestamptz[])
ON CONFLICT (name) DO UPDATE
SET task = excluded.task, payload = excluded.payload, queue = excluded.queue,
    priority = excluded.priority, max_attempts = excluded.max_attempts,
    timeout_seconds = excluded.timeout_seconds, cron = excluded.cron,
    every_seconds = excluded.every_seconds, tz = excluded.tz, catch_up = excluded.catch_up,
    catch_up_limit = excluded.catch_up_limit,
    next_run_at = CASE WHEN s.retired_at IS NOT NULL OR s.next_run_at IS NULL
                         OR (s.cron, s.every_seconds, s.tz)
                            IS DISTINCT FROM (excluded.cron, excluded.every_seconds, excluded.tz)
                       THEN excluded.next_run_at ELSE s.next_run_at END,
    retired_at = NULL, updated_at = now()
WHERE s.origin = 'code' AND (s.retired_at IS NOT NULL OR s.next_run_at IS NULL
   OR (s.task, s.payload, s.queue, s.priority, s.max_attempts, s.timeout_seconds, s.cron,
       s.every_seconds, s.tz, s.catch_up, s.catch_up_limit)
      IS DISTINCT FROM (excluded.task, excluded.payload, excluded.queue, excluded.priority,
                        excluded.max_attempts, excluded.timeout_seconds, excluded.cron,
                        excluded.every_seconds, excluded.tz, excluded.catch_up,
                        excluded.catch_up_limit))
RETURNING s.name;

-- name: schedule_retire
-- Retire the schedules of `tasks` not named in `names`: a worker that handles
-- those tasks started without declaring them, so they were removed from the
-- code (runtime schedules are never the code's to retire). A retired schedule stays visible and fires no more. Returns the
-- schedules retired now.
UPDATE pgqueue_schedules
SET retired_at = now(), updated_at = now()
WHERE task = ANY(%(tasks)s::text[]) AND NOT name = ANY(%(names)s::text[]) AND retired_at IS NULL
  AND origin = 'code'
RETURNING name, task;

-- name: schedule_shadowed
-- Of the names a worker's code declares, those a runtime schedule holds: the
-- worker leaves them as they are (migration 0028), and says so.
SELECT name FROM pgqueue_schedules
WHERE origin = 'runtime' AND name = ANY(%(names)s::text[])
ORDER BY name;

-- name: schedule_next_due
-- The scheduler's one read per loop: seconds until the earliest live schedule
-- is due (0 or less: due now; NULL: nothing planned). A few rows, no index.
SELECT extract(epoch FROM min(next_run_at) - now())::double precision AS seconds
FROM pgqueue_schedules
WHERE enabled AND retired_at IS NULL;

-- name: schedule_due
-- The live schedules that are due, oldest first, with the database's clock
-- that their ticks are planned from.
SELECT s.*, now() AS now
FROM pgqueue_schedules s
WHERE enabled AND retired_at IS NULL AND next_run_at <= now()
ORDER BY next_run_at, name
LIMIT %(limit)s;

-- name: schedule_fire
-- Enqueue a schedule's planned ticks (one job per key in `keys`) and move it
-- to `next_run_at`, in one statement. The guard: the row must still be live
-- and at the tick the scheduler planned from (`due`). It is locked first, so
-- that of many schedulers that planned the same ticks one moves it, and the
-- others wait for its lock, see the row moved and match nothing. Each key
-- names the schedule and its tick, and a key already taken inserts nothing,
-- so that even a schedule deleted and declared again never enqueues a tick
-- twice. Returns no row when another scheduler moved the schedule first;
-- otherwise one row per new job (`id` NULL when there is none: every tick
-- was skipped, or already enqueued).
WITH due AS (
    SELECT * FROM pgqueue_schedules
    WHERE name = %(name)s AND next_run_at = %(due)s AND enabled AND retired_at IS NULL
    FOR UPDATE
), inserted AS (
    INSERT INTO pgqueue_jobs (queue, task, payload, priority, max_attempts, timeout_seconds,
                              idempotency_key)
    SELECT due.queue, due.task, due.payload, due.priority,
           coalesce(due.max_attempts, %(default_max_attempts)s), due.timeout_seconds, t.key
    FROM due, unnest(%(keys)s::text[]) WITH ORDINALITY AS t(key, n)
    ORDER BY t.n
    -- A tick's key has no scope: held for as long as its job exists.
    ON CONFLICT (idempotency_key)
        WHERE idempotency_key IS NOT NULL AND pgqueue_key_held(unique_scope, state, started_at)
        DO NOTHING
    RETURNING id, queue, idempotency_key
), moved AS (
    UPDATE pgqueue_schedules s
    SET next_run_at = %(next_run_at)s::timestamptz,
        last_tick = coalesce(%(last_tick)s::timestamptz, s.last_tick),
        last_run_at = CASE WHEN %(last_tick)s::timestamptz IS NULL THEN s.last_run_at
                           ELSE now() END,
        last_job_id = coalesce((SELECT max(id) FROM inserted), s.last_job_id)
    FROM due WHERE s.name = due.name
    RETURNING s.name
), woken AS (
    SELECT pg_notify('pgqueue_jobs', queue) FROM (SELECT DISTINCT queue FROM inserted) q
), counted AS (
    INSERT INTO pgqueue_enqueued (queue, n) SELECT queue, count(*) FROM inserted GROUP BY 1
)
SELECT moved.name, i.id, i.idempotency_key
FROM moved LEFT JOIN inserted i ON true, (SELECT count(*) FROM woken) w
ORDER BY i.id;

-- name: schedule_unplan
-- Leave a schedule with no tick planned (its timing has no tick ahead, or
-- cannot be read by this worker), if it is still at `due`. A worker that
-- declares it plans it again when it starts.
UPDATE pgqueue_schedules SET next_run_at = NULL
WHERE name = %(name)s AND next_run_at = %(due)s
RETURNING name;

-- name: schedule_get
-- One schedule, with the database's clock.
SELECT s.*, now() AS now FROM pgqueue_schedules s WHERE name = %(name)s;

-- name: schedule_set_enabled
-- Switch a schedule on or off. Switched on from off, it starts again from
-- `next_run_at`, its first tick after now: the ticks of the time it was off
-- are not caught up. Returns the row with the state of its last job.
WITH switched AS (
    UPDATE pgqueue_schedules
    SET enabled = %(enabled)s,
        next_run_at = CASE WHEN %(enabled)s AND NOT enabled THEN %(next_run_at)s
                           ELSE next_run_at END,
        updated_at = now()
    WHERE name = %(name)s
    RETURNING *
)
SELECT s.*, j.state AS last_job_state
FROM switched s LEFT JOIN LATERAL (
    SELECT state FROM pgqueue_jobs WHERE id = s.last_job_id
    UNION ALL
    SELECT state FROM pgqueue_jobs_archive WHERE id = s.last_job_id
) j ON true;

-- name: schedule_delete
-- Delete a schedule (a worker whose code declares it creates it again when
-- it starts). Its jobs stay.
DELETE FROM pgqueue_schedules WHERE name = %(name)s RETURNING name;

-- name: schedule_create
-- Create a runtime schedule (origin 'runtime'), starting at `next_run_at`,
-- its first tick after now. A name already in the table, from code or not,
-- inserts nothing and returns no row: the caller says who holds it.
INSERT INTO pgqueue_schedules (name, task, payload, queue, priority, max_attempts,
                               timeout_seconds, cron, every_seconds, tz, catch_up,
                               catch_up_limit, enabled, next_run_at, origin)
VALUES (%(name)s, %(task)s, %(payload)s::jsonb, %(queue)s, %(priority)s, %(max_attempts)s,
        %(timeout_seconds)s, %(cron)s, %(every_seconds)s, %(tz)s, %(catch_up)s,
        %(catch_up_limit)s, %(enabled)s, %(next_run_at)s, 'runtime')
ON CONFLICT (name) DO NOTHING
RETURNING *, NULL::text AS last_job_state;

-- name: schedule_lock
-- One schedule, locked until the caller's transaction ends (an update reads,
-- merges and writes it with no other change in between), with the clock.
SELECT s.*, now() AS now FROM pgqueue_schedules s WHERE name = %(name)s FOR UPDATE;

-- name: schedule_update
-- Write a runtime schedule's definition, locked by schedule_lock in the same
-- transaction. `next_run_at` is the one the caller planned: the first tick
-- after now when the timing changed, the one it had otherwise. Returns the
-- row with the state of its last job; none for a schedule from code.
WITH changed AS (
    UPDATE pgqueue_schedules
    SET task = %(task)s, payload = %(payload)s::jsonb, queue = %(queue)s,
        priority = %(priority)s, max_attempts = %(max_attempts)s,
        timeout_seconds = %(timeout_seconds)s, cron = %(cron)s,
        every_seconds = %(every_seconds)s, tz = %(tz)s, catch_up = %(catch_up)s,
        catch_up_limit = %(catch_up_limit)s, next_run_at = %(next_run_at)s,
        updated_at = now()
    WHERE name = %(name)s AND origin = 'runtime'
    RETURNING *
)
SELECT c.*, j.state AS last_job_state
FROM changed c LEFT JOIN LATERAL (
    SELECT state FROM pgqueue_jobs WHERE id = c.last_job_id
    UNION ALL
    SELECT state FROM pgqueue_jobs_archive WHERE id = c.last_job_id
) j ON true;

-- name: schedule_run_now
-- Enqueue one job of a schedule now, outside its ticks ("run now"), under
-- `key` (schedules.run_key: the schedule and the second, by the database's
-- clock), and make it the schedule's last run. A key already taken inserts
-- nothing: the same request twice within a second enqueues one job. Its
-- next tick does not move. Returns one row (`id` NULL when the key was
-- taken); none when no schedule has the name.
WITH s AS (
    SELECT * FROM pgqueue_schedules WHERE name = %(name)s FOR UPDATE
), inserted AS (
    INSERT INTO pgqueue_jobs (queue, task, payload, priority, max_attempts, timeout_seconds,
                              idempotency_key)
    SELECT s.queue, s.task, s.payload, s.priority,
           coalesce(s.max_attempts, %(default_max_attempts)s), s.timeout_seconds, %(key)s
    FROM s
    ON CONFLICT (idempotency_key)
        WHERE idempotency_key IS NOT NULL AND pgqueue_key_held(unique_scope, state, started_at)
        DO NOTHING
    RETURNING *
), ran AS (
    UPDATE pgqueue_schedules p SET last_run_at = now(), last_job_id = inserted.id
    FROM inserted WHERE p.name = %(name)s
    RETURNING p.name
), woken AS (
    SELECT pg_notify('pgqueue_jobs', queue) FROM inserted
), counted AS (
    INSERT INTO pgqueue_enqueued (queue, n) SELECT queue, 1 FROM inserted
)
SELECT s.name AS schedule, i.*
FROM s LEFT JOIN inserted i ON true, (SELECT count(*) FROM woken) w, (SELECT count(*) FROM ran) r;

-- name: schedule_list
-- Every schedule by name, with the state of its last job (NULL once pruned;
-- an archived job's too: migration 0034).
SELECT s.*, j.state AS last_job_state
FROM pgqueue_schedules s LEFT JOIN LATERAL (
    SELECT state FROM pgqueue_jobs WHERE id = s.last_job_id
    UNION ALL
    SELECT state FROM pgqueue_jobs_archive WHERE id = s.last_job_id
) j ON true
ORDER BY s.name;

-- name: workflow_jobs
-- Every job of a workflow, in id order (their depends_on are the edges): a
-- range of the jobs' primary key (pgqueue_workflows, migration 0014).
SELECT j.* FROM pgqueue_workflows w
JOIN pgqueue_jobs j ON j.id BETWEEN w.first_job AND w.last_job AND j.workflow_id = w.id
WHERE w.id = %(workflow_id)s::uuid
ORDER BY j.id;

-- name: workflow_list
-- Workflows newest first, a page at a time after a keyset cursor (the
-- first_job of the last one seen), each with how many of its jobs are in
-- each state. A walk down pgqueue_workflows_first_job (migration 0029) that
-- stops after `limit` matches; each workflow's jobs are read once, as a
-- range of the jobs' primary key (0014), never a scan of the table. `state`
-- keeps the workflows that have a job not ended (running), none (finished),
-- only succeeded jobs (succeeded), a dead job (dead) or a cancelled one
-- (cancelled): each page reads the workflows it skips, as job_list does
-- the jobs. created_at: when its first job still kept was enqueued.
SELECT w.id AS workflow_id, w.first_job, c.*
FROM pgqueue_workflows w
CROSS JOIN LATERAL (
    SELECT count(*) AS jobs,
           count(*) FILTER (WHERE j.state = 'waiting') AS waiting,
           count(*) FILTER (WHERE j.state = 'queued') AS queued,
           count(*) FILTER (WHERE j.state = 'running') AS running,
           count(*) FILTER (WHERE j.state = 'succeeded') AS succeeded,
           count(*) FILTER (WHERE j.state = 'dead') AS dead,
           count(*) FILTER (WHERE j.state = 'cancelled') AS cancelled,
           min(j.enqueued_at) AS created_at,
           max(j.finished_at) AS last_finished_at,
           (array_agg(j.task ORDER BY j.id))[1] AS first_task
    FROM pgqueue_jobs j
    WHERE j.id BETWEEN w.first_job AND w.last_job AND j.workflow_id = w.id
) c
WHERE (%(before)s::bigint IS NULL OR w.first_job < %(before)s::bigint)
  AND c.jobs > 0
  AND CASE %(state)s::text
        WHEN 'running' THEN c.waiting + c.queued + c.running > 0
        WHEN 'finished' THEN c.waiting + c.queued + c.running = 0
        WHEN 'succeeded' THEN c.succeeded = c.jobs
        WHEN 'dead' THEN c.dead > 0
        WHEN 'cancelled' THEN c.cancelled > 0
        ELSE true
      END
ORDER BY w.first_job DESC
LIMIT %(limit)s;

-- name: workflow_cancel
-- Cancel every job of a workflow that has not ended, as job_cancel does
-- (running jobs' leases revoked). Jobs outside the workflow that depend on
-- them follow their policies. Locks in id order, skipping nothing: a
-- worker's ack of one of them waits, then matches nothing; their workers
-- are told to stop the handlers of the running ones.
WITH picked AS (
    SELECT j.id, j.state FROM pgqueue_workflows w
    JOIN pgqueue_jobs j ON j.id BETWEEN w.first_job AND w.last_job AND j.workflow_id = w.id
    WHERE w.id = %(workflow_id)s::uuid AND j.state IN ('waiting', 'queued', 'running')
    ORDER BY j.id
    FOR NO KEY UPDATE OF j
), cancelled AS (
    UPDATE pgqueue_jobs j
    SET state = 'cancelled', finished_at = now(), lease_expires_at = NULL
    FROM picked p
    WHERE j.id = p.id AND j.state IN ('waiting', 'queued', 'running')
    RETURNING j.id, j.queue, j.has_dependents, j.lease_token, p.state = 'running' AS was_running
), counted AS (
    INSERT INTO pgqueue_counters AS c (queue, shard, cancelled)
    SELECT queue, pg_backend_pid() %% 16, count(*) FROM cancelled GROUP BY 1, 2 ORDER BY 1, 2
    ON CONFLICT (queue, shard) DO UPDATE SET cancelled = c.cancelled + excluded.cancelled
), ended AS (
    SELECT pgqueue_notify_ended(array_agg(id)) FROM cancelled
), stopped AS (
    -- Their workers stop the handlers of the running ones (as in job_cancel).
    SELECT pgqueue_notify_cancelled(array_agg(id), array_agg(lease_token))
    FROM cancelled WHERE was_running HAVING count(*) > 0
), released AS (
    SELECT pgqueue_release(array_agg(id), array_agg(false))
    FROM cancelled WHERE has_dependents HAVING count(*) > 0
)
SELECT count(*) AS cancelled
FROM cancelled, (SELECT count(*) FROM ended) e, (SELECT count(*) FROM stopped) s,
     (SELECT count(*) FROM released) r;

-- name: workflow_retry
-- Put a workflow's dead and cancelled jobs back with fresh budgets, each
-- waiting for those of its parents that will run again or are still
-- running (none: queued). A parent that failed outside the workflow counts
-- as done. Workflow jobs have no keys, so no key can be taken.
WITH picked AS (
    SELECT j.id, j.depends_on FROM pgqueue_workflows w
    JOIN pgqueue_jobs j ON j.id BETWEEN w.first_job AND w.last_job AND j.workflow_id = w.id
    WHERE w.id = %(workflow_id)s::uuid AND j.state IN ('dead', 'cancelled')
    ORDER BY j.id
    FOR NO KEY UPDATE OF j
), left_over AS (
    SELECT p.id, p.depends_on IS NOT NULL AS has_parents,
           (SELECT count(*) FROM pgqueue_jobs parent
            WHERE parent.id = ANY(p.depends_on)
              AND (parent.state IN ('waiting', 'queued', 'running')
                   OR parent.id IN (SELECT id FROM picked)))::integer AS n
    FROM picked p
), retried AS (
    UPDATE pgqueue_jobs j
    SET state = CASE WHEN l.n > 0 THEN 'waiting' ELSE 'queued' END,
        waiting_on = CASE WHEN l.has_parents THEN l.n END,
        attempts = 0, snoozes = 0, run_at = now(), finished_at = NULL, started_at = NULL,
        result = NULL, lease_token = NULL, worker = NULL
    FROM left_over l
    WHERE j.id = l.id
    RETURNING j.id, j.queue, j.state
), woken AS (
    SELECT pg_notify('pgqueue_jobs', queue)
    FROM (SELECT DISTINCT queue FROM retried WHERE state = 'queued') q
)
SELECT count(*) AS retried FROM retried, (SELECT count(*) FROM woken) w;

-- name: batch_open
-- Open a batch (migrations/0027_batches.sql): jobs may join it until it is
-- closed. `callbacks`: the checked fields of its callback jobs, by when
-- they run (core/batches.py). Returns the new row.
INSERT INTO pgqueue_batches (id, callbacks, metadata)
VALUES (%(id)s::uuid, %(callbacks)s::jsonb, %(metadata)s::jsonb)
RETURNING *;

-- name: batch_lock
-- The batches new jobs are about to join, with their states, locked until
-- the enqueue commits: a close waits for the new jobs to count, and an
-- enqueue after a close sees the batch closed. In id order, so that two
-- enqueues never deadlock.
SELECT id, state FROM pgqueue_batches
WHERE id = ANY(%(ids)s::uuid[])
ORDER BY id
FOR NO KEY UPDATE;

-- name: batch_close
-- Close a batch; finished at once, its callbacks enqueued, when every job
-- of it has ended (pgqueue_batch_close). The state after, NULL for no such batch.
SELECT pgqueue_batch_close(%(id)s::uuid) AS state;

-- name: batch_get
-- One batch, and its jobs counted by state now (through pgqueue_jobs_batch;
-- pruned jobs are gone from these, not from its counters).
SELECT b.*,
       coalesce((SELECT jsonb_object_agg(state, n)
                 FROM (SELECT state, count(*) AS n FROM pgqueue_jobs
                       WHERE batch_id = b.id GROUP BY state) s), '{}'::jsonb) AS counts
FROM pgqueue_batches b
WHERE b.id = %(id)s::uuid;

-- name: snapshot_begin
-- Make the current transaction one read-only snapshot, so that several reads
-- (the API's /metrics and /queues) see the same moment and the same now().
-- Must be the first statement of the transaction.
SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY;

-- name: db_ping
-- The database answers.
SELECT 1 AS ok;

-- name: db_now
-- The database's clock, for a flow that must fix a moment once and use it
-- in several statements (a unique key's period, a bulk action's start) or
-- plan from it (schedules).
SELECT now() AS now;

-- name: server_set_password
-- The embedded server's superuser password, given as a SCRAM verifier made
-- by the client, so the password itself never reaches the server or its
-- logs. A utility statement takes no parameters: run it on a ClientCursor.
ALTER ROLE postgres PASSWORD %(verifier)s;

-- name: session_utc
-- The worker's sessions read times in UTC: psycopg turns a timestamptz into
-- a datetime in the session's zone, and any zone but "UTC" (even
-- "Etc/UTC", a common server default) costs a conversion through zoneinfo
-- per value, 0.35 µs each, four per claimed job. The times are the same
-- instants; only their zone differs.
SET TIME ZONE 'UTC';

-- name: session_read_committed
-- The worker's sessions run at READ COMMITTED whatever the server, role or
-- database sets as default_transaction_isolation: the claim relies on it
-- (a row another claim took since the statement began is re-checked on its
-- newest version and skipped), where REPEATABLE READ or SERIALIZABLE fail
-- the statement instead ("could not serialize access"), and a drain ran at
-- half its rate with errors. Not set behind a transaction-mode pooler (the
-- setting would stay with a server session other clients get next): there,
-- set it for the worker's role (docs/howto/pgbouncer.md).
SET default_transaction_isolation = 'read committed';

-- name: session_commit_local
-- The worker's upkeep session (heartbeats, the workers registry,
-- maintenance, schedules) commits without waiting for a synchronous
-- standby: while none answers (Patroni's strict synchronous mode with the
-- standby gone) every waiting commit is cut off after half a lease, and a
-- heartbeat that waited would let leases run out. What a failover can lose
-- of it is harmless: a lease extension (the job runs again sooner), a reap
-- (reaped again), a schedule's tick with its job (fired again). Claims and
-- acks keep the server's setting. A server set to `off` stays so.
SELECT set_config('synchronous_commit', 'local', false)
WHERE current_setting('synchronous_commit') NOT IN ('off', 'local');

-- name: events_fingerprint
-- What the API's event stream (GET /events) compares once a second, on its
-- one listening connection, to see the changes that send no NOTIFY: acks and
-- failures (job_finish notifies only the jobs somebody waits for), cancels of
-- jobs nobody waits for, snoozes, claims, delayed enqueues, workers that come
-- and go, queue controls. Per queue: its outcome counters and its claims
-- (the start-latency counts) summed; then the newest job id (one probe of
-- the primary key, from its end), the workers registered and the queue
-- controls' last change. Small tables only, and no scan of pgqueue_jobs.
SELECT (SELECT coalesce(jsonb_object_agg(queue, n), '{}'::jsonb)
        FROM (SELECT queue, sum(n)::bigint AS n
              FROM (SELECT queue, succeeded + failed + dead + cancelled + snoozed + enqueued AS n
                    FROM pgqueue_counters
                    UNION ALL
                    SELECT queue, count FROM pgqueue_start_latency) counted
              GROUP BY queue) per_queue) AS queues,
       (SELECT max(id) FROM pgqueue_jobs) AS last_job,
       (SELECT count(*) FROM pgqueue_workers) AS workers,
       (SELECT count(*)::text || '@' || coalesce(max(updated_at)::text, '')
        FROM pgqueue_queues) AS controls;

-- name: listen_jobs
-- Subscribe to "jobs are ready" hints (payload: the queue name).
LISTEN pgqueue_jobs;

-- name: listen_cancelled
-- Subscribe to "these running attempts were cancelled" (payload: id:token
-- pairs, comma-separated; migrations/0022), for the worker.
LISTEN pgqueue_cancelled;

-- name: listen_finished
-- Subscribe to "these jobs ended" hints (payload: job ids, comma-separated),
-- for wait().
LISTEN pgqueue_finished;

-- name: listen_progress
-- Subscribe to "these jobs reported progress" hints (payload: job ids,
-- comma-separated; job_progress), for wait()'s on_progress.
LISTEN pgqueue_progress;

-- name: migration_try_lock
-- Serialise concurrent migrators, one migration at a time: true if this
-- transaction now holds the lock (until it ends: not the session's, so that
-- it also works through a transaction-mode pooler). A migrator that gets
-- false ends its transaction and tries again a moment later (db/migrate.py):
-- one waiting inside a statement would hold a snapshot all along, and a
-- CREATE INDEX CONCURRENTLY under way, which waits for every transaction
-- with a snapshot older than its own, would wait for the migrators waiting
-- for it.
SELECT pg_try_advisory_xact_lock(hashtext('pgqueue.migrate')) AS locked;

-- name: migration_timeouts
-- For this migration's transaction only (so also through a transaction-mode
-- pooler): its waits for a lock end after `lock_timeout` (a statement
-- waiting for a table's lock holds every later statement on that table
-- behind it: behind a long transaction, the whole queue), and neither a
-- statement_timeout nor an idle_in_transaction_session_timeout the role or
-- database sets cuts it short (a migration runs to its end or not at all;
-- the transaction holding the lock of a no-transaction file's index builds
-- is idle while they run). Without parameters, so that it goes by the
-- simple protocol: an extended-protocol query leaves its portal, and with
-- it a snapshot, open until the next query, and a CREATE INDEX
-- CONCURRENTLY waits for that lock holder's snapshot (db/migrate.py).
-- The lock timeout is db/migrate.py's LOCK_TIMEOUT_SECONDS.
SELECT set_config('lock_timeout', '1s', true),
       set_config('statement_timeout', '0', true),
       set_config('idle_in_transaction_session_timeout', '0', true);

-- name: migration_table
-- The record of applied migrations.
CREATE TABLE IF NOT EXISTS pgqueue_migrations (
    version    text PRIMARY KEY,
    applied_at timestamptz NOT NULL DEFAULT now()
);

-- name: migration_table_exists
-- Whether the record of applied migrations exists (false: never migrated).
SELECT to_regclass('pgqueue_migrations') IS NOT NULL AS present;

-- name: caller_transaction_start
-- Nothing, sent through a caller's SQLAlchemy connection on asyncpg so that
-- SQLAlchemy begins its transaction before pgqueue's statements run on the
-- driver connection beneath (else they would commit on their own).
SELECT 1;

-- name: health_write_check
-- Fails (ReadOnlySqlTransaction) when this session cannot write: the
-- server is a standby, or writes are refused by default
-- (default_transaction_read_only, as on a primary being demoted). A
-- sequence step is the cheapest write; a fencing token skipped is harmless.
SELECT nextval('pgqueue_lease_token_seq');

-- name: migration_applied
-- Versions already applied.
SELECT version FROM pgqueue_migrations ORDER BY version;

-- name: migration_index_valid
-- Whether an index of that name is valid (no row: there is none); a
-- CREATE INDEX CONCURRENTLY cut short leaves it invalid (db/migrate.py).
SELECT i.indisvalid AS valid FROM pg_index i WHERE i.indexrelid = to_regclass(%(name)s);

-- name: migration_record
-- Record one applied version.
INSERT INTO pgqueue_migrations (version) VALUES (%(version)s);

-- The doctor (core/health.py): what the database says of its own capacity
-- and of what threatens it. Every statement here reads; none needs a
-- superuser: what a role may not see comes back NULL, and the checks say so.

-- name: health_sample_server
-- The server's side of one sample of the doctor's window: the database
-- clock, the WAL position (of the whole server: every database's writes),
-- and this database's cumulative transactions and time spent in statements
-- (pg_stat_database, flushed by each session about once a second).
SELECT clock_timestamp() AS at,
       ((CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn()
              ELSE pg_current_wal_lsn() END) - '0/0'::pg_lsn)::bigint AS wal_bytes,
       d.xact_commit::bigint AS xact_commit,
       d.active_time::double precision AS active_ms
FROM pg_stat_database d
WHERE d.datname = current_database();

-- name: health_sample_jobs
-- The jobs that ended (succeeded or dead) since the queues began: the
-- counters the transitions write in their own transaction, so the
-- difference of two samples is exact.
SELECT coalesce(sum(succeeded + dead), 0)::bigint AS finished FROM pgqueue_counters;

-- name: health_statements_available
-- Whether pg_stat_statements can be read here: the view exists in this
-- database and its library is loaded (its settings then have their types;
-- reading the view without the library raises).
SELECT to_regclass('pg_stat_statements') IS NOT NULL
       AND EXISTS (SELECT 1 FROM pg_settings
                   WHERE name = 'pg_stat_statements.max' AND vartype = 'integer') AS available;

-- name: health_sample_statements
-- The executor time of pgqueue's statements in this database so far: those
-- whose text names one of its tables or functions (the doctor's own, which
-- read pg_stat views, left out). Another role's statements show no text
-- unless this role has pg_read_all_stats, and are then left out too.
SELECT coalesce(sum(s.total_exec_time), 0)::double precision AS exec_ms,
       coalesce(sum(s.calls), 0)::bigint AS calls
FROM pg_stat_statements s
WHERE s.dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND s.toplevel
  AND s.query LIKE '%%pgqueue\_%%'
  AND s.query NOT LIKE '%%pg\_stat%%';

-- name: health_server
-- The settings that decide whether an acknowledged job survives a crash or
-- a failover, the standbys connected (whether one is synchronous is
-- visible only with pg_read_all_stats), and what this role may do.
SELECT current_user AS role,
       pg_is_in_recovery() AS standby,
       pg_has_role('pg_read_all_stats', 'USAGE') AS read_all_stats,
       current_setting('fsync') AS fsync,
       current_setting('full_page_writes') AS full_page_writes,
       current_setting('synchronous_commit') AS synchronous_commit,
       current_setting('synchronous_standby_names') AS synchronous_standby_names,
       current_setting('autovacuum') AS autovacuum,
       current_setting('autovacuum_vacuum_threshold')::double precision AS vacuum_threshold,
       current_setting('autovacuum_vacuum_scale_factor')::double precision AS vacuum_scale_factor,
       current_setting('autovacuum_analyze_threshold')::double precision AS analyze_threshold,
       current_setting('autovacuum_analyze_scale_factor')::double precision AS analyze_scale_factor,
       (SELECT count(*) FROM pg_stat_replication)::integer AS standbys,
       (SELECT count(*) FROM pg_stat_replication
        WHERE sync_state IN ('sync', 'quorum'))::integer AS synchronous_standbys,
       (SELECT count(*) FROM pg_stat_replication WHERE sync_state IS NULL)::integer
           AS hidden_standbys,
       coalesce(has_table_privilege(to_regclass('pgqueue_jobs'), 'UPDATE')
                AND has_table_privilege(to_regclass('pgqueue_queues'), 'SELECT')
                AND has_table_privilege(to_regclass('pgqueue_start_latency'), 'INSERT')
                AND has_sequence_privilege(to_regclass('pgqueue_lease_token_seq'), 'USAGE'),
                false) AS may_claim;

-- name: health_transactions
-- The sessions of this database (other than this one) in a transaction or
-- holding a snapshot: how long (NULL: another role's, not visible to this
-- one without pg_read_all_stats) and how many transactions of dead rows
-- they keep vacuum from removing (visible to every role). Autovacuum's
-- workers hold back no vacuum, and are left out (when they are visible).
-- And the transactions prepared for a two-phase commit in this database
-- (pg_prepared_xacts, visible to every role): no session shows them, and
-- one its coordinator never finished holds vacuum back until it is
-- committed or rolled back by hand (pid NULL, `gid` its name).
SELECT a.pid, a.usename AS role, a.application_name, a.state, a.backend_type,
       NULL AS gid,
       extract(epoch FROM clock_timestamp() - a.xact_start)::double precision AS seconds,
       age(a.backend_xmin)::bigint AS xmin_age,
       age(a.backend_xid)::bigint AS xid_age
FROM pg_stat_activity a
WHERE a.datname = current_database()
  AND a.pid <> pg_backend_pid()
  AND a.backend_type IS DISTINCT FROM 'autovacuum worker'
  AND (a.xact_start IS NOT NULL OR a.backend_xmin IS NOT NULL OR a.backend_xid IS NOT NULL)
UNION ALL
SELECT NULL, p.owner, NULL, 'prepared', 'prepared transaction', p.gid,
       extract(epoch FROM clock_timestamp() - p.prepared)::double precision,
       NULL, age(p.transaction)::bigint
FROM pg_prepared_xacts p
WHERE p.database = current_database()
ORDER BY seconds DESC NULLS LAST, pid;

-- name: health_tables
-- pgqueue's tables as the statistics collector and the planner see them:
-- live and dead row versions, changes since the last ANALYZE, the rows the
-- planner believes the table has (reltuples: -1 when never analyzed), and
-- when each was last vacuumed and analyzed (by hand or by autovacuum).
SELECT s.relname AS name, s.n_live_tup::bigint AS live, s.n_dead_tup::bigint AS dead,
       s.n_mod_since_analyze::bigint AS changed, c.reltuples::double precision AS planned,
       extract(epoch FROM clock_timestamp() - greatest(s.last_vacuum, s.last_autovacuum))
           ::double precision AS vacuumed_seconds_ago,
       extract(epoch FROM clock_timestamp() - greatest(s.last_analyze, s.last_autoanalyze))
           ::double precision AS analyzed_seconds_ago,
       EXISTS (SELECT 1 FROM unnest(c.reloptions) o
               WHERE o ~* '^autovacuum_enabled=(false|off|no|0)$') AS autovacuum_off
FROM pg_stat_user_tables s
JOIN pg_class c ON c.oid = s.relid
WHERE s.relname LIKE 'pgqueue\_%%' AND s.schemaname = current_schema()
ORDER BY s.relname;

-- name: health_stuck
-- Running jobs whose lease expired more than `grace_seconds` ago: a
-- running worker's reaper would have taken them back by now.
SELECT count(*)::bigint AS jobs,
       coalesce(max(extract(epoch FROM now() - lease_expires_at)), 0)::double precision
           AS oldest_seconds
FROM pgqueue_jobs
WHERE state = 'running'
  AND lease_expires_at < now() - make_interval(secs => %(grace_seconds)s);

-- name: health_slots
-- The server's replication slots: whether a consumer is connected, the WAL
-- each keeps from being recycled (from its restart_lsn to now) and how far
-- its xmin (a standby's hot_standby_feedback) holds back vacuum.
SELECT slot_name AS name, slot_type AS type, active,
       (CASE WHEN pg_is_in_recovery() THEN NULL
             ELSE pg_current_wal_lsn() - restart_lsn END)::bigint AS retained_bytes,
       age(xmin)::bigint AS xmin_age
FROM pg_replication_slots
ORDER BY slot_name;
