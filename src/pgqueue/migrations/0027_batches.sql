-- Batches: jobs grouped under a batch id while the batch is open, and
-- callback jobs enqueued exactly once when the batch is closed and every
-- job of it has ended (docs/howto/batches.md).
--
-- A batch's row holds its counters: how many jobs joined it (`total`), how
-- many have not ended (`pending`) and how many ended in each way. Every
-- statement that moves a job of a batch into or out of an end state updates
-- them through pgqueue_batch_moved, in its own transaction and under the
-- batch row's lock; the statement that makes `pending` 0 on a closed batch
-- (the last ack, reap or cancel), or the close that finds it 0, moves the
-- batch to `finished` and inserts its callback jobs. The row lock makes
-- that happen once whatever runs at the same moment: two last acks, or a
-- close and the last ack, take it one after the other, and the second sees
-- what the first wrote.
--
--   state      open (jobs may join), closed (none may; callbacks when the
--              last job ends), finished (callbacks enqueued; its counters
--              are frozen: a job retried afterwards fires nothing again)
--   callbacks  the jobs to enqueue, by when: on_success (every job
--              succeeded), on_death (at least one died), on_finish (always),
--              each a JSON object of checked job fields (core/batches.py)
--   fired      the callback jobs' ids, by when, once finished
CREATE TABLE pgqueue_batches (
    id          uuid        PRIMARY KEY,
    state       text        NOT NULL DEFAULT 'open'
        CHECK (state IN ('open', 'closed', 'finished')),
    callbacks   jsonb       NOT NULL DEFAULT '{}'::jsonb,
    metadata    jsonb,
    total       integer     NOT NULL DEFAULT 0,
    pending     integer     NOT NULL DEFAULT 0,
    succeeded   integer     NOT NULL DEFAULT 0,
    dead        integer     NOT NULL DEFAULT 0,
    cancelled   integer     NOT NULL DEFAULT 0,
    fired       jsonb,
    created_at  timestamptz NOT NULL DEFAULT now(),
    closed_at   timestamptz,
    finished_at timestamptz
);

-- Retention reads only finished batches, oldest first (job_prune deletes
-- them with the finished jobs, after the same retention period).
CREATE INDEX pgqueue_batches_finished ON pgqueue_batches (finished_at)
    WHERE state = 'finished';

-- The batch a job joined. Nullable without a default: adding it rewrites
-- nothing. The statements that end jobs look at the batches only for rows
-- where it is set, so plain jobs pay nothing. Its index,
-- pgqueue_jobs_batch, is built CONCURRENTLY by 0033.
ALTER TABLE pgqueue_jobs ADD COLUMN batch_id uuid;

-- Enqueue a finished batch's callbacks (called by pgqueue_batch_moved and
-- pgqueue_batch_close, with the batch's row locked and its state just set
-- to finished): on_success when every job succeeded, on_death when one
-- died, on_finish in any case. Each callback job's metadata gets the key
-- `batch`: the batch's id, which callback, its counters and its metadata.
-- Its queue's workers are woken and it is counted as enqueued, as every
-- enqueue is.
CREATE FUNCTION pgqueue_batch_fire(batch uuid) RETURNS integer
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    b pgqueue_batches;
    name text;
    spec jsonb;
    new_id bigint;
    done jsonb := '{}'::jsonb;
BEGIN
    SELECT * INTO b FROM pgqueue_batches WHERE id = batch;
    FOREACH name IN ARRAY ARRAY['on_success', 'on_death', 'on_finish'] LOOP
        spec := b.callbacks -> name;
        CONTINUE WHEN spec IS NULL
            OR (name = 'on_success' AND (b.dead > 0 OR b.cancelled > 0))
            OR (name = 'on_death' AND b.dead = 0);
        INSERT INTO pgqueue_jobs (queue, task, payload, priority, run_at, max_attempts,
                                  timeout_seconds, concurrency_key, metadata)
        VALUES (spec ->> 'queue', spec ->> 'task', coalesce(spec -> 'payload', '{}'::jsonb),
                (spec ->> 'priority')::integer,
                now() + make_interval(secs => coalesce((spec ->> 'delay_seconds')::float8, 0)),
                (spec ->> 'max_attempts')::integer, (spec ->> 'timeout_seconds')::float8,
                spec ->> 'concurrency_key',
                CASE WHEN jsonb_typeof(spec -> 'metadata') = 'object' THEN spec -> 'metadata'
                     ELSE '{}'::jsonb END || jsonb_build_object('batch',
                    jsonb_build_object('id', b.id, 'callback', name, 'total', b.total,
                                       'succeeded', b.succeeded, 'dead', b.dead,
                                       'cancelled', b.cancelled, 'metadata', b.metadata)))
        RETURNING id INTO new_id;
        PERFORM pg_notify('pgqueue_jobs', spec ->> 'queue');
        INSERT INTO pgqueue_enqueued (queue, n) VALUES (spec ->> 'queue', 1);
        done := done || jsonb_build_object(name, new_id);
    END LOOP;
    UPDATE pgqueue_batches SET fired = done WHERE id = batch;
    RETURN (SELECT count(*) FROM jsonb_object_keys(done));
END
$$;

-- Count the jobs of batches that moved: job i of batch `batches[i]` went
-- from state `was[i]` (NULL: it was just inserted) to `became[i]`. Called
-- by the statements that insert, end and retry jobs, only for rows with a
-- batch_id, in the same transaction. The batches are locked in id order
-- first (two statements over overlapping batches never deadlock), then
-- their counters change in a statement of its own, which sees the newest
-- committed row: a closed batch whose last job just ended is finished here,
-- and its callbacks enqueued. A finished batch changes no more. Returns how
-- many batches finished.
CREATE FUNCTION pgqueue_batch_moved(batches uuid[], was text[], became text[]) RETURNS integer
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    finished uuid[];
    one uuid;
BEGIN
    PERFORM 1 FROM pgqueue_batches WHERE id = ANY(batches) ORDER BY id FOR NO KEY UPDATE;
    WITH moved AS (
        SELECT * FROM unnest(batches, was, became) AS m(batch, before, after)
    ), delta AS (
        SELECT m.batch,
               count(*) FILTER (WHERE m.before IS NULL) AS joined,
               count(*) FILTER (WHERE m.after IN ('waiting', 'queued', 'running'))
                 - count(*) FILTER (WHERE m.before IN ('waiting', 'queued', 'running')) AS pending,
               count(*) FILTER (WHERE m.after = 'succeeded')
                 - count(*) FILTER (WHERE m.before = 'succeeded') AS succeeded,
               count(*) FILTER (WHERE m.after = 'dead')
                 - count(*) FILTER (WHERE m.before = 'dead') AS dead,
               count(*) FILTER (WHERE m.after = 'cancelled')
                 - count(*) FILTER (WHERE m.before = 'cancelled') AS cancelled
        FROM moved m GROUP BY m.batch
    ), changed AS (
        UPDATE pgqueue_batches b
        SET total = b.total + d.joined, pending = b.pending + d.pending,
            succeeded = b.succeeded + d.succeeded, dead = b.dead + d.dead,
            cancelled = b.cancelled + d.cancelled,
            state = CASE WHEN b.state = 'closed' AND b.pending + d.pending <= 0
                         THEN 'finished' ELSE b.state END,
            finished_at = CASE WHEN b.state = 'closed' AND b.pending + d.pending <= 0
                               THEN now() END
        FROM delta d
        WHERE b.id = d.batch AND b.state <> 'finished'
        RETURNING b.id, b.state
    )
    SELECT array_agg(c.id ORDER BY c.id) FILTER (WHERE c.state = 'finished') INTO finished
    FROM changed c;
    FOREACH one IN ARRAY coalesce(finished, '{}'::uuid[]) LOOP
        PERFORM pgqueue_batch_fire(one);
    END LOOP;
    RETURN coalesce(cardinality(finished), 0);
END
$$;

-- Close a batch: no job may join it any more. If every job of it has
-- already ended (or it has none), it is finished at once and its callbacks
-- enqueued here; otherwise the statement that ends its last job does it.
-- Returns the batch's state after the call (a batch already closed or
-- finished stays as it is), or NULL when there is no such batch.
CREATE FUNCTION pgqueue_batch_close(batch uuid) RETURNS text
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    now_state text;
BEGIN
    UPDATE pgqueue_batches
    SET state = CASE WHEN pending <= 0 THEN 'finished' ELSE 'closed' END,
        closed_at = now(),
        finished_at = CASE WHEN pending <= 0 THEN now() END
    WHERE id = batch AND state = 'open'
    RETURNING state INTO now_state;
    IF now_state IS NULL THEN
        RETURN (SELECT state FROM pgqueue_batches WHERE id = batch);
    END IF;
    IF now_state = 'finished' THEN
        PERFORM pgqueue_batch_fire(batch);
    END IF;
    RETURN now_state;
END
$$;
