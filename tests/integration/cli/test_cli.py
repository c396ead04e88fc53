"""The command line against a real database: every command, its output and
its errors (one line, exit 2 for usage, 1 at run time, no traceback)."""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
from typer.testing import CliRunner, Result

from pgqueue import JobNotFound, JobState, Queue
from pgqueue.cli import app
from pgqueue.sql import migration_versions

runner = CliRunner()


def run(db_url: str, *args: str, input: str | None = None) -> Result:
    return runner.invoke(app, ["--database-url", db_url, *args], input=input)


def run_json(db_url: str, *args: str) -> Any:
    result = run(db_url, *args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def assert_one_line_error(result: Result, code: int, *needles: str) -> None:
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


def count_jobs(sql: psycopg.Connection[Any]) -> int:
    return sql.execute("SELECT count(*) FROM pgqueue_jobs").fetchone()[0]  # type: ignore[index]


# -- enqueue -------------------------------------------------------------------------


def test_enqueue_writes_every_option(db_url: str, queue: Queue) -> None:
    out = run_json(
        db_url,
        "enqueue",
        "send_mail",
        "--payload",
        '{"to": "a@example.com"}',
        "--queue",
        "mail",
        "--priority",
        "7",
        "--delay",
        "1h30m",
        "--max-attempts",
        "3",
        "--timeout",
        "45s",
        "--idempotency-key",
        "mail-1",
    )
    job = queue.get(out["id"])
    assert (job.task, job.queue, job.payload) == ("send_mail", "mail", {"to": "a@example.com"})
    assert (job.priority, job.max_attempts, job.timeout_seconds) == (7, 3, 45.0)
    assert job.idempotency_key == "mail-1" and out["duplicate"] is False
    delay = (job.run_at - job.enqueued_at).total_seconds()
    assert 5390 <= delay <= 5410

    again = run(db_url, "enqueue", "send_mail", "--idempotency-key", "mail-1")
    assert again.exit_code == 0
    assert f"job {job.id} already holds idempotency key 'mail-1'" in again.stdout
    assert len(queue.list_jobs()) == 1


def test_enqueue_run_at_needs_a_zone(db_url: str, queue: Queue) -> None:
    out = run_json(db_url, "enqueue", "report", "--run-at", "2031-02-03T04:05:06Z")
    assert queue.get(out["id"]).run_at.isoformat() == "2031-02-03T04:05:06+00:00"
    assert_one_line_error(
        run(db_url, "enqueue", "report", "--run-at", "2031-02-03T04:05:06"),
        2,
        "--run-at",
        "no time zone",
    )


@pytest.mark.parametrize(
    ("args", "code", "needles"),
    [
        (["--payload", "{not json"], 2, ["--payload", "not valid JSON"]),
        (["--payload", "[1, 2]"], 2, ["--payload", "must be a JSON object"]),
        (["--priority", "99999"], 1, ["invalid job: priority", "between"]),
        (["--max-attempts", "0"], 1, ["invalid job: max_attempts"]),
        (["--queue", "bad queue!"], 1, ["invalid job: queue"]),
        (["--delay", "soon"], 2, ["--delay", "not a duration"]),
        (["--delay", "5s", "--run-at", "2031-01-01T00:00:00Z"], 1, ["delay", "not both"]),
    ],
)
def test_enqueue_rejects_bad_input_in_one_line(
    db_url: str, sql: psycopg.Connection[Any], args: list[str], code: int, needles: list[str]
) -> None:
    assert_one_line_error(run(db_url, "enqueue", "echo", *args), code, *needles)
    assert count_jobs(sql) == 0


# -- errors in general --------------------------------------------------------------------


@pytest.mark.parametrize("command", [["jobs", "show"], ["jobs", "cancel"], ["jobs", "retry"]])
def test_unknown_job_is_a_runtime_error(db_url: str, command: list[str]) -> None:
    assert_one_line_error(run(db_url, *command, "424242"), 1, "job 424242 does not exist")


def test_debug_lets_the_exception_through(db_url: str) -> None:
    result = runner.invoke(app, ["--debug", "--database-url", db_url, "jobs", "show", "424242"])
    assert result.exit_code == 1
    assert isinstance(result.exception, JobNotFound)


def test_usage_errors_exit_2(db_url: str) -> None:
    assert_one_line_error(run(db_url, "jobs", "list", "--bogus"), 2, "No such option: --bogus")
    assert_one_line_error(run(db_url, "jobs", "show", "abc"), 2, "ID")
    assert_one_line_error(run(db_url, "jobs", "list", "--state", "lost"), 2, "--state")
    assert_one_line_error(run(db_url, "jobs", "retry"), 2, "--all-dead")
    assert_one_line_error(run(db_url, "jobs", "retry", "3", "--all-dead"), 2, "not both")
    assert_one_line_error(run(db_url, "jobs", "retry", "3", "--queue", "q"), 2, "--queue")
    result = runner.invoke(app, [])
    assert result.exit_code == 2 and "Usage" in result.output and "jobs" in result.output


def test_database_down_is_one_line_and_fast() -> None:
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    started = time.monotonic()
    result = runner.invoke(
        app, ["--database-url", f"postgresql://postgres@127.0.0.1:{port}/x", "jobs", "list"]
    )
    assert_one_line_error(result, 1, "database unavailable", "refused")
    assert time.monotonic() - started < 3


# -- jobs ----------------------------------------------------------------------------------


def test_jobs_list_filters_and_pages(db_url: str, queue: Queue) -> None:
    ids = [
        queue.enqueue("a" if n % 2 else "b", {"n": n}, queue="q1" if n < 4 else "q2").id
        for n in range(6)
    ]
    queue.cancel(ids[0])

    listed = run_json(db_url, "jobs", "list")
    assert [j["id"] for j in listed] == ids[::-1]
    assert [j["id"] for j in run_json(db_url, "jobs", "list", "--queue", "q1", "--task", "a")] == [
        ids[3],
        ids[1],
    ]
    assert [j["id"] for j in run_json(db_url, "jobs", "list", "--state", "cancelled")] == [ids[0]]
    page = run_json(db_url, "jobs", "list", "--limit", "2", "--before", str(ids[4]))
    assert [j["id"] for j in page] == [ids[3], ids[2]]

    table = run(db_url, "jobs", "list", "--limit", "2")
    assert table.exit_code == 0
    rows = [line.split() for line in table.stdout.splitlines()[1:]]
    assert [(r[0], r[1], r[2], r[3]) for r in rows] == [
        (str(ids[5]), "q2", "a", "queued"),
        (str(ids[4]), "q2", "b", "queued"),
    ]
    assert f"--before {ids[4]}" in table.stderr


def test_jobs_list_searches_payload_and_metadata_by_containment(db_url: str, queue: Queue) -> None:
    order = queue.enqueue("ship", {"order": 42, "lines": [1, 2]}, metadata={"tenant": "acme"})
    queue.enqueue("ship", {"order": 7})
    found = run_json(db_url, "jobs", "list", "--payload-contains", '{"order": 42}')
    assert [j["id"] for j in found] == [order.id]
    found = run_json(db_url, "jobs", "list", "--metadata-contains", '{"tenant": "acme"}')
    assert [j["id"] for j in found] == [order.id]
    bad = run(db_url, "jobs", "list", "--payload-contains", "order=42")
    assert bad.exit_code == 2 and "'--payload-contains'" in bad.stderr
    assert "must be a JSON object" in bad.stderr and "Traceback" not in bad.output


def test_jobs_list_fits_80_columns_one_line_per_job(db_url: str, queue: Queue) -> None:
    long = queue.enqueue(
        "send_welcome_email_to_new_customer", queue="emails-transactional-high-priority"
    )
    short = queue.enqueue("charge", queue="pay")
    queue.fail(queue.claim(2, worker="w")[0], "SMTPRecipientsRefused: " + "x" * 100)
    result = runner.invoke(app, ["--database-url", db_url, "jobs", "list"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert len(lines) == 3 and all(len(line) <= 80 for line in lines), lines
    assert [line.split()[0] for line in lines[1:]] == [str(short.id), str(long.id)]
    assert "…" in lines[2] and "send_welcome_email_to_new_customer" not in lines[2]


def test_jobs_list_views_of_queued_jobs_and_error_text(db_url: str, queue: Queue) -> None:
    later = queue.enqueue("a", delay_seconds=3600).id
    queue.enqueue("a")  # runnable now: in neither view
    failing = queue.enqueue("b", queue="f", max_attempts=3)
    [claimed] = queue.claim(queues=["f"])
    assert claimed.id == failing.id
    queue.fail(claimed, "disk full on /var")  # queued again, after a backoff

    def ids(*args: str) -> list[int]:
        return [job["id"] for job in run_json(db_url, "jobs", "list", *args)]

    assert ids("--state", "scheduled") == [failing.id, later]
    assert ids("--state", "retrying") == [failing.id]
    assert ids("--error-contains", "disk full") == [failing.id]
    assert ids("--error-contains", "Disk") == []  # case-sensitive
    assert_one_line_error(
        run(db_url, "jobs", "list", "--error-contains", "x" * 1001), 2, "--error-contains"
    )


def test_jobs_show(db_url: str, queue: Queue) -> None:
    job = queue.enqueue("echo", {"greeting": "hello"}, queue="mail")
    out = run_json(db_url, "jobs", "show", str(job.id))
    assert out == job.to_dict()
    shown = run(db_url, "jobs", "show", str(job.id))
    assert shown.exit_code == 0
    assert f"job {job.id}" in shown.stdout and '"greeting": "hello"' in shown.stdout


def test_jobs_cancel_and_retry(db_url: str, queue: Queue) -> None:
    job = queue.enqueue("echo")
    result = run(db_url, "jobs", "cancel", str(job.id))
    assert result.exit_code == 0 and f"cancelled job {job.id}" in result.stdout
    assert queue.get(job.id).state is JobState.CANCELLED
    assert_one_line_error(
        run(db_url, "jobs", "cancel", str(job.id)), 1, f"cannot cancel job {job.id}", "cancelled"
    )
    assert run_json(db_url, "jobs", "retry", str(job.id))["state"] == "queued"
    assert queue.get(job.id).state is JobState.QUEUED
    assert_one_line_error(
        run(db_url, "jobs", "retry", str(job.id)), 1, f"retry job {job.id}", "queued"
    )


def _kill(queue: Queue, name: str, n: int) -> list[int]:
    ids = [queue.enqueue("boom", queue=name, max_attempts=1).id for _ in range(n)]
    for job in queue.claim(n, worker="t", queues=[name]):
        assert queue.fail(job, "boom") is JobState.DEAD
    return ids


def test_retry_all_dead_of_one_queue(db_url: str, queue: Queue) -> None:
    mail = _kill(queue, "mail", 3)
    other = _kill(queue, "other", 2)
    assert run_json(db_url, "jobs", "retry", "--all-dead", "--queue", "mail") == {
        "retried": 3,
        "queue": "mail",
    }
    assert {queue.get(i).state for i in mail} == {JobState.QUEUED}
    assert {queue.get(i).state for i in other} == {JobState.DEAD}
    result = run(db_url, "jobs", "retry", "--all-dead")
    assert result.exit_code == 0 and "retried 2 dead job(s)" in result.stdout


# -- queues and top ----------------------------------------------------------------------------


def test_queues_counts_every_state(db_url: str, queue: Queue, sql: psycopg.Connection[Any]) -> None:
    for _ in range(3):
        queue.enqueue("echo", queue="mail")
    queue.enqueue("echo", queue="mail", delay=3600)
    sql.execute("UPDATE pgqueue_jobs SET run_at = now() - interval '90 seconds'")
    queue.enqueue("echo", queue="mail", delay=3600)  # scheduled
    [running] = queue.claim(1, worker="t", queues=["mail"])
    for _ in range(2):
        queue.enqueue("echo", queue="web")
    for job in queue.claim(2, worker="t", queues=["web"]):
        queue.ack(job, {})
    _kill(queue, "web", 1)
    queue.cancel(queue.enqueue("echo", queue="web").id)

    out = run_json(db_url, "queues")
    by_name = {row["queue"]: row for row in out["queues"]}
    mail, web = by_name["mail"], by_name["web"]
    # The job delayed by an hour and then moved back 90 s is runnable: 4 runnable in all,
    # one of them claimed.
    assert (mail["queued"], mail["scheduled"], mail["running"]) == (3, 1, 1)
    assert 89 <= mail["oldest_runnable_seconds"] < 200
    assert (web["succeeded"], web["dead"], web["failed"], web["cancelled"]) == (2, 1, 1, 1)
    assert web["finished_last_minute"] == 3 and web["succeeded_last_minute"] == 2
    assert mail["finished_last_minute"] == 0
    total = out["total"]
    assert (total["queued"], total["running"], total["succeeded"], total["dead"]) == (3, 1, 2, 1)
    assert running.queue == "mail"

    table = run(db_url, "queues")
    assert table.exit_code == 0
    rows = {line.split()[0]: line.split() for line in table.stdout.splitlines()[1:4]}
    # queue queued sched running wait ok failed dead cancel oldest 1m
    assert rows["mail"][1:4] == ["3", "1", "1"]
    assert rows["web"][5:9] == ["2", "1", "1", "1"] and rows["web"][-1] == "3"
    assert rows["total"][1] == "3"


def test_queues_when_empty(db_url: str) -> None:
    result = run(db_url, "queues")
    assert result.exit_code == 0 and "no jobs yet" in result.stdout
    assert run_json(db_url, "queues")["queues"] == []


def test_top_refreshes_the_given_number_of_times(db_url: str, queue: Queue) -> None:
    queue.enqueue("echo", queue="mail")
    result = run(db_url, "top", "--iterations", "3", "--interval", "0.1", "--json")
    assert result.exit_code == 0, result.output
    frames = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(frames) == 3
    assert [f["queues"][0]["queued"] for f in frames] == [1, 1, 1]
    assert frames[0]["done_per_second"] is None and frames[2]["done_per_second"] == 0

    shown = run(db_url, "top", "--iterations", "1")
    assert shown.exit_code == 0 and "pgqueue top" in shown.stdout and "mail" in shown.stdout


# -- enqueue-file ---------------------------------------------------------------------------------

MIXED = [
    '{"task": "echo", "payload": {"n": 1}}',  # 1 created
    "",  # 2 blank, skipped
    '{"task": "echo", "payload": {"n": 2}, "idempotency_key": "k"}',  # 3 created
    "{this is not json",  # 4 rejected
    '{"task": "echo", "priority": 99999}',  # 5 rejected
    '{"task": "echo", "idempotency_key": "k"}',  # 6 existing (line 3)
    '{"payload": {}}',  # 7 rejected: no task
    '{"task": "echo", "colour": "red"}',  # 8 rejected: unknown field
    '{"task": "echo", "run_at": "2031-01-01T00:00:00Z", "queue": "later"}',  # 9 created
    '["task", "echo"]',  # 10 rejected
    '{"task": "echo", "payload": {"n": 11}}',  # 11 created
]


def _file(tmp_path: Path, lines: list[str]) -> str:
    path = tmp_path / "jobs.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_enqueue_file_writes_good_lines_and_reports_bad_ones(
    db_url: str, queue: Queue, tmp_path: Path
) -> None:
    result = run(db_url, "enqueue-file", _file(tmp_path, MIXED), "--chunk-size", "2", "--json")
    assert result.exit_code == 1, result.output
    report = json.loads(result.stdout)
    assert (report["created"], report["existing"], report["lines"]) == (4, 1, 11)
    assert report["written_lines"] == 5 and report["not_written"] is None
    rejected = {r["line"]: r["reason"] for r in report["rejected"]}
    assert sorted(rejected) == [4, 5, 7, 8, 10]
    assert "not valid JSON" in rejected[4]
    assert rejected[5].startswith("priority:")
    assert rejected[7] == "task: missing"
    assert "unknown field 'colour'" in rejected[8]
    assert "JSON object" in rejected[10]
    assert "1 line(s)" not in result.stderr and "5 line(s) rejected" in result.stderr

    jobs = sorted(queue.list_jobs(), key=lambda j: j.id)
    assert [j.payload.get("n") for j in jobs] == [1, 2, None, 11]
    assert jobs[2].queue == "later" and jobs[2].run_at.year == 2031


def test_enqueue_file_human_summary(db_url: str, tmp_path: Path) -> None:
    result = run(db_url, "enqueue-file", _file(tmp_path, MIXED))
    assert result.exit_code == 1
    out = result.stdout
    assert "read 11 line(s): 4 created, 1 already existed" in out and "5 rejected" in out
    assert "every other line was written (5 job(s))" in out
    lines = [line.strip().split(None, 1) for line in out.splitlines()]
    assert ["5", "priority: must be between -32767 and 32767, got 99999"] in lines


def test_enqueue_file_all_good_exits_0(db_url: str, queue: Queue, tmp_path: Path) -> None:
    lines = [json.dumps({"task": "echo", "payload": {"n": n}}) for n in range(25)]
    report = run_json(db_url, "enqueue-file", _file(tmp_path, lines), "--chunk-size", "10")
    assert (report["created"], report["rejected"]) == (25, [])
    assert len(queue.list_jobs(limit=100)) == 25


def test_enqueue_file_atomic_writes_nothing_when_a_line_is_bad(
    db_url: str, sql: psycopg.Connection[Any], tmp_path: Path
) -> None:
    result = run(db_url, "enqueue-file", _file(tmp_path, MIXED), "--atomic")
    assert result.exit_code == 1
    assert "nothing was written (--atomic)" in result.stdout
    assert count_jobs(sql) == 0


def test_enqueue_file_reads_stdin_and_checks_the_path(db_url: str, queue: Queue) -> None:
    result = run(db_url, "enqueue-file", "-", input='{"task": "echo"}\n{"task": "echo"}\n')
    assert result.exit_code == 0 and "2 created" in result.stdout
    assert len(queue.list_jobs()) == 2
    assert_one_line_error(run(db_url, "enqueue-file", "/nonexistent/jobs.jsonl"), 2, "cannot open")


def test_enqueue_file_says_which_lines_a_failed_write_lost(
    db_url: str, queue: Queue, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = 0
    real = Queue.enqueue_many

    def flaky(self: Queue, jobs: Any, **kw: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise psycopg.OperationalError("server closed the connection unexpectedly")
        return real(self, jobs, **kw)

    monkeypatch.setattr(Queue, "enqueue_many", flaky)
    lines = [json.dumps({"task": "echo", "payload": {"n": n}}) for n in range(1, 8)]
    result = run(db_url, "enqueue-file", _file(tmp_path, lines), "--chunk-size", "3", "--json")
    assert result.exit_code == 1
    report = json.loads(result.stdout)
    assert report["written_lines"] == 3 and report["created"] == 3
    assert report["not_written"] == {"first_line": 4, "last_line": 6}
    assert report["unread_after_line"] == 6
    assert "server closed the connection" in report["error"]
    assert sorted(j.payload["n"] for j in queue.list_jobs()) == [1, 2, 3]


@pytest.mark.parametrize(("presses", "written"), [(1, 3), (2, 0)])
def test_enqueue_file_ctrl_c_during_a_write_waits_for_it_unless_pressed_twice(
    db_url: str,
    queue: Queue,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    presses: int,
    written: int,
) -> None:
    """The first Ctrl-C lets the chunk being written commit, so that the
    summary is exact; a second one interrupts the write itself."""
    real = Queue.enqueue_many

    def interrupted(self: Queue, jobs: Any, **kw: Any) -> Any:
        for _ in range(presses):
            os.kill(os.getpid(), signal.SIGINT)
        return real(self, jobs, **kw)

    monkeypatch.setattr(Queue, "enqueue_many", interrupted)
    lines = [json.dumps({"task": "echo", "payload": {"n": n}}) for n in range(1, 8)]
    result = run(db_url, "enqueue-file", _file(tmp_path, lines), "--chunk-size", "3", "--json")
    assert result.exit_code == 130, result.output
    report = json.loads(result.stdout)
    assert report["interrupted"] is True and report["written_lines"] == written
    assert report["not_written"] == (None if written else {"first_line": 1, "last_line": 3})
    assert report["unread_after_line"] == 3
    assert len(queue.list_jobs()) == written


# -- prune, migrate ------------------------------------------------------------------


def test_prune_deletes_only_old_finished_jobs(
    db_url: str, queue: Queue, sql: psycopg.Connection[Any]
) -> None:
    for _ in range(5):
        queue.enqueue("echo")
    for job in queue.claim(4, worker="t"):
        queue.ack(job, None)
    sql.execute(
        "UPDATE pgqueue_jobs SET finished_at = now() - interval '2 hours' "
        "WHERE id IN (SELECT id FROM pgqueue_jobs WHERE state = 'succeeded' ORDER BY id LIMIT 3)"
    )
    assert run_json(db_url, "prune", "--older-than", "1h", "--batch", "2") == {
        "pruned": 3,
        "older_than_seconds": 3600.0,
        "archive_partitions_dropped": [],
        "archived_jobs_dropped_estimate": 0,
    }
    assert count_jobs(sql) == 2
    result = run(db_url, "prune")  # default retention: 7 days
    assert result.exit_code == 0 and "pruned 0 finished job(s) older than 7d00h" in result.stdout


def test_migrate_a_fresh_database_then_nothing(db_url: str) -> None:
    admin = db_url.rsplit("/", 1)[0] + "/postgres"
    fresh = db_url + "_fresh"
    name = fresh.rsplit("/", 1)[1]
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    try:
        assert run_json(fresh, "migrate") == {"applied": migration_versions()}
        again = run(fresh, "migrate")
        assert again.exit_code == 0 and "up to date" in again.stdout
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
