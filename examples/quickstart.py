"""The quick start of docs/getting-started.md, as printed there (a test
checks that the two agree, and runs this file).

    python examples/quickstart.py

Uses DATABASE_URL, or else the embedded server in ./.pgqueue. Enqueues a job
(twice, with one idempotency key), a bulk of jobs and a job inside the
caller's own transaction, then runs a worker until the first job's result is
in, and prints it.
"""

import threading

import psycopg

from pgqueue import Job, Queue, migrate
from pgqueue.worker import Worker


def send_email(job: Job) -> dict[str, bool]:
    return {"sent": True}  # stored as the job's JSON result; a job may run twice after a fault


def resize(job: Job) -> None: ...


def send_receipt(job: Job) -> None: ...


HANDLERS = {"send_email": send_email, "resize": resize, "send_receipt": send_receipt}

with Queue() as queue:  # DATABASE_URL, else the embedded server
    migrate(queue.url)  # idempotent; safe from many starters at once
    job = queue.enqueue(
        "send_email", {"to": "a@example.com"}, priority=5, idempotency_key="welcome-42"
    )
    again = queue.enqueue("send_email", {"to": "a@example.com"}, idempotency_key="welcome-42")
    assert again.id == job.id and again.duplicate  # no second row, no error

    queue.enqueue_many([{"task": "resize", "payload": {"image": i}} for i in range(1_000)])

    # The job commits or rolls back with the caller's own transaction.
    with psycopg.connect(queue.url) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS orders (id serial PRIMARY KEY, total int)")
        conn.execute("INSERT INTO orders (total) VALUES (42)")
        queue.enqueue("send_receipt", {"order": 42}, connection=conn)
        # conn.rollback() here would leave neither the order nor the job

    worker = Worker(HANDLERS, url=queue.url)

    def wait_then_stop() -> None:
        try:
            print(queue.wait(job.id, timeout=30).result)  # woken by NOTIFY, not by polling
        finally:
            worker.request_stop()  # as SIGTERM would: finish, ack, stop

    threading.Thread(target=wait_then_stop).start()
    worker.run()  # until SIGTERM/SIGINT or request_stop()
