-- The kind of a job's error: the first line of its last error with what
-- changes from one job to the next replaced (ids by <id>, numbers by <n>),
-- cut to 200 characters. Dead jobs that failed the same way about different
-- orders or users make one group of GET /dead-letters (before, eleven dead
-- jobs whose errors carried an order number made eleven groups), and a bulk
-- action's `error_kind` filter matches exactly that group.
CREATE FUNCTION pgqueue_error_kind(error text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT left(regexp_replace(regexp_replace(regexp_replace(
        split_part(coalesce(error, ''), E'\n', 1),
        -- a UUID
        '[0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}', '<id>', 'g'),
        -- a word of 8 or more hexadecimal digits, one of them a number (a hash)
        '\m(?=[0-9a-fA-F]*[0-9])[0-9a-fA-F]{8,}\M', '<id>', 'g'),
        '[0-9]+', '<n>', 'g'), 200)
$$;
