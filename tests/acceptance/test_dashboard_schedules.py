"""The dashboard's Schedules view in a real headless Chromium, against a real
uvicorn and database: what it shows (cadence, next run, last run, last
outcome, enabled) is compared with SQL; Run now and Disable are asked
first, dismissed once (nothing written), then confirmed and checked in the
database; the view fits a 1440x900 screen and a 390x844 phone."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pgqueue import Queue, Schedule, Settings
from pgqueue.api import create_app
from pgqueue.core import schedules as s
from tests.acceptance.test_dashboard_views import answer, click, open_page, rows, until
from tests.browser import DevTools
from tests.support import LiveServer

ADMIN, READER = "sched-admin-token", "sched-read-token"
DESKTOP = (1440, 900)
PHONE = (390, 844)


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevTools]:
    with DevTools("about:blank", tmp_path_factory.mktemp("chromium")) as browser:
        browser.viewport(*DESKTOP)
        yield browser


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    return tmp_path / "screenshots"


@pytest.fixture
def schedules(queue: Queue, sql: psycopg.Connection[Any]) -> None:
    """One schedule from code that ran (its job succeeded), a runtime one that
    has not run yet, and a runtime one switched off."""
    declared = Schedule.create("nightly", task="report", cron="30 2 * * *", tz="Europe/Berlin")
    queue.run(s.sync([declared], ["report"]))
    sql.execute("UPDATE pgqueue_schedules SET next_run_at = '2026-01-01 01:30+00'")
    queue.run(s.fire_due(5))
    sql.execute("UPDATE pgqueue_jobs SET state = 'succeeded', finished_at = now()")
    queue.create_schedule("cleanup", "purge", every=3600)
    queue.create_schedule("digest", cron="0 8 * * 1", enabled=False)


def stored(sql: psycopg.Connection[Any]) -> dict[str, dict[str, Any]]:
    found = sql.execute(
        "SELECT s.name, s.enabled, s.origin, s.next_run_at, s.last_run_at, s.last_job_id, "
        "j.state FROM pgqueue_schedules s LEFT JOIN pgqueue_jobs j ON j.id = s.last_job_id"
    ).fetchall()
    keys = ("enabled", "origin", "next_run_at", "last_run_at", "last_job_id", "state")
    return {row[0]: dict(zip(keys, row[1:], strict=True)) for row in found}


def moment(iso: str) -> datetime | None:
    return datetime.fromisoformat(iso) if iso else None


def fits(page: DevTools, width: int) -> None:
    widths = page.run("[document.documentElement.scrollWidth, "
                      "document.documentElement.clientWidth]")  # fmt: skip
    assert widths[0] <= widths[1] == width, widths  # type: ignore[index]


def test_the_schedules_view_shows_what_sql_holds_and_acts_after_a_question(
    settings: Settings, schedules: None, sql: psycopg.Connection[Any], page: DevTools, shots: Path
) -> None:
    page.viewport(*DESKTOP)
    with LiveServer(create_app(settings)) as server:
        open_page(page, server, "#view=schedules")
        until(page, 'document.querySelectorAll("#schedules-body tr[data-schedule]").length === 3')
        shown = rows(page, "schedules-body", "schedule")
        fits(page, DESKTOP[0])
        page.screenshot(shots / "schedules-desktop.png")
        truth = stored(sql)
        assert set(shown) == set(truth) == {"nightly", "cleanup", "digest"}
        for name, row in shown.items():
            held = truth[name]
            assert moment(row["lastRunAt"]) == held["last_run_at"], name
            assert row["cols"]["enabled"] == ("yes" if held["enabled"] else "no"), name
            assert row["cols"]["name"] == f"{name} {held['origin']}"
            if held["enabled"]:
                assert moment(row["nextRunAt"]) == held["next_run_at"], name
            else:
                assert row["cols"]["next"] == "—"
        assert shown["nightly"]["cols"]["cadence"] == "30 2 * * * (Europe/Berlin)"
        assert shown["cleanup"]["cols"]["cadence"] == "every 3600 s"
        nightly = truth["nightly"]
        assert shown["nightly"]["cols"]["outcome"] == f"succeeded (#{nightly['last_job_id']})"
        assert shown["cleanup"]["cols"]["outcome"] == "—"
        assert shown["cleanup"]["buttons"] == ["Disable", "Run now"]
        assert shown["digest"]["buttons"] == ["Enable", "Run now"]

        run_now = '#schedules-body tr[data-schedule="cleanup"] button:nth-of-type(2)'
        click(page, run_now)
        assert "Run schedule cleanup now?" in answer(page, accept=False)
        assert stored(sql)["cleanup"]["last_job_id"] is None
        click(page, run_now)
        answer(page, accept=True)
        outcome = '#schedules-body tr[data-schedule="cleanup"] td[data-col="outcome"]'
        until(page, f"document.querySelector('{outcome}').textContent.startsWith('queued (#')")
        ran = stored(sql)["cleanup"]
        key = sql.execute("SELECT idempotency_key FROM pgqueue_jobs WHERE id = %s",
                          (ran["last_job_id"],)).fetchone()  # fmt: skip
        assert key is not None and key[0].startswith("pgqueue:schedule-now:cleanup@")
        shown_outcome = rows(page, "schedules-body", "schedule")["cleanup"]["cols"]["outcome"]
        assert shown_outcome == f"queued (#{ran['last_job_id']})"

        click(page, '#schedules-body tr[data-schedule="cleanup"] button')
        assert "Disable schedule cleanup?" in answer(page, accept=True)
        until(page, 'document.querySelector(\'#schedules-body tr[data-schedule="cleanup"] '
                    'td[data-col="enabled"]\').textContent === "no"')  # fmt: skip
        assert stored(sql)["cleanup"]["enabled"] is False


def test_the_schedules_view_fits_a_phone_and_a_read_token_sees_no_button(
    settings: Settings, schedules: None, page: DevTools, shots: Path
) -> None:
    app = create_app(settings.replace(api_tokens=(ADMIN,), api_read_tokens=(READER,)))
    page.viewport(*PHONE, mobile=True)
    try:
        with LiveServer(app) as server:
            page.goto(f"{server.url}/dashboard#token={ADMIN}&view=schedules")
            until(page, 'document.querySelector("#schedules-body tr[data-schedule] button")')
            fits(page, PHONE[0])
            # Every field and button of every schedule is on the screen, none scrolled away.
            right = page.run('Math.max(...[...document.querySelectorAll('
                             '"#schedules-body td, #schedules-body button")]'
                             '.map((el) => el.getBoundingClientRect().right))')  # fmt: skip
            assert 0 < right <= PHONE[0]  # type: ignore[operator]
            page.screenshot(shots / "schedules-phone.png")
            page.run('sessionStorage.setItem("pgqueue.dashboard.token", "' + READER + '"); true')
            page.goto("about:blank")  # the same address again would not load the page anew
            open_page(page, server, "#view=schedules")
            assert page.run('!document.getElementById("access-badge").hidden') is True
            until(page, 'document.querySelectorAll("#schedules-body tr[data-schedule]").length')
            buttons = page.run('document.querySelectorAll("#schedules-body button").length')
            assert buttons == 0
            fits(page, PHONE[0])
    finally:
        page.run('sessionStorage.removeItem("pgqueue.dashboard.token"); true')
        page.viewport(*DESKTOP)
