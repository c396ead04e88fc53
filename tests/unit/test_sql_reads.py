"""Which statements write (sql.READS): a call whose answer was lost says
"nothing was written" only after a statement of READS (retrying.py), so a
writing statement taken for a read would make that a lie."""

from __future__ import annotations

import pytest

from pgqueue.sql import QUERIES, READS


@pytest.mark.parametrize(
    "name",
    [
        "job_cancel",  # an UPDATE
        "job_reserve_ids",  # nextval
        "job_copy",  # COPY
        "job_enqueue_plain",  # an INSERT in a WITH
        "job_claim",  # calls pgqueue_pick_limited, which writes
        "server_set_password",  # ALTER ROLE
        "wait_prune",  # DELETE
        "queue_controls_write",
    ],
)
def test_a_statement_that_writes_is_not_a_read(name: str) -> None:
    assert name in QUERIES
    assert name not in READS


@pytest.mark.parametrize(
    "name",
    [
        "job_get",
        "job_list",
        "job_get_by_idempotency_key",
        "queue_stats",
        "db_now",
        "worker_list",
        "job_claim_explain",  # EXPLAIN without ANALYZE: the claim is planned, not run
        "health_sample_server",
        "health_transactions",
    ],
)
def test_a_statement_that_only_reads_is_a_read(name: str) -> None:
    assert name in READS
