-- Periodic jobs: one row per schedule, declared in a worker's code
-- (TaskRegistry.periodic, @task(cron=...)) and upserted when that worker starts.
--
-- A schedule fires a tick by enqueueing a job whose idempotency key names the
-- schedule and the tick, in the same statement that moves `next_run_at` to its
-- next tick (schedule_fire). That statement matches the row only while it still
-- has the `next_run_at` the scheduler planned from, so of many schedulers that
-- planned the same tick exactly one enqueues it; the unique key is the second
-- fence, for a schedule deleted and declared again.
--
--   cron / every_seconds  the timing: a cron expression (5 fields, or 6 with
--                         seconds first) in the zone `tz`, or a whole number of
--                         seconds counted from 1970-01-01 UTC; exactly one
--   catch_up              what a scheduler does with ticks it finds in the past
--                         (after every worker was down): 'none' enqueues only a
--                         tick less than a minute late, 'last' the newest one,
--                         'all' up to `catch_up_limit` of the newest
--   enabled               the operators' switch (never written by the upsert)
--   next_run_at           the next tick; NULL when there is none to plan
--   last_tick, last_run_at, last_job_id
--                         the newest tick enqueued, when, and its job
--   retired_at            set when a worker that handles `task` starts without
--                         declaring this schedule: it was removed from the
--                         code, and fires no more until declared again
--
-- Rows are few and each fire updates one (no indexed column changes): the
-- free space of fillfactor 50 keeps those updates HOT.
CREATE TABLE pgqueue_schedules (
    name            text        PRIMARY KEY,
    task            text        NOT NULL,
    payload         jsonb       NOT NULL DEFAULT '{}'::jsonb,
    queue           text        NOT NULL DEFAULT 'default',
    priority        integer     NOT NULL DEFAULT 0,
    max_attempts    integer     CHECK (max_attempts >= 1),
    timeout_seconds double precision CHECK (timeout_seconds > 0),
    cron            text,
    every_seconds   integer     CHECK (every_seconds >= 1),
    tz              text        NOT NULL DEFAULT 'UTC',
    catch_up        text        NOT NULL DEFAULT 'last'
        CHECK (catch_up IN ('none', 'last', 'all')),
    catch_up_limit  integer     NOT NULL DEFAULT 100 CHECK (catch_up_limit >= 1),
    enabled         boolean     NOT NULL DEFAULT true,
    next_run_at     timestamptz,
    last_tick       timestamptz,
    last_run_at     timestamptz,
    last_job_id     bigint,
    retired_at      timestamptz,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    CHECK ((cron IS NULL) <> (every_seconds IS NULL))
) WITH (fillfactor = 50);
