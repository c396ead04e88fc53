import pytest
from user_tasks import resize, tasks

from pgqueue import JobState
from pgqueue.testing import drain, drain_async, eager


def test_drain(pgqueue_queue):
    job = resize.using(pgqueue_queue).enqueue("a.png", 3)
    failing = pgqueue_queue.enqueue("boom", {})
    ran = drain(pgqueue_queue, tasks)
    assert [r.job.id for r in ran] == [job.id, failing.id]
    assert ran[0].state is JobState.SUCCEEDED and ran[0].result == {"width": 3}
    assert ran[1].state is JobState.QUEUED and "ValueError: no" in ran[1].error


def test_eager(pgqueue_queue):
    with eager(pgqueue_queue, tasks) as q:
        job = q.enqueue("resize", {"path": "b", "width": 2})
    assert job.state is JobState.SUCCEEDED and job.result == {"width": 2}


@pytest.mark.asyncio
async def test_async(pgqueue_aqueue):
    job = await resize.using(pgqueue_aqueue).enqueue_async("c.png", 5)
    [ran] = await drain_async(pgqueue_aqueue, tasks)
    assert ran.job.id == job.id and ran.result == {"width": 5}


def test_eager_leaves_a_transactional_enqueue_to_its_transaction(pgqueue_queue, pgqueue_url):
    import psycopg

    with eager(pgqueue_queue, tasks) as q, psycopg.connect(pgqueue_url) as conn:
        job = q.enqueue("resize", {"path": "d", "width": 1}, connection=conn)
        assert job.state is JobState.QUEUED


def test_assert_idempotent(pgqueue_assert_idempotent, pgqueue_url):
    import psycopg

    def credit(job):
        with job.transaction() as conn:
            conn.execute("INSERT INTO ledger VALUES (%s)", (job.payload["amount"],))

    with psycopg.connect(pgqueue_url, autocommit=True) as sql:
        sql.execute("CREATE TABLE ledger (amount int)")
        report = pgqueue_assert_idempotent(
            credit,
            {"amount": 10},
            effects=lambda: sql.execute("SELECT amount FROM ledger").fetchall(),
            reset=lambda: sql.execute("TRUNCATE ledger"),
        )
    assert report.idempotent and report.single_run == [(10,)]
