"""``pgqueue workflows list|show|cancel|retry`` against a real database, and
the one-line error for an unknown workflow."""

from __future__ import annotations

import pytest

from pgqueue import InvalidJob, Queue, chain, group
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


def test_list_workflows_newest_first_with_their_counts(db_url: str, queue: Queue) -> None:
    old = queue.enqueue_workflow(chain({"task": "a"}, {"task": "b"}))
    new = queue.enqueue_workflow(group({"task": "c"}, {"task": "d"}))
    queue.workflow(new.id, "cancel")
    listed = run_json(db_url, "workflows", "list")
    assert [w["workflow_id"] for w in listed] == [str(new.id), str(old.id)]
    assert listed[0]["counts"]["cancelled"] == 2 and listed[0]["finished"] is True
    assert listed[1]["counts"] | {} == {**dict.fromkeys(listed[1]["counts"], 0), "waiting": 1,
                                        "queued": 1}  # fmt: skip
    running = run_json(db_url, "workflows", "list", "--state", "running")
    assert [w["workflow_id"] for w in running] == [str(old.id)]
    table = run(db_url, "workflows", "list", "--limit", "1")
    assert table.exit_code == 0, table.output
    assert str(new.id) in table.stdout and str(old.id) not in table.stdout
    assert f"--before {new.jobs[0].id}" in table.stderr
    for flag, value in [("--state", "waiting"), ("--before", "0"), ("--limit", "201")]:
        bad = run(db_url, "workflows", "list", flag, value)
        assert bad.exit_code == 2 and flag in bad.stderr, bad.output


def test_list_workflows_refuses_a_bad_argument_naming_it(queue: Queue) -> None:
    for args, field in [({"state": "nope"}, "state"), ({"limit": 0}, "limit"),
                        ({"before": -1}, "before")]:  # fmt: skip
        with pytest.raises(InvalidJob) as caught:
            queue.list_workflows(**args)
        assert caught.value.field == field
