"""The command line's tables at a terminal's width: one line per row, no
line wider than the terminal, whole ids, states and times, names cut with an
ellipsis but never to a sliver, optional columns left out before that."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
from rich.console import Console

from pgqueue.cli.output import MIN_CUT_WIDTH, Column, controls_text, fitted_table, jobs_table
from pgqueue.core.jobs import Job, JobState
from pgqueue.core.queue_controls import QueueControls

NOW = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)


def rendered(table: object, width: int) -> list[str]:
    console = Console(width=width, record=True, force_terminal=False, color_system=None)
    with console.capture() as captured:
        console.print(table)
    return [line.rstrip() for line in captured.get().splitlines()]


def job(job_id: int, queue: str, task: str, state: JobState, error: str | None = None) -> Job:
    return Job(
        id=job_id, queue=queue, task=task, payload={}, priority=0, state=state,
        run_at=NOW + timedelta(seconds=30), attempts=1, max_attempts=5, snoozes=0,
        timeout_seconds=None, lease_token=None, lease_expires_at=None, worker=None,
        last_error=error, result=None, idempotency_key=None, unique_scope=None,
        enqueued_at=NOW - timedelta(minutes=3), started_at=None, finished_at=None,
    )  # fmt: skip


JOBS = [
    job(
        1234567, "emails-transactional", "send_welcome_email_to_new_customer", JobState.DEAD,
        "SMTPRecipientsRefused: {'bob@example.com': (550, b'5.1.1 user unknown')}\nTraceback",
    ),
    job(1234568, "default", "reports.generate_monthly_revenue_summary", JobState.QUEUED),
    job(99, "payments", "charge", JobState.RUNNING),
]  # fmt: skip


@pytest.mark.parametrize("width", [60, 80, 100, 160])
def test_jobs_fit_the_terminal_one_line_each_with_whole_ids_and_states(width: int) -> None:
    lines = rendered(jobs_table(JOBS, NOW, width), width)
    assert len(lines) == 1 + len(JOBS)
    assert all(len(line) <= width for line in lines), lines
    for line, listed in zip(lines[1:], JOBS, strict=True):
        cells = line.split()
        assert cells[0] == str(listed.id)
        assert str(listed.state) in cells
        assert "1/5" in cells


def test_a_narrow_terminal_cuts_names_with_an_ellipsis_never_to_a_sliver() -> None:
    _, dead, *_ = rendered(jobs_table(JOBS, NOW, 80), 80)
    assert "emails-…" in dead or "emails-transactional" in dead
    cut = [word for word in dead.split() if word.endswith("…")]
    assert cut and all(len(word) >= MIN_CUT_WIDTH for word in cut), cut
    assert "send_welcome_email_to_new_customer" not in dead


def test_optional_columns_go_before_the_names_are_cut_to_nothing() -> None:
    header = rendered(jobs_table(JOBS, NOW, 60), 60)[0]
    assert header.split()[:4] == ["id", "queue", "task", "state"]
    assert "last error" not in header and "run at" in header


def test_a_wide_terminal_shows_everything_whole() -> None:
    lines = rendered(jobs_table(JOBS, NOW, 200), 200)
    assert "send_welcome_email_to_new_customer" in lines[1]
    assert "reports.generate_monthly_revenue_summary" in lines[2]
    assert "last error" in lines[0] and "…" not in "".join(lines[2:])


def test_the_cut_widths_share_the_room_the_fixed_columns_leave() -> None:
    columns = (Column("id", "right"), Column("a", flexible=True), Column("b", flexible=True))
    rows = [("12345", "x" * 40, "short"), ("7", "y" * 10, "z" * 30)]
    lines = rendered(fitted_table(columns, rows, 40), 40)
    assert all(len(line) <= 40 for line in lines)
    cells = [re.split(r"\s{2,}", line.strip()) for line in lines[1:]]
    assert [row[0] for row in cells] == ["12345", "7"]
    cut = [cell for row in cells for cell in row if cell.endswith("…")]
    assert cut and all(len(cell) >= MIN_CUT_WIDTH for cell in cut), cells
    assert "short" in cells[0] and "y" * 10 in cells[1]


def test_a_queues_controls_in_words_name_fairness_and_its_objective() -> None:
    controls = QueueControls("q", concurrency_limit=5, fair=True, max_start_lag_seconds=2.5)
    assert controls_text(controls) == (
        "running, at most 5 running, fair across keys, objective: start within 2.5s"
    )
