-- Enqueue from SQL, for every language: pgqueue_enqueue(task, ...) returns
-- the new job's id, and pgqueue_enqueue_many(jobs jsonb) the ids of an
-- array of jobs, in order. Both apply the library's rules (core/job_spec.py,
-- core/rules.py, core/json_text.py; the limits are core/jobs.py's) and write
-- what its enqueue writes (queries.sql job_enqueue): the row, the count for
-- the per-minute history, and the NOTIFY that wakes a listening worker (sent
-- when the caller's transaction commits). A job whose key another job holds
-- is not written: its holder's id is returned, as the library returns the
-- holder. A bad argument raises SQLSTATE 22023 (invalid_parameter_value)
-- with the message "<field>: <problem>" and the field in the error's COLUMN
-- field, before anything is written. They run in the caller's transaction,
-- so they can be called from a trigger: a rolled back transaction leaves no
-- job. docs/howto/enqueue-from-sql.md; the property test that holds the two
-- sets of rules together: tests/integration/queue/test_sql_enqueue_property.py.
--
-- Not here: dependencies (depends_on), which the library and the HTTP API take.

-- The error every rule raises: "<field>: <problem>", SQLSTATE 22023.
-- VOLATILE: never folded into a plan where a CASE would not call it.
CREATE FUNCTION pgqueue_invalid_job(field text, problem text) RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value', COLUMN = field,
        MESSAGE = field || ': ' || problem;
END
$$;

-- A number as Python's json.dumps writes what json.loads reads of it (the
-- text PostgreSQL writes for a jsonb number: digits, a point, no exponent):
-- an integer as its digits, any other as the float's shortest repr
-- (1.0, 0.1, 1e-07, 1.5e+20). extra_float_digits = 1 makes float8's text
-- the shortest that reads back, whatever the session's setting.
CREATE FUNCTION pgqueue_json_number(number text) RETURNS text
LANGUAGE plpgsql IMMUTABLE SET extra_float_digits = 1 AS $$
DECLARE
    value numeric;
    shown text;
    negative boolean;
    mantissa text;
    exponent integer;
    digits text;
    point integer;
    zeros integer;
BEGIN
    IF strpos(number, '.') = 0 THEN
        RETURN number;
    END IF;
    value := number::numeric;
    -- Past what a float holds (halfway to the next power of two, or to
    -- the smallest float): Python reads infinity, or zero.
    IF abs(value) >= 1.797693134862315807937289714053e308 THEN
        RETURN CASE WHEN value < 0 THEN '-Infinity' ELSE 'Infinity' END;
    ELSIF abs(value) <= 2.470328229206232720882538e-324 THEN
        RETURN CASE WHEN left(number, 1) = '-' THEN '-0.0' ELSE '0.0' END;
    END IF;
    shown := value::double precision::text;  -- '1.5e-07', '123.45', '1e+15'
    negative := left(shown, 1) = '-';
    shown := ltrim(shown, '-');
    mantissa := split_part(shown, 'e', 1);
    exponent := coalesce(nullif(split_part(shown, 'e', 2), '')::integer, 0);
    digits := split_part(mantissa, '.', 1) || split_part(mantissa, '.', 2);
    -- The value is 0.<digits> x 10^point.
    point := length(split_part(mantissa, '.', 1)) + exponent;
    zeros := length(digits) - length(ltrim(digits, '0'));
    digits := rtrim(ltrim(digits, '0'), '0');
    point := point - zeros;
    IF point > -4 AND point <= 16 THEN
        IF point <= 0 THEN
            shown := '0.' || repeat('0', -point) || digits;
        ELSIF point >= length(digits) THEN
            shown := digits || repeat('0', point - length(digits)) || '.0';
        ELSE
            shown := left(digits, point) || '.' || substr(digits, point + 1);
        END IF;
    ELSE
        shown := left(digits, 1) || CASE WHEN length(digits) > 1 THEN '.' || substr(digits, 2) ELSE '' END
            || 'e' || CASE WHEN point - 1 < 0 THEN '-' ELSE '+' END
            || CASE WHEN abs(point - 1) < 10 THEN '0' ELSE '' END || abs(point - 1)::text;
    END IF;
    RETURN CASE WHEN negative THEN '-' || shown ELSE shown END;
END
$$;

-- A JSON value as Python's json.dumps(json.loads(text), sort_keys=True,
-- separators=(",", ":")) writes it (ASCII, keys in code point order): what
-- job_spec.payload_digest hashes into the key of a job made unique by its
-- task and payload.
CREATE FUNCTION pgqueue_json_canonical(value jsonb) RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    shown text;
BEGIN
    CASE jsonb_typeof(value)
    WHEN 'object' THEN
        RETURN '{' || coalesce((
            SELECT string_agg(pgqueue_json_canonical(to_jsonb(key)) || ':'
                              || pgqueue_json_canonical(item), ',' ORDER BY key COLLATE "C")
            FROM jsonb_each(value) AS e(key, item)), '') || '}';
    WHEN 'array' THEN
        RETURN '[' || coalesce((
            SELECT string_agg(pgqueue_json_canonical(item), ',' ORDER BY n)
            FROM jsonb_array_elements(value) WITH ORDINALITY AS e(item, n)), '') || ']';
    WHEN 'number' THEN
        RETURN pgqueue_json_number(value::text);
    WHEN 'string' THEN
        shown := value::text;  -- escaped as Python escapes, but for what is not ASCII
        IF shown ~ '^[ -~]*$' THEN
            RETURN shown;
        END IF;
        RETURN (
            SELECT string_agg(CASE
                WHEN ascii(c) BETWEEN 32 AND 126 THEN c
                WHEN ascii(c) < 65536 THEN '\u' || lpad(to_hex(ascii(c)), 4, '0')
                ELSE '\u' || to_hex(55296 + ((ascii(c) - 65536) >> 10))
                  || '\u' || to_hex(56320 + ((ascii(c) - 65536) & 1023))
                END, '' ORDER BY n)
            FROM unnest(string_to_array(shown, NULL)) WITH ORDINALITY AS t(c, n));
    ELSE
        RETURN value::text;  -- true, false, null
    END CASE;
END
$$;

-- json_text.dump_json's checks of a JSON object (a payload, metadata):
-- at most max_bytes bytes as compact JSON text (without the space
-- PostgreSQL writes after each ':' and ','), nested at most 64 levels
-- (json_text.MAX_JSON_DEPTH). jsonb itself refuses NaN, NUL and lone
-- surrogates, and its keys are strings.
CREATE FUNCTION pgqueue_check_json(field text, doc jsonb, max_bytes integer) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    shown text;
    size bigint;
    depth integer;
    spaces bigint;
BEGIN
    IF jsonb_typeof(doc) IS DISTINCT FROM 'object' THEN
        PERFORM pgqueue_invalid_job(field, 'must be a JSON object, got '
            || coalesce(jsonb_typeof(doc), 'null'));
    END IF;
    shown := doc::text;
    size := octet_length(shown);
    -- Fewer opening brackets than the limit (strings' own count too): not too deep.
    IF size > max_bytes OR length(shown) - length(translate(shown, '{[', '')) > 64 THEN
        WITH RECURSIVE walk(item, level) AS (
            SELECT doc, 1
            UNION ALL
            SELECT child, level + 1
            FROM walk, LATERAL (
                SELECT e.value FROM jsonb_each(
                    CASE WHEN jsonb_typeof(item) = 'object' THEN item ELSE '{}' END) e
                UNION ALL
                SELECT a FROM jsonb_array_elements(
                    CASE WHEN jsonb_typeof(item) = 'array' THEN item ELSE '[]' END) a
            ) children(child)
            WHERE jsonb_typeof(child) IN ('object', 'array') AND level <= 64
        )
        SELECT max(level),
               sum(CASE WHEN jsonb_typeof(item) = 'object'
                        THEN greatest(2 * (SELECT count(*) FROM jsonb_object_keys(item)) - 1, 0)
                        ELSE greatest(jsonb_array_length(item) - 1, 0) END)
        INTO depth, spaces FROM walk;
        IF depth > 64 THEN
            PERFORM pgqueue_invalid_job(field, 'must be nested at most 64 levels deep');
        END IF;
        size := size - spaces;
        IF size > max_bytes THEN
            PERFORM pgqueue_invalid_job(field,
                format('must be at most %s bytes as JSON, got %s', max_bytes, size));
        END IF;
    END IF;
END
$$;

-- A time as rules.Moment reads one from text: RFC 3339 with a zone (the
-- fraction past microseconds cut, as Python's datetime.fromisoformat cuts
-- it; an offset of up to 23:59).
CREATE FUNCTION pgqueue_moment(field text, moment text) RETURNS timestamptz
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    parts text[] := regexp_match(moment,
        '^([0-9]{4}-[0-9]{2}-[0-9]{2})[Tt]([0-9]{2}):([0-9]{2}):([0-9]{2})(\.[0-9]+)?'
        '([Zz]|([+-])([0-9]{2}):([0-9]{2}))?$');
    offset_minutes integer := 0;
BEGIN
    IF parts IS NOT NULL AND parts[6] IS NULL THEN
        PERFORM pgqueue_invalid_job(field, 'must have a time zone, e.g. 2030-01-01T09:00:00Z');
    END IF;
    IF parts[7] IS NOT NULL THEN
        offset_minutes := (parts[8]::integer * 60 + parts[9]::integer)
            * CASE parts[7] WHEN '-' THEN -1 ELSE 1 END;
    END IF;
    IF parts IS NOT NULL AND parts[2]::integer <= 23 AND parts[3]::integer <= 59
       AND parts[4]::integer <= 59 AND abs(offset_minutes) < 24 * 60 THEN
        BEGIN
            RETURN ((parts[1] || ' ' || parts[2] || ':' || parts[3] || ':' || parts[4]
                     || coalesce(left(parts[5], 7), ''))::timestamp AT TIME ZONE 'UTC')
                   - make_interval(mins => offset_minutes);
        EXCEPTION WHEN datetime_field_overflow OR invalid_datetime_format THEN
            -- a day that does not exist: 2030-02-30
        END;
    END IF;
    PERFORM pgqueue_invalid_job(field, format(
        '%L is not an ISO 8601 time, e.g. 2030-01-01T09:00:00Z', left(moment, 40)));
END
$$;

-- The start of the period of `period` seconds (counted from 1970-01-01 UTC)
-- that `at` is in, as enqueue._in_period writes it into a key: Python's
-- datetime.fromtimestamp(start, UTC).isoformat() of the float start, whole
-- seconds and the fraction rounded half to even to microseconds.
CREATE FUNCTION pgqueue_period_start(at timestamptz, period double precision) RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    seconds double precision := floor(extract(epoch FROM at)::double precision / period) * period;
    micros double precision := round((seconds - trunc(seconds)) * 1e6);
BEGIN
    seconds := trunc(seconds);
    IF micros >= 1e6 THEN
        micros := micros - 1e6;
        seconds := seconds + 1;
    END IF;
    RETURN to_char(to_timestamp(seconds) AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS')
        || CASE WHEN micros = 0 THEN '' ELSE '.' || lpad(micros::bigint::text, 6, '0') END
        || '+00:00';
END
$$;

-- One job, checked and written: the body of both public functions. `field`
-- prefixes the names in errors ('' or 'jobs[3].'). Arguments as
-- pgqueue_enqueue's (named new_* where a column has the name), NULL for
-- "not given".
CREATE FUNCTION pgqueue_enqueue_checked(
    field text, new_task text, new_payload jsonb, new_queue text, new_priority bigint,
    new_run_at timestamptz, delay_seconds double precision, new_max_attempts bigint,
    new_timeout_seconds double precision, new_key text, new_scope text,
    unique_period_seconds double precision, new_concurrency_key text, new_metadata jsonb
) RETURNS bigint LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    ten_years CONSTANT double precision := 10 * 365 * 24 * 3600.0;  -- jobs.MAX_DELAY_SECONDS
    payload_or_empty jsonb := coalesce(new_payload, '{}');
    key text := new_key;
    scope text := new_scope;
    found_id bigint;
    found_run_at timestamptz;
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

    -- job_spec._uniqueness: a scope or a period without a key is
    -- uniqueness by task and payload (payload_digest); a key without a
    -- scope is held always.
    IF key IS NULL AND (scope IS NOT NULL OR unique_period_seconds IS NOT NULL) THEN
        key := new_task || ':' || encode(sha256(convert_to(
            pgqueue_json_canonical(payload_or_empty), 'UTF8')), 'hex');
    END IF;
    IF key IS NOT NULL THEN
        scope := coalesce(scope, 'always');
    END IF;
    -- enqueue._in_period: each period's key is another key.
    IF unique_period_seconds IS NOT NULL THEN
        key := key || '@' || pgqueue_period_start(now(), unique_period_seconds);
    END IF;

    -- queries.sql job_enqueue. A conflicting insert may be in flight in
    -- another transaction: ON CONFLICT waits for it. The holder may let the
    -- key go between the two statements: then the next round inserts.
    FOR round IN 1..3 LOOP
        INSERT INTO pgqueue_jobs (queue, task, payload, priority, run_at, max_attempts,
                                  timeout_seconds, idempotency_key, unique_scope,
                                  concurrency_key, metadata)
        VALUES (new_queue, new_task, payload_or_empty, new_priority,
                greatest(coalesce(new_run_at,
                                  now() + make_interval(secs => coalesce(delay_seconds, 0))),
                         now()),
                coalesce(new_max_attempts, 5), new_timeout_seconds, key, scope,
                new_concurrency_key, new_metadata)
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
            RETURN found_id;
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

-- Enqueue one job; returns its id (or the id of the job that holds its key).
-- Call with named arguments: SELECT pgqueue_enqueue('send_email',
-- '{"to": "a@example.com"}', queue => 'emails', priority => 5).
-- max_attempts defaults to 5 (jobs.DEFAULT_MAX_ATTEMPTS: the library's
-- default_max_attempts setting is the library's own).
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
    metadata jsonb DEFAULT NULL
) RETURNS bigint LANGUAGE sql VOLATILE AS $$
    SELECT pgqueue_enqueue_checked('', task, payload, queue, priority, run_at, delay_seconds,
                                   max_attempts, timeout_seconds, idempotency_key, unique_scope,
                                   unique_period_seconds, concurrency_key, metadata)
$$;

-- A field of a job of pgqueue_enqueue_many, checked for its JSON type: the
-- name of the type Python's json.loads gives it, as the library names it.
CREATE FUNCTION pgqueue_json_type(value jsonb) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE jsonb_typeof(value)
        WHEN 'object' THEN 'dict' WHEN 'array' THEN 'list' WHEN 'string' THEN 'str'
        WHEN 'boolean' THEN 'bool' WHEN 'null' THEN 'NoneType'
        ELSE CASE WHEN strpos(value::text, '.') > 0 THEN 'float' ELSE 'int' END
    END
$$;

-- Enqueue an array of jobs, each an object of pgqueue_enqueue's fields (the
-- names of JobSpec.from_fields: delay and timeout are aliases; a null
-- optional field takes its default); returns their ids in the array's
-- order. One bad job writes nothing: the error names it, jobs[3].priority.
CREATE FUNCTION pgqueue_enqueue_many(jobs jsonb) RETURNS bigint[]
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    names CONSTANT text[] := ARRAY['task', 'payload', 'queue', 'priority', 'delay_seconds',
        'run_at', 'max_attempts', 'timeout_seconds', 'idempotency_key', 'unique_scope',
        'unique_period_seconds', 'concurrency_key', 'metadata'];
    job jsonb;
    n integer := 0;
    at text;
    name text;
    given text;
    item jsonb;
    kind text;
    fields jsonb;
    moment timestamptz;
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
        FOR given, item IN SELECT e.key, e.value FROM jsonb_each(job) e LOOP
            name := CASE given WHEN 'delay' THEN 'delay_seconds'
                               WHEN 'timeout' THEN 'timeout_seconds' ELSE given END;
            -- Dependencies are the library's and the HTTP API's: a null
            -- depends_on is none, and on_dependency_failure only matters with one.
            IF given = 'depends_on' AND item <> 'null' THEN
                PERFORM pgqueue_invalid_job(at || given, 'dependencies are not taken here '
                    || '(the library and the HTTP API take them)');
            ELSIF given = 'on_dependency_failure'
                  AND (item #>> '{}') IS DISTINCT FROM 'cancel' AND (item #>> '{}') IS DISTINCT FROM 'run'
                  OR given = 'on_dependency_failure' AND jsonb_typeof(item) <> 'string' THEN
                PERFORM pgqueue_invalid_job(at || given, format(
                    'must be one of cancel, run, got %s', left(item::text, 40)));
            ELSIF given IN ('depends_on', 'on_dependency_failure') THEN
                CONTINUE;
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
            nullif(fields -> 'metadata', 'null'));
        n := n + 1;
    END LOOP;
    RETURN ids;
END
$$;
