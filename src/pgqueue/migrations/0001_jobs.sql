-- The jobs table, its indexes, the outcome counters and the backoff function.
--
-- One row per job. A row is updated a handful of times in its life (claim,
-- heartbeats, ack) and deleted by retention, so the table is tuned for churn:
--   * fillfactor 70 leaves room on each page so that updates which touch no
--     indexed column (heartbeats, most of ack) become HOT updates: no new index
--     entries, and the dead tuple is pruned in-page without waiting for vacuum.
--   * per-table autovacuum thresholds are set by fraction *and* small fixed
--     numbers so that vacuum runs on the churn rate, not on the table's size.
CREATE TABLE pgqueue_jobs (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue            text        NOT NULL DEFAULT 'default',
    task             text        NOT NULL,
    payload          jsonb       NOT NULL DEFAULT '{}'::jsonb,
    priority         integer     NOT NULL DEFAULT 0,
    state            text        NOT NULL DEFAULT 'queued'
        CHECK (state IN ('queued', 'running', 'succeeded', 'dead', 'cancelled')),
    run_at           timestamptz NOT NULL DEFAULT now(),
    attempts         integer     NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    max_attempts     integer     NOT NULL DEFAULT 5 CHECK (max_attempts >= 1),
    timeout_seconds  double precision CHECK (timeout_seconds > 0),
    lease_token      bigint,
    lease_expires_at timestamptz,
    worker           text,
    last_error       text,
    result           jsonb,
    idempotency_key  text,
    enqueued_at      timestamptz NOT NULL DEFAULT now(),
    started_at       timestamptz,
    finished_at      timestamptz
) WITH (
    fillfactor = 70,
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_vacuum_insert_scale_factor = 0.01,
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_vacuum_cost_delay = 0
);

-- Claiming reads only runnable rows, in claim order. Two shapes: across all
-- queues, and within one queue (so that a worker pool of one queue is not
-- slowed by another queue's flood).
CREATE INDEX pgqueue_jobs_claim ON pgqueue_jobs (priority DESC, run_at, id)
    WHERE state = 'queued';
CREATE INDEX pgqueue_jobs_claim_queue ON pgqueue_jobs (queue, priority DESC, run_at, id)
    WHERE state = 'queued';
-- Reaping reads only running rows, oldest lease first.
CREATE INDEX pgqueue_jobs_reap ON pgqueue_jobs (lease_expires_at)
    WHERE state = 'running';
-- Retention reads only finished rows, oldest first.
CREATE INDEX pgqueue_jobs_finished ON pgqueue_jobs (finished_at)
    WHERE state IN ('succeeded', 'dead', 'cancelled');
CREATE UNIQUE INDEX pgqueue_jobs_idempotency ON pgqueue_jobs (idempotency_key)
    WHERE idempotency_key IS NOT NULL;

-- Fencing tokens: every claim takes a new one, so a token names one attempt.
CREATE SEQUENCE pgqueue_lease_token_seq CACHE 100;

-- Outcome counters, monotonic across retention pruning and restarts. Written
-- by the same statement that makes the transition. Each backend writes its
-- own shard so that concurrent workers do not queue on one counter row.
CREATE TABLE pgqueue_counters (
    queue     text    NOT NULL,
    shard     integer NOT NULL,
    succeeded bigint  NOT NULL DEFAULT 0,
    failed    bigint  NOT NULL DEFAULT 0,
    dead      bigint  NOT NULL DEFAULT 0,
    cancelled bigint  NOT NULL DEFAULT 0,
    PRIMARY KEY (queue, shard)
) WITH (fillfactor = 50);

-- Histogram of enqueue-to-start latency (from when the job became runnable to
-- its claim), one row per queue, shard and bucket; written at claim time.
CREATE TABLE pgqueue_start_latency (
    queue       text             NOT NULL,
    shard       integer          NOT NULL,
    bucket      integer          NOT NULL,
    count       bigint           NOT NULL DEFAULT 0,
    sum_seconds double precision NOT NULL DEFAULT 0,
    PRIMARY KEY (queue, shard, bucket)
) WITH (fillfactor = 50);

-- Retry delay after the given attempt: base * 2^(attempt-1), capped; half of
-- it fixed and half random, so that jobs that failed together do not all
-- come back together.
CREATE FUNCTION pgqueue_backoff(attempt integer, base_seconds double precision,
                                cap_seconds double precision)
RETURNS interval LANGUAGE sql VOLATILE PARALLEL SAFE AS $$
    SELECT make_interval(secs => d / 2 + random() * d / 2)
    FROM (SELECT least(cap_seconds,
                       base_seconds * power(2::double precision, least(greatest(attempt, 1) - 1, 60))) AS d) s
$$;
