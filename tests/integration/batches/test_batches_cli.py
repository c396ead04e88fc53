"""``pgqueue batches show|close`` against a real database, and the one-line
error for an unknown batch."""

from __future__ import annotations

from pgqueue import Queue
from tests.integration.cli.test_cli import assert_one_line_error, run, run_json


def test_show_and_close_a_batch(db_url: str, queue: Queue) -> None:
    batch = queue.open_batch(on_success={"task": "done", "queue": "cb"}, on_death={"task": "x"})
    queue.enqueue("work", batch=batch.id)
    joined = run_json(db_url, "enqueue", "work", "--batch", str(batch.id))
    assert joined["batch_id"] == str(batch.id)
    shown = run(db_url, "batches", "show", str(batch.id))
    assert shown.exit_code == 0, shown.output
    assert f"batch {batch.id}: open, 2 jobs (2 queued)" in shown.stdout
    rows = [line.split() for line in shown.stdout.splitlines()[2:]]
    assert rows == [["on_success", "done", "cb", "-"], ["on_death", "x", "default", "-"]]
    closed = run_json(db_url, "batches", "close", str(batch.id))
    assert (closed["state"], closed["pending"], closed["callback_jobs"]) == ("closed", 2, {})
    for job in queue.claim(2):
        queue.ack(job)
    finished = run_json(db_url, "batches", "show", str(batch.id))
    assert finished["state"] == "finished"
    [callback] = [job for job in queue.list_jobs() if job.task == "done"]
    assert finished["callback_jobs"] == {"on_success": callback.id}
    assert finished["counts"] == {"succeeded": 2}


def test_an_unknown_batch_is_one_line(db_url: str) -> None:
    for bad in ("nope", "6f1c1f1e-0000-4000-8000-000000000000"):
        assert_one_line_error(run(db_url, "batches", "show", bad), 1, "does not exist")
        assert_one_line_error(run(db_url, "batches", "close", bad), 1, "does not exist")
    joining = run(db_url, "enqueue", "work", "--batch", "6f1c1f1e-0000-4000-8000-000000000000")
    assert_one_line_error(joining, 1, "does not exist")
