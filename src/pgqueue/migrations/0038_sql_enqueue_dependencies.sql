-- Enqueue from SQL with dependencies: pgqueue_enqueue(..., depends_on =>
-- ARRAY[ids], on_dependency_failure => 'cancel' | 'run') and the same
-- fields in pgqueue_enqueue_many's jobs, with the library's rules
-- (core/dependencies.py, enqueue_graph and plan; queries.sql
-- job_lock_parents and job_insert_graph, for one job): the parents locked
-- in id order so that none ends unseen while the edges are written, an
-- unknown id refused (22023, "depends_on: no job with id 7"), and the job
-- waiting, queued or, when a parent already died or was cancelled and the
-- policy is cancel, cancelled at once. No key and no batch with
-- dependencies (refused, as the library refuses them). With this, the SQL
-- functions take every field of Queue.enqueue.
--
-- The old signatures go, as in 0037.
DROP FUNCTION pgqueue_enqueue(text, jsonb, text, bigint, timestamptz, double precision, bigint,
                              double precision, text, text, double precision, text, jsonb, text,
                              uuid);
DROP FUNCTION pgqueue_enqueue_checked(text, text, jsonb, text, bigint, timestamptz,
                                      double precision, bigint, double precision, text, text,
                                      double precision, text, jsonb, text, uuid);

-- A checked job with dependencies, written: its parents locked and read,
-- its first state planned, the row, its edges, has_dependents on its
-- parents, and what every enqueue counts and wakes. `run_at` is the job's
-- (greatest of the asked time and now); `deps` the parents, without
-- repeats, in the order given.
CREATE FUNCTION pgqueue_enqueue_dependent(
    field text, new_task text, new_payload jsonb, new_queue text, new_priority bigint,
    new_run_at timestamptz, new_max_attempts bigint, new_timeout_seconds double precision,
    new_concurrency_key text, new_metadata jsonb, deps bigint[], policy text
) RETURNS bigint LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    locked bigint[];
    unfinished integer;
    failed boolean;
    first_state text;
    new_id bigint;
BEGIN
    -- queries.sql job_lock_parents: in id order, so that two enqueues never
    -- deadlock; a parent's finish waits for the new edge.
    SELECT coalesce(array_agg(p.id), '{}'),
           count(*) FILTER (WHERE p.state IN ('waiting', 'queued', 'running')),
           coalesce(bool_or(p.state IN ('dead', 'cancelled')), false)
    INTO locked, unfinished, failed
    FROM (SELECT id, state FROM pgqueue_jobs WHERE id = ANY(deps) ORDER BY id
          FOR NO KEY UPDATE) p;
    IF cardinality(locked) < cardinality(deps) THEN
        PERFORM pgqueue_invalid_job(field || 'depends_on', 'no job with id ' || (
            SELECT string_agg(i::text, ', ' ORDER BY n)
            FROM unnest(deps) WITH ORDINALITY AS u(i, n) WHERE i <> ALL (locked)));
    END IF;
    -- dependencies.plan, for one job.
    first_state := CASE WHEN failed AND policy = 'cancel' THEN 'cancelled'
                        WHEN unfinished > 0 THEN 'waiting' ELSE 'queued' END;
    -- queries.sql job_insert_graph, for one job.
    INSERT INTO pgqueue_jobs (queue, task, payload, priority, run_at, max_attempts,
                              timeout_seconds, concurrency_key, state, waiting_on,
                              on_dependency_failure, depends_on, finished_at, last_error,
                              metadata)
    VALUES (new_queue, new_task, new_payload, new_priority, new_run_at, new_max_attempts,
            new_timeout_seconds, new_concurrency_key, first_state,
            CASE WHEN first_state = 'cancelled' THEN 0 ELSE unfinished END, policy, deps,
            CASE WHEN first_state = 'cancelled' THEN now() END,
            CASE WHEN first_state = 'cancelled'
                 THEN 'cancelled: a job it depends on failed or was cancelled' END,
            new_metadata)
    RETURNING id INTO new_id;
    INSERT INTO pgqueue_job_deps (parent, child) SELECT parent, new_id FROM unnest(deps) AS parent;
    UPDATE pgqueue_jobs SET has_dependents = true WHERE id = ANY(deps) AND NOT has_dependents;
    IF first_state = 'cancelled' THEN
        INSERT INTO pgqueue_counters AS c (queue, shard, cancelled)
        VALUES (new_queue, pg_backend_pid() % 16, 1)
        ON CONFLICT (queue, shard) DO UPDATE SET cancelled = c.cancelled + excluded.cancelled;
    ELSIF first_state = 'queued' AND new_run_at <= now() THEN
        PERFORM pg_notify('pgqueue_jobs', new_queue);
    END IF;
    INSERT INTO pgqueue_enqueued (queue, n) VALUES (new_queue, 1);
    RETURN new_id;
END
$$;

-- One job, checked and written (0037's, with depends_on and
-- on_dependency_failure).
CREATE FUNCTION pgqueue_enqueue_checked(
    field text, new_task text, new_payload jsonb, new_queue text, new_priority bigint,
    new_run_at timestamptz, delay_seconds double precision, new_max_attempts bigint,
    new_timeout_seconds double precision, new_key text, new_scope text,
    unique_period_seconds double precision, new_concurrency_key text, new_metadata jsonb,
    new_on_conflict text, new_batch uuid, new_depends_on bigint[], new_on_dependency_failure text
) RETURNS bigint LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    ten_years CONSTANT double precision := 10 * 365 * 24 * 3600.0;  -- jobs.MAX_DELAY_SECONDS
    payload_or_empty jsonb := coalesce(new_payload, '{}');
    key text := new_key;
    scope text := new_scope;
    found_id bigint;
    found_run_at timestamptz;
    problem text;
    batch_state text;
    -- 'ignore' is the default: the holder is returned unchanged.
    on_conflict text := nullif(new_on_conflict, 'ignore');
    deps bigint[];
    policy text := new_on_dependency_failure;
BEGIN
    -- job_spec.JOB_FIELDS, field by field (the limits: jobs.py).
    IF new_task IS NULL THEN
        PERFORM pgqueue_invalid_job(field || 'task', 'missing');
    ELSIF new_task !~ '^[A-Za-z_][A-Za-z0-9_.:-]{0,199}$' THEN
        PERFORM pgqueue_invalid_job(field || 'task', format(
            '%L is not a valid task name: it must match [A-Za-z_][A-Za-z0-9_.:\-]{0,199}',
            left(new_task, 80)));
    END IF;
    PERFORM pgqueue_check_json(field || 'payload', payload_or_empty, 16 * 1024 * 1024);
    -- The top-level key of an encrypted payload's envelope (rules.SEALED_KEY).
    IF payload_or_empty ? 'pgqueue:sealed' THEN
        PERFORM pgqueue_invalid_job(field || 'payload.pgqueue:sealed',
            'this key is reserved for pgqueue''s own use');
    END IF;
    IF new_queue IS NULL THEN
        PERFORM pgqueue_invalid_job(field || 'queue', 'must be a string, got null');
    ELSIF new_queue !~ '^[A-Za-z0-9_][A-Za-z0-9_.-]{0,62}$' THEN
        PERFORM pgqueue_invalid_job(field || 'queue', format(
            '%L is not a valid queue name: it must match [A-Za-z0-9_][A-Za-z0-9_.\-]{0,62}',
            left(new_queue, 80)));
    END IF;
    IF new_priority IS NULL OR new_priority NOT BETWEEN -32767 AND 32767 THEN
        PERFORM pgqueue_invalid_job(field || 'priority', format(
            'must be between -32767 and 32767, got %s', coalesce(new_priority::text, 'null')));
    END IF;
    IF delay_seconds IS NOT NULL AND NOT (delay_seconds >= 0 AND delay_seconds <= ten_years) THEN
        PERFORM pgqueue_invalid_job(field || 'delay_seconds', format(
            'must be at least 0 and at most %s seconds, got %s', ten_years, delay_seconds));
    END IF;
    IF new_run_at IS NOT NULL THEN
        IF NOT (new_run_at >= '1970-01-01 00:00:00+00'
                AND new_run_at <= now() + make_interval(secs => ten_years)) THEN
            PERFORM pgqueue_invalid_job(field || 'run_at', format(
                'must be after 1970-01-01 and at most %s seconds from now', ten_years));
        END IF;
        IF delay_seconds IS NOT NULL THEN
            PERFORM pgqueue_invalid_job(field || 'run_at', 'give delay_seconds or run_at, not both');
        END IF;
    END IF;
    IF new_max_attempts IS NOT NULL AND new_max_attempts NOT BETWEEN 1 AND 1000 THEN
        PERFORM pgqueue_invalid_job(field || 'max_attempts', format(
            'must be between 1 and 1000, got %s', new_max_attempts));
    END IF;
    IF new_timeout_seconds IS NOT NULL
       AND NOT (new_timeout_seconds > 0 AND new_timeout_seconds <= 7 * 24 * 3600.0) THEN
        PERFORM pgqueue_invalid_job(field || 'timeout_seconds', format(
            'must be more than 0 and at most 604800 seconds, got %s', new_timeout_seconds));
    END IF;
    IF key IS NOT NULL AND char_length(key) NOT BETWEEN 1 AND 255 THEN
        PERFORM pgqueue_invalid_job(field || 'idempotency_key', 'must be 1 to 255 characters');
    END IF;
    IF scope IS NOT NULL AND scope NOT IN ('queued', 'active', 'always') THEN
        PERFORM pgqueue_invalid_job(field || 'unique_scope', format(
            'must be one of queued, active, always, got %L', left(scope, 40)));
    END IF;
    IF unique_period_seconds IS NOT NULL
       AND NOT (unique_period_seconds >= 1 AND unique_period_seconds <= ten_years) THEN
        PERFORM pgqueue_invalid_job(field || 'unique_period_seconds', format(
            'must be at least 1 and at most %s seconds, got %s', ten_years, unique_period_seconds));
    END IF;
    IF new_concurrency_key IS NOT NULL AND char_length(new_concurrency_key) NOT BETWEEN 1 AND 255 THEN
        PERFORM pgqueue_invalid_job(field || 'concurrency_key', 'must be 1 to 255 characters');
    END IF;
    IF new_metadata IS NOT NULL THEN
        PERFORM pgqueue_check_json(field || 'metadata', new_metadata, 16384);  -- MAX_METADATA_BYTES
    END IF;
    -- rules.JobIds: 1 to MAX_DEPENDENCIES ids, kept in the order given
    -- without repeats.
    IF new_depends_on IS NOT NULL THEN
        IF array_ndims(new_depends_on) IS DISTINCT FROM 1
           OR cardinality(new_depends_on) NOT BETWEEN 1 AND 100000 THEN
            PERFORM pgqueue_invalid_job(field || 'depends_on', 'must be a list of 1 to 100000 job ids');
        END IF;
        SELECT format('must hold job ids (positive integers), got %s', coalesce(i::text, 'None'))
        INTO problem FROM unnest(new_depends_on) WITH ORDINALITY AS u(i, n)
        WHERE i IS NULL OR i < 1 ORDER BY n LIMIT 1;
        IF problem IS NOT NULL THEN
            PERFORM pgqueue_invalid_job(field || 'depends_on', problem);
        END IF;
        SELECT array_agg(i ORDER BY n) INTO deps FROM (
            SELECT i, min(n) AS n FROM unnest(new_depends_on) WITH ORDINALITY AS u(i, n) GROUP BY i
        ) first_of_each;
    END IF;
    -- Not nullable (its default, cancel, is the caller's): null is refused,
    -- as the library refuses None.
    IF new_on_dependency_failure IS NULL OR new_on_dependency_failure NOT IN ('cancel', 'run') THEN
        PERFORM pgqueue_invalid_job(field || 'on_dependency_failure', format(
            'must be one of cancel, run, got %s',
            coalesce(quote_literal(left(new_on_dependency_failure, 40)), 'null')));
    END IF;
    IF new_on_conflict IS NOT NULL AND new_on_conflict NOT IN ('ignore', 'replace', 'extend') THEN
        PERFORM pgqueue_invalid_job(field || 'on_conflict', format(
            'must be one of ignore, replace, extend, got %L', left(new_on_conflict, 40)));
    END IF;

    -- job_spec._uniqueness: a scope or a period without a key is
    -- uniqueness by task and payload (payload_digest); a key without a
    -- scope is held always.
    IF key IS NULL AND (scope IS NOT NULL OR unique_period_seconds IS NOT NULL) THEN
        key := new_task || ':' || encode(sha256(convert_to(
            pgqueue_json_canonical(payload_or_empty), 'UTF8')), 'hex');
    END IF;
    IF new_batch IS NOT NULL AND deps IS NOT NULL THEN
        PERFORM pgqueue_invalid_job(field || 'batch', 'a job with dependencies cannot join a batch');
    ELSIF key IS NOT NULL AND deps IS NOT NULL THEN
        PERFORM pgqueue_invalid_job(field || 'depends_on',
            'a job with dependencies cannot have a key (unique jobs)');
    END IF;
    IF key IS NOT NULL THEN
        scope := coalesce(scope, 'always');
    ELSIF new_on_conflict IS NOT NULL THEN
        PERFORM pgqueue_invalid_job(field || 'on_conflict',
            'needs a key: give idempotency_key, unique_scope or unique_period_seconds');
    END IF;
    -- enqueue._in_period: each period's key is another key.
    IF unique_period_seconds IS NOT NULL THEN
        key := key || '@' || pgqueue_period_start(now(), unique_period_seconds);
    END IF;

    IF deps IS NOT NULL THEN
        RETURN pgqueue_enqueue_dependent(field, new_task, payload_or_empty, new_queue,
            new_priority, greatest(coalesce(new_run_at,
                                            now() + make_interval(secs => coalesce(delay_seconds, 0))),
                                   now()),
            coalesce(new_max_attempts, 5), new_timeout_seconds, new_concurrency_key, new_metadata,
            deps, policy);
    END IF;

    -- batches.lock_batches (queries.sql batch_lock): the batch is locked
    -- until the caller's transaction ends, so that no close slips between
    -- this job's insert and its count in the batch.
    IF new_batch IS NOT NULL THEN
        SELECT b.state INTO batch_state FROM pgqueue_batches b WHERE b.id = new_batch
        FOR NO KEY UPDATE;
        IF batch_state IS NULL THEN
            PERFORM pgqueue_invalid_job(field || 'batch', format('no batch has the id %s', new_batch));
        ELSIF batch_state <> 'open' THEN
            RAISE EXCEPTION USING ERRCODE = 'object_not_in_prerequisite_state',
                COLUMN = field || 'batch', MESSAGE = format(
                    '%sbatch: batch %s is %s: no job can join it', field, new_batch, batch_state);
        END IF;
    END IF;

    -- queries.sql job_enqueue. A conflicting insert may be in flight in
    -- another transaction: ON CONFLICT waits for it. The holder may let the
    -- key go between the two statements: then the next round inserts.
    FOR round IN 1..3 LOOP
        INSERT INTO pgqueue_jobs (queue, task, payload, priority, run_at, max_attempts,
                                  timeout_seconds, idempotency_key, unique_scope,
                                  concurrency_key, metadata, batch_id)
        VALUES (new_queue, new_task, payload_or_empty, new_priority,
                greatest(coalesce(new_run_at,
                                  now() + make_interval(secs => coalesce(delay_seconds, 0))),
                         now()),
                coalesce(new_max_attempts, 5), new_timeout_seconds, key, scope,
                new_concurrency_key, new_metadata, new_batch)
        ON CONFLICT (idempotency_key)
            WHERE idempotency_key IS NOT NULL AND pgqueue_key_held(unique_scope, state, started_at)
            DO NOTHING
        RETURNING id, run_at INTO found_id, found_run_at;
        IF found_id IS NOT NULL THEN
            -- NOTIFY is a hint that work is ready; delayed jobs need none.
            IF found_run_at <= now() THEN
                PERFORM pg_notify('pgqueue_jobs', new_queue);
            END IF;
            -- Counted for the per-minute history.
            INSERT INTO pgqueue_enqueued (queue, n) VALUES (new_queue, 1);
            IF new_batch IS NOT NULL THEN
                PERFORM pgqueue_batch_moved(ARRAY[new_batch], ARRAY[NULL::text], ARRAY['queued']);
            END IF;
            RETURN found_id;
        END IF;
        -- queries.sql job_debounce, in the same shape (the holder by its
        -- key's index, then by id whatever the statistics say): the holder,
        -- if still waiting, takes this job's payload, metadata and priority
        -- (and, to extend, its later run_at); one that started is left as
        -- it is.
        IF on_conflict IS NOT NULL THEN
            WITH holder AS MATERIALIZED (
                SELECT h.id FROM pgqueue_jobs h
                WHERE h.idempotency_key = key
                  AND pgqueue_key_held(h.unique_scope, h.state, h.started_at)
            )
            UPDATE pgqueue_jobs j SET
                payload = payload_or_empty,
                metadata = new_metadata,
                priority = new_priority,
                run_at = CASE WHEN on_conflict = 'extend'
                              THEN greatest(j.run_at, coalesce(new_run_at, now()
                                  + make_interval(secs => coalesce(delay_seconds, 0))))
                              ELSE j.run_at END
            FROM holder, (SELECT 'queued'::text OFFSET 0) AS expected(state)
            WHERE j.id = holder.id AND j.state = expected.state AND j.started_at IS NULL
            RETURNING j.id INTO found_id;
            IF found_id IS NOT NULL THEN
                RETURN found_id;
            END IF;
        END IF;
        SELECT j.id INTO found_id FROM pgqueue_jobs j
        WHERE j.idempotency_key = key AND pgqueue_key_held(j.unique_scope, j.state, j.started_at);
        IF found_id IS NOT NULL THEN
            RETURN found_id;
        END IF;
    END LOOP;
    RAISE EXCEPTION 'key % kept changing hands', key USING ERRCODE = 'serialization_failure';
END
$$;

-- Enqueue one job; returns its id (or the id of the job that holds its
-- key, changed first when on_conflict says so and it is still waiting).
CREATE FUNCTION pgqueue_enqueue(
    task text,
    payload jsonb DEFAULT '{}',
    queue text DEFAULT 'default',
    priority bigint DEFAULT 0,
    run_at timestamptz DEFAULT NULL,
    delay_seconds double precision DEFAULT NULL,
    max_attempts bigint DEFAULT NULL,
    timeout_seconds double precision DEFAULT NULL,
    idempotency_key text DEFAULT NULL,
    unique_scope text DEFAULT NULL,
    unique_period_seconds double precision DEFAULT NULL,
    concurrency_key text DEFAULT NULL,
    metadata jsonb DEFAULT NULL,
    on_conflict text DEFAULT NULL,
    batch uuid DEFAULT NULL,
    depends_on bigint[] DEFAULT NULL,
    on_dependency_failure text DEFAULT 'cancel'
) RETURNS bigint LANGUAGE sql VOLATILE AS $$
    SELECT pgqueue_enqueue_checked('', task, payload, queue, priority, run_at, delay_seconds,
                                   max_attempts, timeout_seconds, idempotency_key, unique_scope,
                                   unique_period_seconds, concurrency_key, metadata, on_conflict,
                                   batch, depends_on, on_dependency_failure)
$$;

-- Enqueue an array of jobs, each an object of pgqueue_enqueue's fields (the
-- names of JobSpec.from_fields: delay and timeout are aliases; a null
-- optional field takes its default); returns their ids in the array's
-- order. One bad job writes nothing: the error names it, jobs[3].priority.
CREATE OR REPLACE FUNCTION pgqueue_enqueue_many(jobs jsonb) RETURNS bigint[]
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    names CONSTANT text[] := ARRAY['task', 'payload', 'queue', 'priority', 'delay_seconds',
        'run_at', 'max_attempts', 'timeout_seconds', 'idempotency_key', 'unique_scope',
        'unique_period_seconds', 'concurrency_key', 'metadata', 'on_conflict', 'batch',
        'depends_on', 'on_dependency_failure'];
    job jsonb;
    n integer := 0;
    at text;
    name text;
    given text;
    item jsonb;
    kind text;
    fields jsonb;
    moment timestamptz;
    batch uuid;
    parents bigint[];
    problem text;
    ids bigint[] := '{}';
BEGIN
    IF jsonb_typeof(jobs) IS DISTINCT FROM 'array' THEN
        PERFORM pgqueue_invalid_job('jobs', 'must be a JSON array of jobs, got '
            || coalesce(pgqueue_json_type(jobs), 'null'));
    END IF;
    FOR job IN SELECT j FROM jsonb_array_elements(jobs) AS a(j) LOOP
        at := format('jobs[%s].', n);
        IF jsonb_typeof(job) <> 'object' THEN
            PERFORM pgqueue_invalid_job(format('jobs[%s]', n),
                'must be a mapping, got ' || pgqueue_json_type(job));
        END IF;
        fields := '{}';
        moment := NULL;
        batch := NULL;
        parents := NULL;
        problem := NULL;
        FOR given, item IN SELECT e.key, e.value FROM jsonb_each(job) e LOOP
            name := CASE given WHEN 'delay' THEN 'delay_seconds'
                               WHEN 'timeout' THEN 'timeout_seconds' ELSE given END;
            IF given = 'on_dependency_failure' AND (jsonb_typeof(item) <> 'string'
                  OR (item #>> '{}') NOT IN ('cancel', 'run')) THEN
                -- (Not nullable: null is refused, as the library refuses it.)
                PERFORM pgqueue_invalid_job(at || given, format(
                    'must be one of cancel, run, got %s', left(item::text, 40)));
            ELSIF NOT name = ANY (names) THEN
                PERFORM pgqueue_invalid_job(at || given, format(
                    'unknown field %L (the fields are %s)', given, array_to_string(names, ', ')));
            ELSIF fields ? name THEN
                PERFORM pgqueue_invalid_job(at || name, format('give %s or %s, not both',
                    CASE name WHEN 'delay_seconds' THEN 'delay' ELSE 'timeout' END, name));
            END IF;
            fields := fields || jsonb_build_object(name, item);
            -- Each field's JSON type, as rules.py checks a value json.loads
            -- read. A null optional field takes its default; task, queue
            -- and priority cannot be null.
            kind := pgqueue_json_type(item);
            CONTINUE WHEN kind = 'NoneType' AND name NOT IN ('task', 'queue', 'priority');
            IF name IN ('task', 'queue', 'idempotency_key', 'concurrency_key', 'run_at')
               AND kind <> 'str' THEN
                PERFORM pgqueue_invalid_job(at || given, 'must be a string, got ' || kind);
            ELSIF name = 'unique_scope' AND kind <> 'str' THEN
                PERFORM pgqueue_invalid_job(at || given, format(
                    'must be one of queued, active, always, got %s', left(item::text, 40)));
            ELSIF name = 'on_conflict' AND kind <> 'str' THEN
                PERFORM pgqueue_invalid_job(at || given, format(
                    'must be one of ignore, replace, extend, got %s', left(item::text, 40)));
            ELSIF name = 'depends_on' AND (kind <> 'list' OR jsonb_array_length(item) = 0
                  OR jsonb_array_length(item) > 100000) THEN
                PERFORM pgqueue_invalid_job(at || given, 'must be a list of 1 to 100000 job ids');
            ELSIF name = 'depends_on' THEN
                -- rules.JobIds: integers from 1 to 2**63 - 1, in JSON.
                SELECT format('must hold job ids (positive integers), got %s', left(e::text, 40))
                INTO problem FROM jsonb_array_elements(item) WITH ORDINALITY AS a(e, place)
                WHERE CASE WHEN pgqueue_json_type(e) = 'int'
                           THEN NOT (e::text::numeric BETWEEN 1 AND 9223372036854775807)
                           ELSE true END
                ORDER BY place LIMIT 1;
                IF problem IS NOT NULL THEN
                    PERFORM pgqueue_invalid_job(at || given, problem);
                END IF;
                SELECT array_agg(e::text::bigint ORDER BY place) INTO parents
                FROM jsonb_array_elements(item) WITH ORDINALITY AS a(e, place);
            ELSIF name = 'batch' THEN
                BEGIN
                    batch := (item #>> '{}')::uuid;
                EXCEPTION WHEN invalid_text_representation THEN
                    batch := NULL;
                END;
                IF kind <> 'str' OR batch IS NULL THEN
                    PERFORM pgqueue_invalid_job(at || given, format(
                        'must be a batch id (a uuid), got %s', left(item::text, 60)));
                END IF;
            ELSIF name IN ('priority', 'max_attempts') AND kind <> 'int' THEN
                PERFORM pgqueue_invalid_job(at || given, 'must be an integer, got ' || kind);
            ELSIF name IN ('priority', 'max_attempts') AND abs(item::text::numeric) > 9e18 THEN
                PERFORM pgqueue_invalid_job(at || given, format('must be between %s, got %s',
                    CASE name WHEN 'priority' THEN '-32767 and 32767' ELSE '1 and 1000' END, item));
            ELSIF name IN ('delay_seconds', 'timeout_seconds', 'unique_period_seconds')
                  AND kind NOT IN ('int', 'float') THEN
                PERFORM pgqueue_invalid_job(at || given, 'must be a number of seconds, got ' || kind);
            ELSIF name IN ('delay_seconds', 'timeout_seconds', 'unique_period_seconds')
                  AND abs(item::text::numeric) > 1e300 THEN
                PERFORM pgqueue_invalid_job(at || given, format(
                    'must be at most 315360000 seconds, got %s', left(item::text, 40)));
            ELSIF name IN ('payload', 'metadata') AND kind <> 'dict' THEN
                PERFORM pgqueue_invalid_job(at || given,
                    'must be a JSON object (dict), got ' || kind);
            ELSIF name = 'run_at' THEN
                moment := pgqueue_moment(at || given, item #>> '{}');
            END IF;
        END LOOP;
        IF NOT fields ? 'task' THEN
            PERFORM pgqueue_invalid_job(at || 'task', 'missing');
        END IF;
        ids := ids || pgqueue_enqueue_checked(at,
            fields ->> 'task',
            nullif(fields -> 'payload', 'null'),
            coalesce(fields ->> 'queue', 'default'),
            coalesce((fields ->> 'priority')::bigint, 0),
            moment,
            (fields ->> 'delay_seconds')::double precision,
            (fields ->> 'max_attempts')::bigint,
            (fields ->> 'timeout_seconds')::double precision,
            fields ->> 'idempotency_key',
            fields ->> 'unique_scope',
            (fields ->> 'unique_period_seconds')::double precision,
            fields ->> 'concurrency_key',
            nullif(fields -> 'metadata', 'null'),
            fields ->> 'on_conflict',
            batch,
            parents,
            coalesce(fields ->> 'on_dependency_failure', 'cancel'));
        n := n + 1;
    END LOOP;
    RETURN ids;
END
$$;
