-- Durable steps (job.step()): the result of each step a job's handler
-- completed, by name, so that a later attempt of the job (a retry after a
-- failure or a crash, an operator's retry) returns it instead of running
-- the step again. Written one row per step, fenced by the attempt's token
-- (job_step_record); read once per attempt (job_steps), by the primary
-- key's prefix. No foreign key: TRUNCATE pgqueue_jobs keeps working, and
-- the statements that delete jobs (job_prune, job_bulk_finished) delete
-- their steps too.
CREATE TABLE pgqueue_job_steps (
    job_id bigint      NOT NULL,
    name   text        NOT NULL,
    result jsonb       NOT NULL,
    at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (job_id, name)
);

-- The handler's last checkpoint (job.checkpoint()): one value per job,
-- overwritten, claimed with the job (job.last_checkpoint). A new nullable
-- column without a default: no rewrite of the table.
ALTER TABLE pgqueue_jobs ADD COLUMN last_checkpoint jsonb;
