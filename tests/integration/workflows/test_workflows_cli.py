"""``pgqueue workflows show|cancel|retry`` against a real database, and
the one-line error for an unknown workflow."""

from __future__ import annotations

from pgqueue import Queue, chain, group
from tests.integration.cli.test_cli import assert_one_line_error, run, run_json


def test_show_cancel_and_retry_a_workflow(db_url: str, queue: Queue) -> None:
    made = queue.enqueue_workflow(chain({"task": "a"}, group({"task": "b"}, {"task": "c"})))
    a, b, c = made.jobs
    shown = run(db_url, "workflows", "show", str(made.id))
    assert shown.exit_code == 0, shown.output
    assert f"workflow {made.id}: 3 jobs (2 waiting, 1 queued)" in shown.stdout
    rows = {line.split()[0]: line.split() for line in shown.stdout.splitlines()[2:]}
    assert rows[str(b.id)][3:] == ["waiting", "0/5", str(a.id)]
    cancelled = run_json(db_url, "workflows", "cancel", str(made.id))
    assert cancelled["counts"]["cancelled"] == 3
    assert cancelled["edges"] == [
        {"parent": a.id, "child": b.id},
        {"parent": a.id, "child": c.id},
    ]
    retried = run_json(db_url, "workflows", "retry", str(made.id))
    assert [job["state"] for job in retried["jobs"]] == ["queued", "waiting", "waiting"]
    assert retried["jobs"][1]["workflow_id"] == str(made.id)


def test_an_unknown_workflow_is_one_line(db_url: str) -> None:
    for bad in ("nope", "6f1c1f1e-0000-4000-8000-000000000000"):
        assert_one_line_error(run(db_url, "workflows", "show", bad), 1, "does not exist")
