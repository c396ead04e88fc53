-- pgqueue: no-transaction
-- The jobs table's indexes of 0027 (batches) and 0031 (priority aging),
-- built CONCURRENTLY (db/migrate.py): the jobs table may hold millions of
-- rows, and a plain CREATE INDEX would hold off every enqueue, claim and
-- ack for the whole scan.

-- The jobs of batches only (GET /batches/{id} counts them by state): plain
-- jobs are never written to it.
CREATE INDEX CONCURRENTLY IF NOT EXISTS pgqueue_jobs_batch
    ON pgqueue_jobs (batch_id) WHERE batch_id IS NOT NULL;

-- The jobs aging can raise, by when they may take their next step: only
-- queued jobs of negative priority, so that jobs of priority 0 or more (the
-- common case) are never written to it, and a job leaves it when it starts
-- or reaches 0.
CREATE INDEX CONCURRENTLY IF NOT EXISTS pgqueue_jobs_aging
    ON pgqueue_jobs (greatest(run_at, aged_at)) WHERE state = 'queued' AND priority < 0;
