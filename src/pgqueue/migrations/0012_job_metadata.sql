-- Job metadata: a JSON object beside the payload that is about the job, not
-- its arguments (the trace context of the code that enqueued it, under the
-- reserved key "otel": tracing.py; and whatever else a caller attaches).
--
-- Nullable without a default: adding it rewrites nothing and takes the
-- table's lock only for a moment, and a job without metadata stores nothing
-- more. No index: nothing looks jobs up by it.
ALTER TABLE pgqueue_jobs ADD COLUMN metadata jsonb;
