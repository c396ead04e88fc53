-- Latency objectives (docs/howto/limits.md, "Latency objectives"): a queue
-- may declare the longest its runnable jobs should wait to start. Workers
-- of several queues claim first from those whose oldest runnable job has
-- waited longest against their objective; /metrics, GET /queues and the
-- dashboard show how far each is behind it. A queue with an objective is
-- claimed as before (it is not `limited`): only the worker's choice of
-- which queue to ask first changes.
ALTER TABLE pgqueue_queues ADD COLUMN max_start_lag_seconds double precision
    CHECK (max_start_lag_seconds > 0);
