-- pgqueue: no-transaction
-- The workflows newest first (GET /workflows, pgqueue workflows list): a
-- walk down this index, one entry per workflow, read a page at a time after
-- a keyset cursor. Without it each page sorted every row of
-- pgqueue_workflows. A workflow's first job id is its place in time: its
-- jobs' ids are reserved together when it is enqueued (0014).
--
-- One entry is written per workflow, when it is enqueued (job_insert_graph);
-- claims and acks do not touch pgqueue_workflows. Built CONCURRENTLY
-- (db/migrate.py): workflow enqueues go on while the table is read.
CREATE INDEX CONCURRENTLY IF NOT EXISTS pgqueue_workflows_first_job
    ON pgqueue_workflows (first_job);
