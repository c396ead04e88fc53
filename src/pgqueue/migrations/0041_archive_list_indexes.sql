-- The archive's lists filtered by queue or by task (job_list and
-- job_list_summary: GET /jobs?queue=, ?task=, `pgqueue jobs list`, the
-- dashboard) walked every partition's id index back from the newest job,
-- reading each archived row until a page matched: for a task or a queue
-- that is rare in the history, the whole history. These walk only that
-- queue's or task's entries, newest first in each partition, merged.
--
-- Each archived row pays two more index entries when it moves (job_archive),
-- once. Built here on every partition in one statement (a partitioned table
-- has no concurrent build): for the time of the build, the archive's moves
-- and drops wait; nothing else does (reads, enqueues, claims and acks do not
-- touch the archive's lock in a conflicting mode).
CREATE INDEX IF NOT EXISTS pgqueue_jobs_archive_queue ON pgqueue_jobs_archive (queue, id);
CREATE INDEX IF NOT EXISTS pgqueue_jobs_archive_task ON pgqueue_jobs_archive (task, id);
