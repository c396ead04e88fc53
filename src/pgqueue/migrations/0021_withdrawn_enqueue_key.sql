-- Migration 0009_enqueue_retry gave single enqueues a key column of their
-- own, enqueue_key, with a unique index; it was withdrawn (a call's key is
-- the ids it reserves) and deleted. A database migrated while it existed
-- still has the column and its index, which no statement reads or writes:
-- both go, so that every database has the schema a fresh one has.
-- Elsewhere this does nothing and takes no lock on pgqueue_jobs.
DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_attribute
               WHERE attrelid = 'pgqueue_jobs'::regclass
                 AND attname = 'enqueue_key' AND NOT attisdropped) THEN
        ALTER TABLE pgqueue_jobs DROP COLUMN enqueue_key;  -- and its index
    END IF;
END
$$;
