-- Signals (Queue.signal(), POST /jobs/{id}/signals/{name}): what was sent
-- to a job by name, with its payload, until a handler's
-- job.wait_for_signal() of that name consumes it: the oldest first, each
-- one once, deleted as it is consumed (in the same statement that stores
-- it as the wait's result, job_signal_wait). Read and deleted by the
-- primary key's prefix (job_id, name). No foreign key, as for
-- pgqueue_job_steps: the statements that delete jobs (job_prune,
-- job_bulk_finished) delete their signals too.
--
-- Durable sleeps and waits (job.sleep(), job.wait_for_signal()) need no
-- table of their own: each is a step of its job in pgqueue_job_steps, under
-- a name of pgqueue's ("pgqueue:sleep:<n>", "pgqueue:wait:<signal>:<n>"),
-- whose result holds its wake time or deadline and, once decided, its outcome.
CREATE TABLE pgqueue_job_signals (
    job_id  bigint      NOT NULL,
    name    text        NOT NULL,
    id      bigint      GENERATED ALWAYS AS IDENTITY,
    payload jsonb       NOT NULL,
    sent_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (job_id, name, id)
);
