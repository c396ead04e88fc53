-- Schedules created at run time (Queue.create_schedule, POST /schedules,
-- `pgqueue schedules create`), stored beside those declared in workers' code.
--
--   origin   'code': written by a worker's start from its code (schedule_upsert),
--            retired when the code drops it; 'runtime': created and changed by
--            an operator, never written or retired by a worker's start.
--
-- A name belongs to one origin: a runtime create of a name in the table is
-- refused (409), and a worker whose code declares a name a runtime schedule
-- holds leaves that schedule as it is (and logs schedule_shadowed).
-- Existing rows were all written from code. A constant default: no rewrite.
ALTER TABLE pgqueue_schedules
    ADD COLUMN origin text NOT NULL DEFAULT 'code' CHECK (origin IN ('code', 'runtime'));
