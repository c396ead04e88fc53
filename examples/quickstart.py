"""The README's quick start, runnable as it stands.

    python examples/quickstart.py

Uses DATABASE_URL, or else the embedded server in ./.pgqueue. Enqueues a job
(twice, with one idempotency key), a bulk of jobs and a job inside the
caller's own transaction, then runs a worker until the first job's result is
in.
"""

from __future__ import annotations

import threading

import psycopg

from pgqueue import Job, Queue, migrate
from pgqueue.worker import Worker


def send_email(job: Job) -> dict[str, bool]:
    # Sync handlers run in a thread pool, async ones on the worker's loop. A
    # job may run twice after a fault, so a handler must be idempotent.
    return {"sent": True}


def resize(job: Job) -> None: ...


def send_receipt(job: Job) -> None: ...


HANDLERS = {"send_email": send_email, "resize": resize, "send_receipt": send_receipt}


def main() -> dict[str, bool]:
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
        result: dict[str, bool] = {}

        def wait_then_stop() -> None:
            try:
                result.update(queue.wait(job.id, timeout=30).result)  # woken by NOTIFY
            finally:
                worker.request_stop()  # as SIGTERM would: finish, ack, exit

        threading.Thread(target=wait_then_stop).start()
        worker.run()  # until SIGTERM/SIGINT, or request_stop()
    return result


if __name__ == "__main__":
    print(main())
