"""Every view of the dashboard in one real headless Chromium (shared by the
module), against a real uvicorn and a real database holding jobs in every
state, three workers (alive, stalled, gone) and a paused queue.

What the page shows is checked against SQL counts of the same database, and
each action (pause, resume, a dead-letter group's retry and delete) is
confirmed or dismissed in the page's dialog, then checked in the database.
Screenshots go to a directory under pytest's tmp path (the artifacts); with
PGQUEUE_SCREENSHOT_TO set, the overview's is also written there
(``python -m bench.plots.screenshot`` writes docs/img/dashboard.png so).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pgqueue import Queue, Settings
from pgqueue.api import create_app
from pgqueue.core.transitions import Report, report_progress
from pgqueue.core.workers import WorkerInfo, register
from tests.browser import DevTools
from tests.support import LiveServer

ADMIN, READER = "views-admin-token", "views-read-token"
LAPTOP = (1280, 900)
PHONE = 400
VIEWS = ("overview", "jobs", "dead", "workers")


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevTools]:
    with DevTools("about:blank", tmp_path_factory.mktemp("chromium")) as page:
        yield page


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The screenshots: test artifacts."""
    return tmp_path_factory.mktemp("dashboard-screenshots")


@pytest.fixture
def page(browser: DevTools) -> DevTools:
    browser.viewport(*LAPTOP)
    return browser


def until(page: DevTools, expression: str) -> Any:
    """The first truthy value of a JS expression, evaluated in the page every
    25 ms (10 s at most)."""
    script = f"""(async () => {{
      for (let i = 0; i < 400; i++) {{
        const v = (() => ({expression}))();
        if (v) return v;
        await new Promise(r => setTimeout(r, 25));
      }}
      throw new Error("timed out waiting for: " + {json.dumps(expression)});
    }})()"""
    return page.run(script)


def click(page: DevTools, selector: str) -> None:
    until(page, f"document.querySelector({json.dumps(selector)})")
    page.run(f"document.querySelector({json.dumps(selector)}).click(), true")


def answer(page: DevTools, accept: bool) -> str:
    """Answer the confirmation dialog; what it asked."""
    question = until(page, 'document.getElementById("confirm").open && '
                     'document.getElementById("confirm-text").textContent')  # fmt: skip
    click(page, "#confirm-ok" if accept else "#confirm-cancel")
    until(page, '!document.getElementById("confirm").open')
    return str(question)


def show(page: DevTools, view: str) -> None:
    click(page, f'#tabs button[data-view="{view}"]')
    until(page, f"!document.querySelector('[data-in=\"{view}\"]').hidden")


def rows(page: DevTools, tbody: str, key: str) -> dict[str, dict[str, str]]:
    """Each row of a table by its data-KEY: its data attributes and cells."""
    script = f"""[...document.querySelectorAll("#{tbody} tr[data-{key}]")].map((tr) => [
      tr.dataset.{_camel(key)},
      {{...tr.dataset, cells: [...tr.children].map((td) => td.textContent),
        cols: Object.fromEntries([...tr.querySelectorAll("td[data-col]")]
          .map((td) => [td.dataset.col, td.textContent])),
        buttons: [...tr.querySelectorAll("button")].map((b) => b.textContent)}}])"""
    return dict(page.run(script))  # type: ignore[call-overload]


def _camel(key: str) -> str:
    head, *rest = key.split("-")
    return head + "".join(part.title() for part in rest)


def scalar(sql: psycopg.Connection[Any], query: str, *params: Any) -> Any:
    row = sql.execute(query, params).fetchone()
    assert row is not None
    return row[0]


# -- the stack ------------------------------------------------------------------------------------


def fail_with(queue: Queue, name: str, task: str, error: str, *, attempts: int = 1) -> int:
    job = queue.enqueue(task, queue=name, max_attempts=attempts)
    [claimed] = queue.claim(worker="w-ok", queues=[name])
    assert claimed.id == job.id
    queue.fail(claimed, error)
    return job.id


def populate(queue: Queue, sql: psycopg.Connection[Any]) -> dict[str, int]:
    """Jobs in every state (and the scheduled and retrying views), in five
    queues, one paused; three workers: alive, stalled, gone. Ids by role."""
    ids: dict[str, int] = {}
    for n in range(3):
        done = queue.enqueue("send_email", {"n": n}, queue="emails")
        [claimed] = queue.claim(worker="w-ok", queues=["emails"])
        queue.ack(claimed, {"sent": n})
    ids["succeeded"] = done.id
    ids["dead"] = fail_with(queue, "payments", "charge", "card declined\nTraceback: 1")
    fail_with(queue, "payments", "charge", "card declined\nTraceback: 2")
    fail_with(queue, "payments", "charge", "bank offline")
    fail_with(queue, "emails", "send_email", "smtp refused")
    ids["retrying"] = fail_with(queue, "images", "resize", "out of memory", attempts=5)
    # In backoff for the whole test, not for the default's second or so.
    sql.execute("UPDATE pgqueue_jobs SET run_at = now() + interval '1 hour' WHERE id = %s",
                (ids["retrying"],))  # fmt: skip
    ids["scheduled"] = queue.enqueue("resize", queue="images", delay=3600).id
    old = queue.enqueue("resize", {"old": True}, queue="images")
    sql.execute(
        "UPDATE pgqueue_jobs SET run_at = now() - interval '1 hour' WHERE id = %s", (old.id,)
    )
    running = queue.enqueue("build_report", queue="reports")
    [ids_running] = queue.claim(worker="w-ok", queues=["reports"])
    ids["running"] = ids_running.id
    assert ids["running"] == running.id
    ids["cancelled"] = queue.enqueue("build_report", queue="reports").id
    queue.cancel(ids["cancelled"])
    ids["queued"] = queue.enqueue("send_email", {"to": "b@example.com"}, queue="emails").id
    queue.enqueue("send_email", queue="archive")
    queue.pause("archive")
    queue.set_limits("images", max_start_lag_seconds=60)  # its oldest has waited an hour
    queue.set_limits("reports", fair=True)
    queue.set_key_objective("reports", "acme", 2)  # no job of acme waits: not behind

    def worker(name: str, queues: list[str]) -> None:
        info = WorkerInfo(name, "host-1", 100, "0.1.0", queues, 4)
        queue.run(register(info, 5.0, session=False))

    worker("w-ok", ["emails", "reports"])
    worker("w-stalled", ["images"])
    worker("w-gone", ["payments"])
    sql.execute("UPDATE pgqueue_workers SET started_at = now() - interval '2 hours' "
                "WHERE name = 'w-stalled'")  # fmt: skip
    sql.execute("UPDATE pgqueue_workers SET expires_at = now() - interval '1 minute', "
                "last_seen_at = now() - interval '5 minutes' WHERE name = 'w-gone'")  # fmt: skip
    return ids


@pytest.fixture
def stack(settings: Settings, queue: Queue, sql: psycopg.Connection[Any]) -> dict[str, int]:
    return populate(queue, sql)


def open_page(page: DevTools, server: LiveServer, fragment: str = "") -> None:
    page.goto(f"{server.url}/dashboard{fragment}")
    # A whole refresh came back: every part of the page is drawn.
    until(page, 'document.getElementById("status").textContent.startsWith("Updated")')


# -- overview -------------------------------------------------------------------------------------


SWATCHES = """["throughput", "latency"].map((chart) => Object.fromEntries(
  [...document.querySelectorAll("#legend-" + chart + " span")]
    .map((s) => [s.textContent, s.style.getPropertyValue("--swatch")])))"""


def test_overview_numbers_are_the_databases(
    settings: Settings, stack: dict[str, int], sql: psycopg.Connection[Any], page: DevTools,
    shots: Path,
) -> None:  # fmt: skip
    with LiveServer(create_app(settings)) as server:
        open_page(page, server)
        until(page, '!document.getElementById("charts").hidden')
        queues = rows(page, "queues-body", "queue")
        workers_alive = page.run('document.getElementById("workers-alive").textContent')
        cards = page.run('["total-queued", "total-scheduled", "total-running", "total-dead"]'
                         '.map((id) => document.getElementById(id).textContent)')  # fmt: skip
        history = page.run('[document.getElementById("history-status").textContent, '
                           '[...document.querySelectorAll("#legend-throughput span")]'
                           '.map((s) => s.textContent), '
                           'document.querySelectorAll("#chart-throughput svg, #chart-latency svg")'
                           '.length]')  # fmt: skip
        swatches = page.run(SWATCHES)
        path = page.screenshot(shots / "overview-laptop.png")
        if target := os.environ.get("PGQUEUE_SCREENSHOT_TO"):
            page.screenshot(Path(target))

    live = {
        name: (queued, scheduled, running)
        for name, queued, scheduled, running in sql.execute(
            "SELECT queue, count(*) FILTER (WHERE state = 'queued' AND run_at <= now()),"
            " count(*) FILTER (WHERE state = 'queued' AND run_at > now()),"
            " count(*) FILTER (WHERE state = 'running') FROM pgqueue_jobs GROUP BY queue"
        ).fetchall()
    }
    dead = dict(sql.execute("SELECT queue, count(*) FROM pgqueue_jobs "
                            "WHERE state = 'dead' GROUP BY queue").fetchall())  # fmt: skip
    assert set(queues) == set(live) == {"archive", "emails", "images", "payments", "reports"}
    for name, (queued, scheduled, running) in live.items():
        cols = queues[name]["cols"]
        assert (cols["queued"], cols["scheduled"], cols["running"]) == (
            str(queued),
            str(scheduled),
            str(running),
        ), name
        assert cols["dead"] == str(dead.get(name, 0)), name
    paused = {q for q, p in sql.execute("SELECT name, paused FROM pgqueue_queues").fetchall() if p}
    assert (
        {name for name, row in queues.items() if row["paused"] == "true"} == paused == {"archive"}
    )
    assert queues["archive"]["buttons"] == ["Resume", "Limits"]
    # images' oldest runnable job has waited an hour: about 3,540 s past its
    # 60 s objective; a queue without an objective has no shortfall.
    assert 3500 < float(queues["images"]["cols"]["start_lag_shortfall_seconds"]) < 3700
    assert queues["images"]["cols"]["limits"] == "start within 60 s"
    assert queues["reports"]["cols"]["limits"] == "fair across keys; acme within 2 s"
    assert queues["emails"]["cols"]["start_lag_shortfall_seconds"] == "-"
    assert queues["emails"]["buttons"] == ["Pause", "Limits"]

    alive = scalar(sql, "SELECT count(*) FROM pgqueue_workers WHERE expires_at > now()")
    assert workers_alive == str(alive) == "2"
    queued = "SELECT count(*) FROM pgqueue_jobs WHERE state = 'queued' AND run_at"
    assert cards == [
        str(scalar(sql, f"{queued} <= now()")),
        str(scalar(sql, f"{queued} > now()")),
        str(scalar(sql, "SELECT count(*) FROM pgqueue_jobs WHERE state = 'running'")),
        str(sum(dead.values())),
    ]
    # The per-minute history drawn: a throughput line per queue and the total.
    assert history[0] == "" and history[2] == 2
    # A queue has one colour in both charts, and no two queues share one.
    throughput, latency = swatches
    assert latency and all(throughput[name] == colour for name, colour in latency.items())
    queue_colours = [c for name, c in throughput.items() if name != "total"]
    assert len(set(queue_colours)) == len(queue_colours)
    assert sorted(history[1]) == sorted(["total", *live])
    assert path.stat().st_size > 10_000


# Each request the page made, by path (its query left out).
REQUESTED = """performance.getEntriesByType("resource")
  .map((e) => new URL(e.name).pathname).filter((p) => p !== "/events")"""


def test_every_refresh_reads_the_fair_queues_key_objectives_in_one_request(
    stack: dict[str, int], settings: Settings, queue: Queue, sql: psycopg.Connection[Any],
    page: DevTools,
) -> None:  # fmt: skip
    # Three fair queues with objectives (reports has acme's), one named
    # "keys"; an objective of a queue that is not fair is not shown.
    for name in ("keys", "images"):
        queue.set_limits(name, fair=True)
    queue.enqueue("resize", queue="keys", concurrency_key="k1")
    sql.execute("UPDATE pgqueue_jobs SET run_at = now() - interval '10 s' WHERE queue = 'keys'")
    queue.set_key_objective("keys", "k1", 4)
    queue.set_key_objective("images", "big", 30)
    queue.set_key_objective("emails", "vip", 1)
    with LiveServer(create_app(settings)) as server:
        open_page(page, server)
        page.run("performance.clearResourceTimings(), true")
        # A change pushed over GET /events: the page refreshes (twice, so
        # that one whole refresh is among the requests counted).
        for _ in range(2):
            queue.enqueue("send_email", queue="emails")
            until(page, f"({REQUESTED}).filter((p) => p === '/queues').length >= {_ + 1}")
        until(page, "!window.pgqueueLive.refreshing")
        requested: list[str] = page.run(REQUESTED)  # type: ignore[assignment]
        queues = rows(page, "queues-body", "queue")

    per_queue = [path for path in requested if path.startswith("/queues/")]
    assert per_queue == [], requested
    listings, reads = requested.count("/queues"), requested.count("/keys")
    # One read of the objectives per listing of the queues (the last refresh
    # may have listed them and not yet read the objectives).
    assert listings >= 2 and listings - 1 <= reads <= listings, requested
    # k1's job has waited 10 s and more: 6 s and more past its 4 s.
    behind = re.fullmatch(r"fair across keys; k1 within 4 s \((\d+\.\d) s behind\)",
                          queues["keys"]["cols"]["limits"])  # fmt: skip
    assert behind and 6.0 <= float(behind[1]) < 60.0, queues["keys"]["cols"]
    assert (
        queues["images"]["cols"]["limits"] == "fair across keys, start within 60 s; big within 30 s"
    )
    assert queues["reports"]["cols"]["limits"] == "fair across keys; acme within 2 s"
    assert "vip" not in queues["emails"]["cols"]["limits"]


def limits_of(sql: psycopg.Connection[Any], name: str) -> tuple[Any, ...] | None:
    return sql.execute(
        "SELECT concurrency_limit, rate_limit, rate_period_seconds FROM pgqueue_queues "
        "WHERE name = %s", (name,)
    ).fetchone()  # fmt: skip


def edit_limits(page: DevTools, name: str, values: dict[str, str]) -> None:
    click(page, f'#queues-body tr[data-queue="{name}"] button.limits-button')
    until(page, 'document.getElementById("limits").open')
    page.run(f"""(() => {{
      for (const [id, v] of Object.entries({json.dumps(values)}))
        document.getElementById(id).value = v;
      document.getElementById("limits-save").click();
      return true;
    }})()""")


def test_a_queues_limits_are_edited_and_set_after_a_question(
    settings: Settings, stack: dict[str, int], sql: psycopg.Connection[Any], page: DevTools
) -> None:
    message = 'document.getElementById("queues-message").textContent'
    wanted = {"limit-concurrency": "3", "limit-rate": "10", "limit-period": "60"}
    with LiveServer(create_app(settings)) as server:
        open_page(page, server)
        edit_limits(page, "emails", wanted)
        question = "Set the limits of queue emails to: at most 3 running, 10 started per 60 s?"
        assert answer(page, accept=False) == question
        assert limits_of(sql, "emails") in (None, (None, None, None))
        edit_limits(page, "emails", wanted)
        answer(page, accept=True)
        until(page, f"{message}.startsWith('Limits of emails')")
        assert limits_of(sql, "emails") == (3, 10, 60.0)
        until(page, 'document.querySelector(\'#queues-body tr[data-queue="emails"] '
                    'td[data-col="limits"]\').textContent.startsWith("at most 3")')  # fmt: skip

        # The rate emptied: no rate limit any more; the concurrency stays.
        edit_limits(page, "emails", {"limit-rate": "", "limit-period": ""})
        assert answer(page, accept=True).endswith("to: at most 3 running?")
        until(page, f"{message} === 'Limits of emails: at most 3 running.'")
        assert limits_of(sql, "emails") == (3, None, None)

        # What the API refuses is said, and nothing changes.
        edit_limits(page, "emails", {"limit-rate": "5"})
        answer(page, accept=True)
        until(page, 'document.getElementById("queues-message").className.includes("error")')
        assert "rate_period_seconds" in str(page.run(message))
        assert limits_of(sql, "emails") == (3, None, None)


def test_pause_and_resume_ask_first(
    settings: Settings, stack: dict[str, int], sql: psycopg.Connection[Any], page: DevTools
) -> None:
    def paused(name: str) -> bool:
        return bool(scalar(sql, "SELECT coalesce(bool_or(paused), false) FROM pgqueue_queues "
                           "WHERE name = %s", name))  # fmt: skip

    with LiveServer(create_app(settings)) as server:
        open_page(page, server)
        click(page, '#queues-body tr[data-queue="emails"] button')
        assert "Pause queue emails?" in answer(page, accept=False)
        assert not paused("emails")

        click(page, '#queues-body tr[data-queue="emails"] button')
        answer(page, accept=True)
        assert until(page, 'document.getElementById("queues-message").textContent') == (
            "Paused emails."
        )
        until(page, 'document.querySelector(\'#queues-body tr[data-queue="emails"]\')'
                    '.dataset.paused === "true"')  # fmt: skip
        assert paused("emails")

        click(page, '#queues-body tr[data-queue="archive"] button')
        assert "Resume queue archive?" in answer(page, accept=True)
        until(page, 'document.querySelector(\'#queues-body tr[data-queue="archive"]\')'
                    '.dataset.paused === "false"')  # fmt: skip
        assert not paused("archive")


def test_a_question_closed_with_escape_is_a_no_and_the_next_one_gets_its_own_answer(
    settings: Settings, stack: dict[str, int], sql: psycopg.Connection[Any], page: DevTools
) -> None:
    button = json.dumps('#queues-body tr[data-queue="emails"] button')
    with LiveServer(create_app(settings)) as server:
        open_page(page, server)
        click(page, '#queues-body tr[data-queue="emails"] button')
        until(page, 'document.getElementById("confirm").open')
        # Closed (as Escape does) and asked again at once: the dialog's "close"
        # event comes after the second question opened it.
        page.run(
            f'document.getElementById("confirm").close(), '
            f"document.querySelector({button}).click(), true"
        )
        assert "Pause queue emails?" in answer(page, accept=True)
        assert until(page, 'document.getElementById("queues-message").textContent') == (
            "Paused emails."
        )
        assert scalar(sql, "SELECT paused FROM pgqueue_queues WHERE name = 'emails'") is True


# -- jobs -----------------------------------------------------------------------------------------

FILTERS: list[tuple[dict[str, str], str]] = [
    ({"state-filter": "scheduled"}, "state = 'queued' AND run_at > now()"),
    ({"state-filter": "retrying"}, "state = 'queued' AND attempts > 0"),
    ({"state-filter": "dead"}, "state = 'dead'"),
    ({"queue-filter": "emails"}, "queue = 'emails'"),
    (
        {"queue-filter": "payments", "task-filter": "charge"},
        "queue = 'payments' AND task = 'charge'",
    ),
    ({"error-filter": "declined"}, "strpos(last_error, 'declined') > 0"),
    ({"state-filter": "running", "queue-filter": "reports"}, "state = 'running'"),
    ({"payload-filter": '{"to": "b@example.com"}'}, """payload @> '{"to": "b@example.com"}'"""),
]


def test_every_jobs_filter_lists_what_sql_finds(
    settings: Settings, stack: dict[str, int], sql: psycopg.Connection[Any], page: DevTools
) -> None:
    with LiveServer(create_app(settings)) as server:
        open_page(page, server, "#view=jobs")
        for given, where in FILTERS:
            query = f"SELECT id FROM pgqueue_jobs WHERE {where} ORDER BY id DESC"
            expected = [str(i) for (i,) in sql.execute(query).fetchall()]
            assert expected, where
            script = [
                "queue-filter",
                "state-filter",
                "task-filter",
                "error-filter",
                "payload-filter",
            ]
            values = {name: given.get(name, "") for name in script}
            page.run(f"""(() => {{
              for (const [id, v] of Object.entries({json.dumps(values)}))
                document.getElementById(id).value = v;
              document.getElementById("jobs-body").replaceChildren();
              document.getElementById("jobs-refresh").click();
              return true;
            }})()""")
            until(page, 'document.querySelector("#jobs-body tr")')
            shown = list(rows(page, "jobs-body", "job-id"))
            assert shown == expected, (given, where)


def search(page: DevTools, state: str) -> None:
    page.run(f"""(() => {{
      document.getElementById("state-filter").value = {json.dumps(state)};
      document.getElementById("jobs-body").replaceChildren();
      document.getElementById("jobs-refresh").click();
      return true;
    }})()""")
    until(page, shows_only(STATE_SHOWN.get(state, state)))


# The listings whose rows show another state: scheduled and retrying jobs are queued.
STATE_SHOWN = {"scheduled": "queued", "retrying": "queued"}


def shows_only(state: str) -> str:
    """Rows listed, all of jobs in ``state``: the listing a search asked for,
    not one that a refresh began before it and that landed after the rows
    were cleared."""
    return f"""(() => {{
        const shown = [...document.querySelectorAll("#jobs-body tr[data-job-id]")];
        return shown.length > 0 && shown.every((tr) => tr.dataset.state === {json.dumps(state)});
    }})()"""


def test_ticked_jobs_or_all_matching_a_filter_are_acted_on_after_a_count_and_a_question(
    settings: Settings, stack: dict[str, int], sql: psycopg.Connection[Any], page: DevTools
) -> None:
    queued = [i for (i,) in sql.execute(
        "SELECT id FROM pgqueue_jobs WHERE state = 'queued' AND run_at <= now() ORDER BY id"
    ).fetchall()][:2]  # fmt: skip
    assert len(queued) == 2
    message = 'document.getElementById("bulk-message").textContent'
    with LiveServer(create_app(settings)) as server:
        open_page(page, server, "#view=jobs")
        search(page, "queued")
        for job_id in queued:
            click(page, f'#jobs-body tr[data-job-id="{job_id}"] input[type=checkbox]')
        assert page.run('document.getElementById("jobs-chosen").textContent') == "2 selected"
        click(page, '#jobs-bulk button[data-bulk="cancel"][data-scope="selected"]')
        assert answer(page, accept=False) == "Cancel 2 of the 2 selected jobs?"
        assert scalar(sql, "SELECT count(*) FROM pgqueue_jobs WHERE id = ANY(%s) "
                      "AND state = 'cancelled'", queued) == 0  # fmt: skip
        click(page, '#jobs-bulk button[data-bulk="cancel"][data-scope="selected"]')
        answer(page, accept=True)
        until(page, f"{message} === 'Cancelled 2 jobs.'")
        assert scalar(sql, "SELECT count(*) FROM pgqueue_jobs WHERE id = ANY(%s) "
                      "AND state = 'cancelled'", queued) == 2  # fmt: skip

        search(page, "cancelled")
        cancelled = scalar(sql, "SELECT count(*) FROM pgqueue_jobs WHERE state = 'cancelled'")
        click(page, '#jobs-bulk button[data-bulk="retry"][data-scope="matching"]')
        assert answer(page, accept=True) == f"Retry {cancelled} jobs matching this filter?"
        until(page, f"{message} === 'Retried {cancelled} jobs.'")
        assert scalar(sql, "SELECT count(*) FROM pgqueue_jobs WHERE state = 'cancelled'") == 0

        search(page, "scheduled")
        before = scalar(sql, "SELECT count(*) FROM pgqueue_jobs WHERE state = 'cancelled'")
        click(page, '#jobs-bulk button[data-bulk="cancel"][data-scope="matching"]')
        until(page, f"{message}.startsWith('A bulk action takes')")
        assert not page.run('document.getElementById("confirm").open')
        assert scalar(sql, "SELECT count(*) FROM pgqueue_jobs WHERE state = 'cancelled'") == before


DISABLED = '["job-cancel", "job-retry"].map((id) => document.getElementById(id).disabled)'


def test_a_job_by_id_its_timeline_lease_holder_and_refresh_until_it_finishes(
    settings: Settings, stack: dict[str, int], queue: Queue, page: DevTools
) -> None:
    running = queue.get(stack["running"])
    with LiveServer(create_app(settings)) as server:
        open_page(page, server, "#view=jobs")
        page.run(f'document.getElementById("id-input").value = "{running.id}", true')
        click(page, "#id-form button")
        until(page, f'document.getElementById("detail-id").textContent === "#{running.id}"')
        fields = page.run(
            'Object.fromEntries([...document.querySelectorAll("#detail-fields dd, '
            '#detail-timeline dd")].map((dd) => [dd.dataset.field, dd.textContent]))'
        )
        buttons = page.run(DISABLED)
        assert fields["state"] == "running" and fields["worker"] == "w-ok"  # type: ignore[index]
        assert {"enqueued", "started", "lease expires"} <= set(fields)  # type: ignore[arg-type]
        assert "finished" not in fields  # type: ignore[operator]
        assert buttons == [False, True]  # cancel a running job; no retry

        # Finished behind the page's back: the open panel follows by itself.
        assert queue.ack(running, {"pages": 3}) is not None
        until(page, 'document.querySelector(\'#detail-fields dd[data-field="state"]\')'
                    '.textContent === "succeeded"')  # fmt: skip
        assert json.loads(str(page.run('document.getElementById("detail-result").textContent'))) \
            == {"pages": 3}  # fmt: skip
        assert page.run(DISABLED) == [True, True]
        assert "finished" in str(page.run('document.getElementById("detail-timeline").textContent'))

        page.run('document.getElementById("id-input").value = "12x", true')
        click(page, "#id-form button")
        assert "positive whole number" in str(
            until(page, 'document.getElementById("jobs-message").textContent')
        )


PROGRESS = """({
  hidden: document.getElementById("detail-progress").hidden,
  bar: document.getElementById("detail-progress-bar").value,
  percent: document.getElementById("detail-progress-percent").textContent,
  info: document.getElementById("detail-progress-info").textContent,
})"""


def test_a_running_jobs_progress_is_shown_and_follows_the_database(
    settings: Settings,
    stack: dict[str, int],
    queue: Queue,
    sql: psycopg.Connection[Any],
    page: DevTools,
) -> None:
    running = queue.get(stack["running"])
    token = running.lease_token
    assert token is not None

    def report(fraction: float, info: Any) -> tuple[Any, ...]:
        """Write a progress report as the worker does; return the row as stored."""
        queue.run(report_progress([Report(running.id, token, fraction, json.dumps(info))]))
        row = sql.execute(
            "SELECT progress_fraction, progress_info FROM pgqueue_jobs WHERE id = %s",
            (running.id,),
        ).fetchone()
        assert row is not None
        return tuple(row)

    def shown() -> dict[str, Any]:
        progress = page.run(PROGRESS)
        assert isinstance(progress, dict)
        return progress

    with LiveServer(create_app(settings)) as server:
        open_page(page, server, f"#job={stack['queued']}")
        until(page, f'document.getElementById("detail-id").textContent === "#{stack["queued"]}"')
        assert shown()["hidden"] is True  # never reported

        fraction, info = report(0.4, {"last": "b.csv"})
        page.run(f'document.getElementById("id-input").value = "{running.id}", true')
        click(page, "#id-form button")
        until(page, f'document.getElementById("detail-id").textContent === "#{running.id}"')
        until(page, 'document.getElementById("detail-progress-percent").textContent === "40%"')
        first = shown()
        assert first["hidden"] is False and first["bar"] == fraction
        assert json.loads(first["info"]) == info

        # Reported behind the page's back: the open panel follows by itself.
        fraction, info = report(0.85, {"last": "e.csv"})
        until(page, 'document.getElementById("detail-progress-percent").textContent === "85%"')
        later = shown()
        assert later["bar"] == fraction and json.loads(later["info"]) == info


def test_every_attempts_error_is_listed_when_the_api_gives_them(
    settings: Settings, stack: dict[str, int], sql: psycopg.Connection[Any], page: DevTools
) -> None:
    with LiveServer(create_app(settings)) as server:
        open_page(page, server, f"#job={stack['retrying']}")
        until(page, 'document.getElementById("detail-error").textContent === "out of memory"')
        until(page, '!document.getElementById("detail-attempts").hidden')
        listed = page.run('document.getElementById("detail-attempts").textContent')
    [(errors,)] = sql.execute(
        "SELECT errors FROM pgqueue_jobs WHERE id = %s", (stack["retrying"],)
    ).fetchall()
    assert len(errors) == 1 and errors[0]["error"] == "out of memory"
    assert "out of memory" in str(listed)


# -- dead letters ---------------------------------------------------------------------------------


def test_dead_letters_are_grouped_and_each_group_is_retried_or_deleted_after_a_confirmation(
    settings: Settings, stack: dict[str, int], sql: psycopg.Connection[Any], page: DevTools,
    shots: Path,
) -> None:  # fmt: skip
    def dead_groups() -> dict[tuple[str, str], int]:
        found = sql.execute(
            "SELECT task, pgqueue_error_kind(last_error), count(*) FROM pgqueue_jobs "
            "WHERE state = 'dead' GROUP BY 1, 2"
        ).fetchall()
        return {(task, error): n for task, error, n in found}

    def shown() -> dict[tuple[str, str], int]:
        return {(r["cells"][0], r["cells"][1]): int(r["cols"]["jobs"])
                for r in rows(page, "dead-body", "group").values()}  # fmt: skip

    with LiveServer(create_app(settings)) as server:
        open_page(page, server, "#view=dead")
        until(page, 'document.querySelector("#dead-body tr[data-group]")')
        assert shown() == dead_groups()
        assert len(dead_groups()) == 3
        page.screenshot(shots / "dead-letters.png")

        declined = '#dead-body tr[data-group="0"] button'  # the biggest group: 2 jobs
        assert rows(page, "dead-body", "group")["0"]["cells"][1] == "card declined"
        click(page, declined + ":nth-of-type(2)")  # Retry all
        assert answer(page, accept=False) == (
            "Retry 2 dead charge jobs whose error is of the kind \u201ccard declined\u201d?"
        )
        assert dead_groups()[("charge", "card declined")] == 2

        click(page, declined + ":nth-of-type(2)")
        answer(page, accept=True)
        until(page, '/Retried 2 jobs/.test(document.getElementById("dead-message").textContent)')
        assert ("charge", "card declined") not in dead_groups()
        assert scalar(sql, "SELECT count(*) FROM pgqueue_jobs WHERE state = 'queued' "
                      "AND last_error LIKE 'card declined%%'") == 2  # fmt: skip
        until(page, 'document.querySelectorAll("#dead-body tr[data-group]").length === 2')
        assert shown() == dead_groups()

        smtp = next(k for k, r in rows(page, "dead-body", "group").items()
                    if r["cells"][1] == "smtp refused")  # fmt: skip
        click(page, f'#dead-body tr[data-group="{smtp}"] button:nth-of-type(3)')  # Delete all
        assert answer(page, accept=True).startswith("Delete 1 dead send_email jobs")
        until(page, '/Deleted 1 jobs/.test(document.getElementById("dead-message").textContent)')
        assert ("send_email", "smtp refused") not in dead_groups()
        assert not scalar(
            sql, "SELECT count(*) FROM pgqueue_jobs WHERE last_error = 'smtp refused'"
        )

        # Show: the group's jobs in the jobs view.
        until(page, 'document.querySelectorAll("#dead-body tr[data-group]").length === 1')
        page.run('document.getElementById("jobs-body").replaceChildren(), true')
        click(page, '#dead-body tr[data-group="0"] button:nth-of-type(1)')
        until(page, '!document.getElementById("jobs-section").hidden')
        until(page, shows_only("dead"))
        listed = {int(i) for i in rows(page, "jobs-body", "job-id")}
        expected = sql.execute("SELECT id FROM pgqueue_jobs WHERE state = 'dead'").fetchall()
        assert listed == {i for (i,) in expected}


# -- workers --------------------------------------------------------------------------------------


def test_workers_view_shows_the_registry_with_stale_and_stalled_highlighted(
    settings: Settings, stack: dict[str, int], sql: psycopg.Connection[Any], page: DevTools,
    shots: Path,
) -> None:  # fmt: skip
    with LiveServer(create_app(settings)) as server:
        open_page(page, server, "#view=workers")
        until(page, 'document.querySelector("#workers-body tr[data-worker]")')
        workers = rows(page, "workers-body", "worker")
        classes = page.run(
            'Object.fromEntries([...document.querySelectorAll("#workers-body tr")]'
            ".map((tr) => [tr.dataset.worker, tr.className]))"
        )
        note = page.run('document.getElementById("workers-note").textContent')
        page.screenshot(shots / "workers.png")

    names = [n for (n,) in sql.execute("SELECT name FROM pgqueue_workers ORDER BY name")]
    assert list(workers) == names
    assert {n: w["status"] for n, w in workers.items()} == {
        "w-gone": "stale",
        "w-ok": "alive",
        "w-stalled": "stalled",
    }
    assert classes == {"w-gone": "stale", "w-ok": "", "w-stalled": "stalled"}
    assert workers["w-ok"]["cells"][4] == "emails, reports"
    assert note == "1 stale, 1 stalled"


# -- auth and small screens -----------------------------------------------------------------------

# The buttons that change something (Show only lists a group's jobs).
ACTION_BUTTONS = """[...document.querySelectorAll("#queues-body button, #dead-body button"),
  ...(document.getElementById("detail-actions").hidden ? []
      : document.querySelectorAll("#detail-actions button"))]
  .map((b) => b.textContent).filter((text) => text !== "Show")"""


@pytest.mark.parametrize(("token", "sees"), [(READER, False), (ADMIN, True)])
def test_a_read_token_sees_no_action_button_and_an_admin_token_does(
    settings: Settings, stack: dict[str, int], page: DevTools, token: str, sees: bool
) -> None:
    app = create_app(settings.replace(api_tokens=(ADMIN,), api_read_tokens=(READER,)))
    with LiveServer(app) as server:
        page.goto(f"{server.url}/dashboard#token={token}&job={stack['dead']}")
        until(page, 'document.querySelector("#queues-body tr[data-queue]") && '
                    'document.getElementById("detail-id").textContent')  # fmt: skip
        show(page, "dead")
        until(page, 'document.querySelector("#dead-body tr[data-group]")')
        # A refresh has come back since the tab changed: the rows are drawn.
        page.run('document.getElementById("status").textContent = ""; true')
        until(page, 'document.getElementById("status").textContent.startsWith("Updated")')
        buttons = page.run(ACTION_BUTTONS)
        badge = page.run('!document.getElementById("access-badge").hidden')
        bulk = page.run('getComputedStyle(document.getElementById("jobs-bulk")).display !== "none"')
    assert bulk is sees
    if sees:
        assert {"Pause", "Resume", "Retry all", "Delete all", "Cancel", "Retry"} <= set(buttons)  # type: ignore[arg-type]
        assert badge is False
    else:
        assert buttons == []
        assert badge is True


def test_a_token_link_opened_in_a_tab_already_showing_the_page_is_taken(
    settings: Settings, stack: dict[str, int], page: DevTools
) -> None:
    app = create_app(settings.replace(api_tokens=(ADMIN,), api_read_tokens=(READER,)))
    with LiveServer(app) as server:
        page.goto(f"{server.url}/dashboard")
        until(page, '!document.getElementById("token-prompt").hidden')
        page.run(f'location.hash = "#token={ADMIN}&view=dead"; true')
        until(page, 'document.querySelector("#dead-body tr[data-group]")')
        assert page.run('document.getElementById("token-prompt").hidden') is True
        assert page.run('sessionStorage.getItem("pgqueue.dashboard.token")') == ADMIN
        assert ADMIN not in str(page.run("location.href"))
        page.run(f'location.hash = "#job={stack["dead"]}"; true')
        until(page, f'document.getElementById("detail-id").textContent === "#{stack["dead"]}"')
        assert page.run('!document.querySelector("[data-in=jobs]").hidden') is True


BACKGROUND = "getComputedStyle(document.body).backgroundColor"


def test_dark_follows_the_system_until_the_switch_says_otherwise(
    settings: Settings, stack: dict[str, int], page: DevTools, shots: Path
) -> None:
    page.color_scheme("dark")
    try:
        with LiveServer(create_app(settings)) as server:
            open_page(page, server)
            page.run('localStorage.removeItem("pgqueue.dashboard.theme"); true')
            open_page(page, server)
            assert page.run("document.documentElement.dataset.theme") == "dark"
            assert page.run(BACKGROUND) == "rgb(20, 23, 29)"
            assert page.run('document.getElementById("theme").textContent') == "Light"
            page.screenshot(shots / "overview-dark.png")
            click(page, "#theme")
            assert page.run("document.documentElement.dataset.theme") == "light"
            assert page.run(BACKGROUND) == "rgb(246, 247, 249)"
            open_page(page, server)  # the choice is kept in this browser
            assert page.run("document.documentElement.dataset.theme") == "light"
    finally:
        page.run('localStorage.removeItem("pgqueue.dashboard.theme"); true')
        page.color_scheme("")


def test_on_a_phone_a_tapped_jobs_detail_comes_into_view(
    settings: Settings, stack: dict[str, int], page: DevTools
) -> None:
    page.viewport(PHONE, 800, mobile=True)
    with LiveServer(create_app(settings)) as server:
        open_page(page, server, "#view=jobs")
        until(page, 'document.querySelector("#jobs-body tr[data-job-id]")')
        assert page.run('document.getElementById("detail").getBoundingClientRect().top') > 800
        click(page, f'#jobs-body tr[data-job-id="{stack["dead"]}"] td:nth-child(3)')
        until(page, f'document.getElementById("detail-id").textContent === "#{stack["dead"]}"')
        top = until(
            page,
            '(() => { const t = document.getElementById("detail")'
            ".getBoundingClientRect().top; return t >= 0 && t < 100 && t + 1; })()",
        )
        assert 1 <= top <= 100


def test_every_view_fits_a_400_px_phone_screen(
    settings: Settings, stack: dict[str, int], page: DevTools, shots: Path
) -> None:
    page.viewport(PHONE, 800, mobile=True)
    with LiveServer(create_app(settings)) as server:
        open_page(page, server, f"#job={stack['dead']}")
        for view in VIEWS:
            show(page, view)
            until(page, 'document.getElementById("status").textContent.startsWith("Updated")')
            widths = page.run("[document.documentElement.scrollWidth, "
                              "document.documentElement.clientWidth, innerWidth]")  # fmt: skip
            assert widths[0] <= widths[1] == PHONE, (view, widths)  # type: ignore[index]
            page.screenshot(shots / f"{view}-phone.png")
