-- Unique jobs: the idempotency key becomes the one key of a job, held for
-- as long as its unique_scope says (River's approach: the row carries its
-- scope, and a partial unique index whose predicate says whether the row
-- holds its key now). A transition that moves a row out of its scope
-- releases the key with no statement of its own; an enqueue that finds the
-- key held inserts nothing (ON CONFLICT against this index), and a rolled
-- back holder never held it.
--
--   queued  from enqueue until the job's first attempt starts (started_at is
--           set by the claim and cleared only by an operator's retry)
--   active  while queued or running: until it succeeds, dies or is cancelled
--   always  in every state, until the row is deleted (retention, bulk
--           delete): what an idempotency key meant before this migration,
--           and what a key without a scope (NULL, rows stored before) means
--
-- No worker transition can take a key: a claim or a failed attempt only ever
-- moves a row into fewer holding states, so job_claim, job_finish and
-- job_reap can never meet a unique violation. Only enqueue and an operator's
-- retry take a key, and both check for it.
ALTER TABLE pgqueue_jobs ADD COLUMN unique_scope text
    CHECK (unique_scope IN ('queued', 'active', 'always'));

-- Whether a row holds its key. IMMUTABLE so that an index predicate may use
-- it; a single SQL expression, so that the planner inlines it.
CREATE FUNCTION pgqueue_key_held(scope text, state text, started_at timestamptz)
RETURNS boolean LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE scope
        WHEN 'queued' THEN state = 'queued' AND started_at IS NULL
        WHEN 'active' THEN state IN ('queued', 'running')
        ELSE true
    END
$$;

-- Rows without a key (the common case) fail the first test and are never in
-- the index, so jobs without a key pay nothing for it.
CREATE UNIQUE INDEX pgqueue_jobs_key ON pgqueue_jobs (idempotency_key)
    WHERE idempotency_key IS NOT NULL AND pgqueue_key_held(unique_scope, state, started_at);
DROP INDEX pgqueue_jobs_idempotency;
