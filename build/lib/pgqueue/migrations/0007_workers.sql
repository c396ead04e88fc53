-- The workers registry: one row per worker process, written when it starts
-- and at every heartbeat, deleted when it stops. A worker killed without
-- stopping leaves its row behind: it expires (expires_at, a few heartbeats
-- ahead) and is pruned later by any worker's maintenance.
CREATE TABLE pgqueue_workers (
    name          text PRIMARY KEY,
    host          text        NOT NULL,
    pid           integer     NOT NULL,
    version       text        NOT NULL,
    queues        text[],                 -- NULL: every queue
    concurrency   integer     NOT NULL,
    started_at    timestamptz NOT NULL DEFAULT now(),
    last_seen_at  timestamptz NOT NULL DEFAULT now(),
    expires_at    timestamptz NOT NULL,
    -- As the worker counted them at its last heartbeat.
    held          integer     NOT NULL DEFAULT 0,
    running       integer     NOT NULL DEFAULT 0,
    hung          integer     NOT NULL DEFAULT 0,
    claimed       bigint      NOT NULL DEFAULT 0,
    last_claim_at timestamptz
) WITH (fillfactor = 50);
