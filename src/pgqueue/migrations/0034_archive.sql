-- The archive: succeeded jobs leave the hot table for a table partitioned
-- by day of finished_at (docs/howto/retention.md). Maintenance moves them
-- (job_archive) Settings.archive_after_seconds after they finished, in
-- batches; retention drops whole days (pgqueue_archive_drop) instead of
-- deleting rows one by one. The hot table then holds the jobs still to run
-- and the last minutes of history, whatever the history's size, so the
-- claim, the ack and the reads of live jobs never meet it.
--
-- Only rows nothing refers to any more are moved: succeeded jobs outside
-- workflows and batches, with no dependents, holding no unique key (a key
-- held `always` is held until retention). Everything else stays in the hot
-- table until job_prune, as before. A job retried, a parent awaited, a key
-- looked up: all still find their rows where they were.
--
-- Same columns as pgqueue_jobs, in the same order (`INSERT ... SELECT *`
-- moves a row): a migration that adds a column to one adds it to the other
-- (tests/integration/schema/test_archive_schema.py fails otherwise). LIKE
-- copies the columns and their NOT NULL, not the identity, the defaults or
-- the checks: a row is only ever copied in.
CREATE TABLE pgqueue_jobs_archive (LIKE pgqueue_jobs)
PARTITION BY RANGE (finished_at);
ALTER TABLE pgqueue_jobs_archive ALTER COLUMN finished_at SET NOT NULL;

-- By id only (GET /jobs/{id}, wait(), listings newest first: a Merge Append
-- of the partitions' indexes, which stops after the page). Each partition
-- gets its own; the table's rows are immutable, so no other index pays.
CREATE INDEX pgqueue_jobs_archive_id ON pgqueue_jobs_archive (id);

-- The day partitions, pgqueue_jobs_archive_YYYYMMDD, each [day, day + 1)
-- in UTC, created on demand for the days from `since` to `until`: the
-- mover calls it, in a transaction of its own, before each round.
-- Idempotent, and safe when several workers call it at once: a missing day
-- is created under a transaction-scoped advisory lock, and one created
-- meanwhile by another caller is taken as it is. Returns how many
-- partitions it created.
CREATE FUNCTION pgqueue_archive_partitions(since timestamptz, until timestamptz)
RETURNS integer LANGUAGE plpgsql VOLATILE
-- Creating a partition takes the archive's lock: rather than queue every
-- read of the archive behind a long read that holds it, give up (this
-- round of moves fails, the next tries again).
SET lock_timeout = '5s' AS $$
DECLARE
    day date := (since AT TIME ZONE 'UTC')::date;
    last_day date := (until AT TIME ZONE 'UTC')::date;
    part text;
    created integer := 0;
BEGIN
    WHILE day <= last_day LOOP
        part := 'pgqueue_jobs_archive_' || to_char(day, 'YYYYMMDD');
        IF to_regclass(quote_ident(part)) IS NULL THEN
            -- Callers create one at a time; one that finds the partition
            -- made meanwhile (its catalog cache may not show it yet) goes on.
            PERFORM pg_advisory_xact_lock(hashtext('pgqueue_jobs_archive'));
            BEGIN
                EXECUTE format(
                    'CREATE TABLE %I PARTITION OF pgqueue_jobs_archive FOR VALUES FROM (%L) TO (%L)',
                    part, day::timestamp AT TIME ZONE 'UTC', (day + 1)::timestamp AT TIME ZONE 'UTC');
                created := created + 1;
            EXCEPTION WHEN duplicate_table THEN
                NULL;
            END;
        END IF;
        day := day + 1;
    END LOOP;
    RETURN created;
END
$$;

-- Retention: drop the partitions wholly older than `before` (their last
-- moment is before it). No row is read or deleted: a partition goes as one
-- file. Under the same advisory lock as pgqueue_archive_partitions. Returns
-- the partitions dropped, by name, with their rows as the statistics last
-- counted them (-1: never analyzed).
CREATE FUNCTION pgqueue_archive_drop(before timestamptz)
RETURNS TABLE (partition_name text, estimated_rows bigint)
LANGUAGE plpgsql VOLATILE
SET lock_timeout = '5s' AS $$
#variable_conflict use_column
DECLARE
    part record;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('pgqueue_jobs_archive'));
    FOR part IN
        SELECT c.relname, c.reltuples::bigint AS n
        FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
        WHERE i.inhparent = 'pgqueue_jobs_archive'::regclass
          AND c.relname ~ '^pgqueue_jobs_archive_[0-9]{8}$'
          AND (to_date(right(c.relname, 8), 'YYYYMMDD') + 1)::timestamp AT TIME ZONE 'UTC'
              <= before
        ORDER BY c.relname
    LOOP
        EXECUTE format('DROP TABLE %I', part.relname);
        partition_name := part.relname;
        estimated_rows := part.n;
        RETURN NEXT;
    END LOOP;
END
$$;
