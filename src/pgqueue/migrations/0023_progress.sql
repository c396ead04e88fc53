-- A running job's progress, as its handler reports it (job.progress()):
-- the latest fraction done (0 to 1), what the handler said with it (JSON,
-- NULL when nothing), and when the worker wrote it. One value per job,
-- overwritten (no row per call); NULL for a job that never reported any.
-- New nullable columns without a default: no rewrite of the table.
ALTER TABLE pgqueue_jobs
    ADD COLUMN progress_fraction double precision,
    ADD COLUMN progress_info     jsonb,
    ADD COLUMN progress_at       timestamptz;
