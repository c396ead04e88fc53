"""Enqueue from SQL (migration 0030): pgqueue_enqueue and pgqueue_enqueue_many
through psql (the embedded server's, a C client), through SQLAlchemy Core on
asyncpg (a client that is not psycopg), from a trigger, and run by a real
worker; the library's rules, refused with SQLSTATE 22023 naming the field.
The property test that the SQL and the library take and store the same jobs:
test_sql_enqueue_property.py."""

from __future__ import annotations

import json
import os
import re
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import errors
from psycopg.conninfo import conninfo_to_dict
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from pgqueue import AsyncQueue, Job, JobState, Queue, Settings
from pgqueue.db.embedded import EmbeddedPostgres
from pgqueue.worker import AsyncWorker
from tests.support import running, until

ROOT = Path(__file__).resolve().parents[3]
HOWTO = ROOT / "docs" / "howto" / "enqueue-from-sql.md"

Sql = psycopg.Connection[tuple[Any, ...]]


def psql(db_url: str, script: str) -> str:
    """Run ``script`` with the embedded server's psql (stops at the first
    error); the URL goes through the environment, not argv."""
    info = conninfo_to_dict(db_url)
    env = {
        "PATH": "/usr/bin:/bin",
        "PGHOST": str(info["host"]),
        "PGPORT": str(info["port"]),
        "PGUSER": str(info["user"]),
        "PGPASSWORD": str(info["password"]),
        "PGDATABASE": str(info["dbname"]),
    }
    done = subprocess.run(
        [str(EmbeddedPostgres.binary("psql")), "-X", "-q", "-At", "-v", "ON_ERROR_STOP=1"],
        input=script,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def count(sql: Sql) -> int:
    return int(sql.execute("SELECT count(*) FROM pgqueue_jobs").fetchone()[0])  # type: ignore[index]


def test_psql_enqueues_a_job_with_the_library_fields(db_url: str, queue: Queue) -> None:
    out = psql(
        db_url,
        """SELECT pgqueue_enqueue('send_email', '{"to": "ada@example.com"}',
                                  queue => 'emails', priority => 5, max_attempts => 3,
                                  timeout_seconds => 30, concurrency_key => 'tenant-1',
                                  metadata => '{"source": "psql"}');""",
    )
    job = queue.get(int(out))
    assert (job.task, job.payload, job.queue, job.priority) == (
        "send_email",
        {"to": "ada@example.com"},
        "emails",
        5,
    )
    assert (job.max_attempts, job.timeout_seconds, job.concurrency_key, job.metadata) == (
        3,
        30.0,
        "tenant-1",
        {"source": "psql"},
    )
    assert job.state is JobState.QUEUED


def test_a_key_held_returns_the_holder_id_and_writes_nothing(sql: Sql) -> None:
    enqueue = "SELECT pgqueue_enqueue('t', %s, idempotency_key => 'order-7')"
    first = sql.execute(enqueue, ['{"n": 1}']).fetchone()
    again = sql.execute(enqueue, ['{"n": 2}']).fetchone()
    assert first == again and count(sql) == 1
    # Unique by task and payload: a scope without a key.
    scoped = "SELECT pgqueue_enqueue('t', %s, unique_scope => 'active')"
    a = sql.execute(scoped, ['{"a": 1, "b": [1.5, "é"]}']).fetchone()
    b = sql.execute(scoped, ['{"b": [1.5, "é"], "a": 1}']).fetchone()
    c = sql.execute(scoped, ['{"a": 2}']).fetchone()
    assert a == b != c and count(sql) == 3


def test_run_at_and_delay_are_on_the_database_clock(sql: Sql) -> None:
    def after_enqueue(call: str) -> Any:
        [job_id] = sql.execute(f"SELECT {call}").fetchone()  # type: ignore[call-overload,misc]
        return sql.execute(
            "SELECT extract(epoch FROM run_at - enqueued_at)::float8 FROM pgqueue_jobs"
            " WHERE id = %s",
            [job_id],
        ).fetchone()

    assert after_enqueue("pgqueue_enqueue('t', delay_seconds => 90)") == (90.0,)
    # A time in the past means now.
    assert after_enqueue("pgqueue_enqueue('t', run_at => '2001-01-01T00:00:00Z')") == (0.0,)


# Each call, and the field its error names.
BAD_CALLS = [
    ("pgqueue_enqueue('no spaces')", "task"),
    ("pgqueue_enqueue(NULL)", "task"),
    ("pgqueue_enqueue('t', '[1]')", "payload"),
    ("pgqueue_enqueue('t', queue => 'a/b')", "queue"),
    ("pgqueue_enqueue('t', priority => 32768)", "priority"),
    ("pgqueue_enqueue('t', max_attempts => 0)", "max_attempts"),
    ("pgqueue_enqueue('t', delay_seconds => -1)", "delay_seconds"),
    ("pgqueue_enqueue('t', delay_seconds => 'NaN')", "delay_seconds"),
    ("pgqueue_enqueue('t', run_at => 'infinity')", "run_at"),
    ("pgqueue_enqueue('t', run_at => now(), delay_seconds => 1)", "run_at"),
    ("pgqueue_enqueue('t', timeout_seconds => 0)", "timeout_seconds"),
    ("pgqueue_enqueue('t', idempotency_key => '')", "idempotency_key"),
    ("pgqueue_enqueue('t', idempotency_key => repeat('k', 256))", "idempotency_key"),
    ("pgqueue_enqueue('t', unique_scope => 'forever')", "unique_scope"),
    ("pgqueue_enqueue('t', unique_period_seconds => 0.5)", "unique_period_seconds"),
    ("pgqueue_enqueue('t', concurrency_key => '')", "concurrency_key"),
    (
        "pgqueue_enqueue('t', metadata => jsonb_build_object('a', repeat('x', 16384)))",
        "metadata",
    ),
    ("pgqueue_enqueue('t', 'null')", "payload"),
    ("pgqueue_enqueue('t', '{\"pgqueue:sealed\": {}}')", "payload.pgqueue:sealed"),
    (
        "pgqueue_enqueue('t', ('{\"a\": ' || repeat('[', 64) || repeat(']', 64) || '}')::jsonb)",
        "payload",
    ),
    (
        'pgqueue_enqueue_many(\'[{"task": "a"}, {"task": "b", "priority": "1"}]\')',
        "jobs[1].priority",
    ),
    ('pgqueue_enqueue_many(\'[{"task": "a", "prio": 1}]\')', "jobs[0].prio"),
    ('pgqueue_enqueue_many(\'[{"task": "a", "queue": null}]\')', "jobs[0].queue"),
    ("pgqueue_enqueue_many('[{\"payload\": {}}]')", "jobs[0].task"),
    (
        'pgqueue_enqueue_many(\'[{"task": "a", "run_at": "2030-01-01T09:00:00"}]\')',
        "jobs[0].run_at",
    ),
    ('pgqueue_enqueue_many(\'[{"task": "a", "depends_on": [1]}]\')', "jobs[0].depends_on"),
    ('pgqueue_enqueue_many(\'{"task": "a"}\')', "jobs"),
]


def test_a_bad_argument_raises_22023_naming_the_field_and_writes_nothing(sql: Sql) -> None:
    for call, field in BAD_CALLS:
        with pytest.raises(errors.InvalidParameterValue) as raised:
            sql.execute(f"SELECT {call}")  # type: ignore[call-overload]
        assert raised.value.sqlstate == "22023", call
        assert raised.value.diag.column_name == field, call
        assert str(raised.value).startswith(f"{field}: "), call
    assert count(sql) == 0
    assert sql.execute("SELECT count(*) FROM pgqueue_enqueued").fetchone() == (0,)


def test_the_nesting_limit_is_the_library_one(sql: Sql) -> None:
    # 64 levels (the object itself is one) is the most a payload may nest.
    deepest = '{"a": ' + "[" * 63 + "]" * 63 + "}"
    sql.execute("SELECT pgqueue_enqueue('t', %s::jsonb)", [deepest])
    assert count(sql) == 1


def test_enqueue_many_returns_the_ids_in_order_and_one_bad_job_writes_nothing(sql: Sql) -> None:
    jobs = [
        {"task": "a", "payload": {"n": 1}},
        {"task": "b", "delay": 60, "queue": "later", "payload": None},
        {"task": "c", "run_at": "2030-01-01T09:00:00.1234567+02:00", "idempotency_key": "c"},
        {"task": "c", "idempotency_key": "c"},  # the same key: the holder's id
    ]
    row = sql.execute("SELECT pgqueue_enqueue_many(%s::jsonb)", [json.dumps(jobs)]).fetchone()
    assert row is not None
    ids = row[0]
    assert len(ids) == 4 and ids[0] < ids[1] < ids[2] == ids[3]
    stored = sql.execute(
        "SELECT task, queue, payload, extract(epoch FROM run_at - enqueued_at)::float8, run_at"
        " FROM pgqueue_jobs ORDER BY id"
    ).fetchall()
    assert [r[:3] for r in stored] == [
        ("a", "default", {"n": 1}),
        ("b", "later", {}),
        ("c", "default", {}),
    ]
    assert stored[1][3] == 60.0
    assert stored[2][4].isoformat() == "2030-01-01T07:00:00.123456+00:00"
    with pytest.raises(errors.InvalidParameterValue, match=r"^jobs\[1\]\.priority"):
        sql.execute(
            "SELECT pgqueue_enqueue_many(%s::jsonb)",
            [json.dumps([{"task": "ok"}, {"task": "bad", "priority": 10**6}])],
        )
    assert count(sql) == 3


def test_the_notify_of_a_runnable_job_is_sent_at_commit(db_url: str, sql: Sql) -> None:
    with psycopg.connect(db_url, autocommit=True) as listener:
        listener.execute("LISTEN pgqueue_jobs")
        with psycopg.connect(db_url) as producer:
            producer.execute("SELECT pgqueue_enqueue('t', queue => 'later', delay_seconds => 60)")
            producer.execute("SELECT pgqueue_enqueue('t', queue => 'mail')")
            assert list(listener.notifies(timeout=0.2)) == []  # not before the commit
            producer.commit()
        got = [n.payload for n in listener.notifies(timeout=5, stop_after=1)]
    assert got == ["mail"]  # a delayed job sends none


TRIGGER = """
CREATE TABLE orders (id bigserial PRIMARY KEY, email text NOT NULL);
CREATE FUNCTION orders_enqueue_receipt() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pgqueue_enqueue('send_receipt', jsonb_build_object('order_id', NEW.id),
                            idempotency_key => 'receipt-' || NEW.id);
    RETURN NEW;
END $$;
CREATE TRIGGER orders_receipt AFTER INSERT ON orders
    FOR EACH ROW EXECUTE FUNCTION orders_enqueue_receipt();
"""


def test_a_trigger_enqueues_with_the_transaction_that_fires_it(db_url: str, sql: Sql) -> None:
    sql.execute(TRIGGER)
    with psycopg.connect(db_url) as conn:
        conn.execute("INSERT INTO orders (email) VALUES ('a@example.com')")
        conn.rollback()
        assert count(sql) == 0  # rolled back with the order
        conn.execute("INSERT INTO orders (email) VALUES ('b@example.com')")
        conn.commit()
    rows = sql.execute("SELECT task, payload FROM pgqueue_jobs").fetchall()
    assert rows == [("send_receipt", {"order_id": 2})]


def listening(sql: Sql) -> bool:
    """Whether a session of the test's database is idle after its LISTEN
    (the worker's, which listens for cancels last)."""
    row = sql.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
        " AND state = 'idle' AND query LIKE 'LISTEN pgqueue_cancel%%'"
    ).fetchone()
    return row is not None and row[0] > 0


async def test_a_job_enqueued_by_psql_wakes_and_is_run_by_a_worker(
    db_url: str, settings: Settings, aqueue: AsyncQueue, sql: Sql
) -> None:
    seen: list[dict[str, Any]] = []

    async def send(job: Job) -> str:
        seen.append(job.payload)
        return "sent"

    # A poll far beyond the wait: only the NOTIFY can wake the worker in time.
    quiet = settings.replace(poll_interval_seconds=60.0)
    async with running(AsyncWorker({"send": send}, settings=quiet)) as worker:
        await until(lambda: worker.stats["claims"] >= 1)  # it looked once, and sleeps
        await until(lambda: listening(sql))
        out = psql(db_url, """SELECT pgqueue_enqueue('send', '{"to": "ada"}');""")
        done = await aqueue.wait(int(out), 10)
    assert done.state is JobState.SUCCEEDED and done.result == "sent"
    assert seen == [{"to": "ada"}]


async def test_sqlalchemy_core_on_asyncpg_enqueues(db_url: str, aqueue: AsyncQueue) -> None:
    url = re.sub(r"^postgresql://", "postgresql+asyncpg://", db_url)
    engine = create_async_engine(url)
    try:
        async with engine.begin() as conn:
            job_id = await conn.scalar(
                text(
                    "SELECT pgqueue_enqueue(:task, CAST(:payload AS jsonb), queue => :queue,"
                    " priority => :priority)"
                ),
                {"task": "resize", "payload": '{"w": 640}', "queue": "images", "priority": 2},
            )
            ids = await conn.scalar(
                text("SELECT pgqueue_enqueue_many(CAST(:jobs AS jsonb))"),
                {"jobs": json.dumps([{"task": "a"}, {"task": "b"}])},
            )
    finally:
        await engine.dispose()
    job = await aqueue.get(job_id)
    assert (job.task, job.payload, job.queue, job.priority) == ("resize", {"w": 640}, "images", 2)
    assert [(await aqueue.get(i)).task for i in ids] == ["a", "b"]


def sql_blocks(page: Path) -> list[str]:
    found = re.findall(r"^```sql\n(.*?)^```$", page.read_text("utf-8"), re.DOTALL | re.MULTILINE)
    return list(found)


def test_the_howto_sql_blocks_run_in_order_through_psql(db_url: str, sql: Sql) -> None:
    blocks = sql_blocks(HOWTO)
    assert len(blocks) >= 4
    psql(db_url, "\n".join(blocks))
    tasks = {row[0] for row in sql.execute("SELECT DISTINCT task FROM pgqueue_jobs")}
    assert {"send_email", "send_receipt", "reindex"} <= tasks
    # The debounce trigger's two edits made one job, 30 s after the last.
    [(jobs, lead)] = sql.execute(
        "SELECT count(*), min(run_at - enqueued_at) FROM pgqueue_jobs WHERE task = 'reindex'"
    ).fetchall()
    assert jobs == 1 and lead.total_seconds() >= 30
    # The report waits for its two exports.
    [(state, parents)] = sql.execute(
        "SELECT state, (SELECT array_agg(task ORDER BY task) FROM pgqueue_jobs p"
        " WHERE p.id = ANY(r.depends_on)) FROM pgqueue_jobs r WHERE task = 'report'"
    ).fetchall()
    assert (state, parents) == ("waiting", ["export", "export"])


def test_the_howto_says_which_snippets_are_not_run() -> None:
    page = HOWTO.read_text("utf-8")
    for language in ("javascript", "go", "ruby"):
        assert f"```{language}\n" in page
    assert "not run by the tests" in page
    assert os.path.exists(ROOT / "docs" / "api.md")
    assert "howto/enqueue-from-sql.md" in (ROOT / "docs" / "api.md").read_text("utf-8")


def test_a_key_held_by_a_transaction_that_rolls_back_goes_to_the_waiting_caller(
    db_url: str, sql: Sql
) -> None:
    enqueue = "SELECT pgqueue_enqueue('t', idempotency_key => 'k')"
    with psycopg.connect(db_url) as first, psycopg.connect(db_url, autocommit=True) as second:
        row = first.execute(enqueue).fetchone()
        assert row is not None
        taken_by_first = row[0]
        got: list[int] = []

        def wait_for_the_key() -> None:
            answer = second.execute(enqueue).fetchone()
            assert answer is not None
            got.append(answer[0])

        waiter = threading.Thread(target=wait_for_the_key)
        waiter.start()
        # The second insert waits on the first's uncommitted key (ON CONFLICT).
        deadline = time.monotonic() + 10
        while sql.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND wait_event_type = 'Lock'"
        ).fetchone() != (1,):
            assert time.monotonic() < deadline, "the second call never waited"
            time.sleep(0.01)
        first.rollback()
        waiter.join(10)
    assert len(got) == 1 and got[0] != taken_by_first
    assert sql.execute("SELECT id FROM pgqueue_jobs").fetchall() == [(got[0],)]
