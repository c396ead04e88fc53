"""The dashboard's Workflows view in a real headless Chromium, against a
real uvicorn and a real database holding workflows made by the library.

What the page shows (each workflow's counts, each step's state, layer,
result and error, the edges) is checked against SQL; cancel and retry are
confirmed or dismissed in the page's dialog, then checked in the database.
A job's detail links its workflow, its parents and its dependents. The view
fits a 1440x900 screen and a 390x844 phone (the graph scrolls sideways).
Screenshots go to a directory under pytest's tmp path (the artifacts).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pgqueue import Queue, Settings, chain, group
from pgqueue.api import create_app
from pgqueue.core.dependencies import WorkflowJobs
from tests.acceptance.test_dashboard_views import answer, click, open_page, rows, until
from tests.browser import DevTools
from tests.support import LiveServer

LAPTOP = (1440, 900)
PHONE = (390, 844)


@pytest.fixture(scope="module")
def chromium(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevTools]:
    with DevTools("about:blank", tmp_path_factory.mktemp("chromium-workflows")) as page:
        yield page


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("workflow-screenshots")


@pytest.fixture
def page(chromium: DevTools) -> DevTools:
    chromium.viewport(*LAPTOP)
    return chromium


def run_all(queue: Queue, fail: tuple[str, ...] = ()) -> None:
    """Run every claimable job once: tasks in ``fail`` die, the rest succeed."""
    while claimed := queue.claim(10):
        for job in claimed:
            if job.task in fail:
                queue.fail(job, f"{job.task} broke\nTraceback: line 1")
            else:
                queue.ack(job, {"done": job.task})


@pytest.fixture
def made(queue: Queue) -> dict[str, WorkflowJobs]:
    """Oldest first: one that succeeded, one whose first step died (the
    rest cancelled), one still running (a fan-out then a fan-in)."""
    ok = queue.enqueue_workflow(chain({"task": "fetch"}, {"task": "store"}))
    run_all(queue)
    dead = queue.enqueue_workflow(
        chain({"task": "parse", "max_attempts": 1}, group({"task": "x"}, {"task": "y"}))
    )
    run_all(queue, ("parse",))
    live = queue.enqueue_workflow(
        chain(
            {"task": "first", "metadata": {"team": "data"}},
            group({"task": "left"}, {"task": "right"}),
            {"task": "last"},
        )
    )
    [first] = queue.claim(1)
    assert first.id == live.jobs[0].id
    return {"ok": ok, "dead": dead, "live": live}


def counts_of(sql: psycopg.Connection[Any]) -> dict[str, dict[str, int]]:
    found = sql.execute(
        "SELECT workflow_id::text, state, count(*) FROM pgqueue_jobs "
        "WHERE workflow_id IS NOT NULL GROUP BY 1, 2"
    ).fetchall()
    counts: dict[str, dict[str, int]] = {}
    for workflow, state, n in found:
        counts.setdefault(workflow, {})[state] = n
    return counts


def states_of(sql: psycopg.Connection[Any], workflow: WorkflowJobs) -> dict[str, str]:
    found = sql.execute(
        "SELECT id, state FROM pgqueue_jobs WHERE workflow_id = %s", (workflow.id,)
    ).fetchall()
    return {str(i): state for i, state in found}


GRAPH = """(() => {
  const boxes = [...document.querySelectorAll("#workflow-graph .step")];
  return {
    states: Object.fromEntries(boxes.map((b) => [b.dataset.stepId, b.dataset.state])),
    layers: Object.fromEntries(boxes.map((b) => [b.dataset.stepId,
                                                 Number(b.parentElement.dataset.layer)])),
    edges: [...document.querySelectorAll("#workflow-graph path.edge")]
      .map((p) => [Number(p.dataset.parent), Number(p.dataset.child),
                   p.getTotalLength() > 10]),
  };
})()"""


LISTED = 'document.querySelectorAll("#workflows-body tr[data-workflow-id]").length'


def shown_counts(page: DevTools) -> dict[str, dict[str, int]]:
    return {
        workflow: {
            state: int(n) for state, n in row["cols"].items() if state != "jobs" and n != "0"
        }
        for workflow, row in rows(page, "workflows-body", "workflow-id").items()
    }


def open_workflow(page: DevTools, workflow: WorkflowJobs) -> None:
    click(page, f'#workflows-body tr[data-workflow-id="{workflow.id}"] td:nth-child(2)')
    until(page, f'document.getElementById("workflow-id").textContent === "{workflow.id}"')
    until(page, 'document.querySelector("#workflow-graph path.edge")')


def test_the_list_and_a_workflows_graph_are_the_databases(
    settings: Settings, made: dict[str, WorkflowJobs], sql: psycopg.Connection[Any],
    page: DevTools, shots: Path,
) -> None:  # fmt: skip
    with LiveServer(create_app(settings)) as server:
        open_page(page, server, "#view=workflows")
        until(page, f"{LISTED} === 3")
        assert list(rows(page, "workflows-body", "workflow-id")) == [
            str(made[k].id) for k in ("live", "dead", "ok")
        ]
        assert shown_counts(page) == counts_of(sql)

        dead = made["dead"]
        open_workflow(page, dead)
        graph = page.run(GRAPH)
        parse, x, y = (str(job.id) for job in dead.jobs)
        assert graph["states"] == states_of(sql, dead)  # type: ignore[index]
        assert graph["states"][parse] == "dead"  # type: ignore[index]
        assert graph["layers"] == {parse: 0, x: 1, y: 1}  # type: ignore[index]
        edges = sql.execute(
            "SELECT parent, child, true FROM pgqueue_job_deps WHERE child = ANY(%s) ORDER BY child",
            ([job.id for job in dead.jobs],),
        ).fetchall()
        assert sorted(map(tuple, graph["edges"])) == sorted(edges)  # type: ignore[index]
        steps = rows(page, "workflow-steps-body", "step-id")
        [(last_error,)] = sql.execute(
            "SELECT last_error FROM pgqueue_jobs WHERE id = %s", (dead.jobs[0].id,)
        ).fetchall()
        assert steps[parse]["cols"]["error"].startswith(last_error.split("\n")[0])
        assert {i: s["cols"]["state"] for i, s in steps.items()} == states_of(sql, dead)
        page.screenshot(shots / "workflow-dead-laptop.png")

        ok = made["ok"]
        open_workflow(page, ok)
        steps = rows(page, "workflow-steps-body", "step-id")
        results = dict(sql.execute(
            "SELECT id::text, result FROM pgqueue_jobs WHERE workflow_id = %s", (ok.id,)
        ).fetchall())  # fmt: skip
        assert {i: json.loads(s["cols"]["result"]) for i, s in steps.items()} == results
        assert page.run('document.getElementById("workflow-cancel").disabled') is True
        assert page.run('document.getElementById("workflow-retry").disabled') is True

        # A filter lists what SQL finds.
        page.run(
            '(() => { const s = document.getElementById("workflow-state-filter"); '
            's.value = "dead"; s.dispatchEvent(new Event("change")); return true; })()'
        )
        until(page, f"{LISTED} === 1")
        assert list(rows(page, "workflows-body", "workflow-id")) == [str(dead.id)]


def test_cancel_and_retry_ask_first_then_change_the_rows(
    settings: Settings, made: dict[str, WorkflowJobs], queue: Queue,
    sql: psycopg.Connection[Any], page: DevTools, shots: Path,
) -> None:  # fmt: skip
    live, dead = made["live"], made["dead"]
    message = 'document.getElementById("workflow-message").textContent'
    with LiveServer(create_app(settings)) as server:
        open_page(page, server, f"#workflow={live.id}")
        until(page, f'document.getElementById("workflow-id").textContent === "{live.id}"')
        until(page, 'document.querySelector("#workflow-graph path.edge")')
        graph = page.run(GRAPH)
        assert graph["states"] == states_of(sql, live)  # type: ignore[index]
        first, left, right, last = (str(job.id) for job in live.jobs)
        assert graph["layers"] == {first: 0, left: 1, right: 1, last: 2}  # type: ignore[index]
        page.screenshot(shots / "workflow-live-laptop.png")

        # Its first step ends behind the page's back: the open graph follows by itself.
        assert queue.ack(queue.get(live.jobs[0].id), {"rows": 3}) is not None
        until(page, f'document.querySelector(\'.step[data-step-id="{left}"]\')'
                    '.dataset.state === "queued"')  # fmt: skip
        assert page.run(GRAPH)["states"] == states_of(sql, live)  # type: ignore[index]

        click(page, "#workflow-cancel")
        assert answer(page, accept=False).startswith(f"Cancel workflow {live.id}? Its 3 jobs")
        assert sorted(states_of(sql, live).values()) == ["queued", "queued", "succeeded", "waiting"]
        click(page, "#workflow-cancel")
        answer(page, accept=True)
        until(page, f"{message} === 'Cancelled.'")
        assert sorted(states_of(sql, live).values()) == ["cancelled"] * 3 + ["succeeded"]
        until(page, f'document.querySelector(\'.step[data-step-id="{last}"]\')'
                    '.dataset.state === "cancelled"')  # fmt: skip
        assert page.run(GRAPH)["states"] == states_of(sql, live)  # type: ignore[index]

        open_workflow(page, dead)
        click(page, "#workflow-retry")
        assert "Its 3 dead and cancelled jobs" in answer(page, accept=False)
        assert sorted(states_of(sql, dead).values()) == ["cancelled", "cancelled", "dead"]
        click(page, "#workflow-retry")
        answer(page, accept=True)
        until(page, f"{message} === 'Queued again.'")
        assert sorted(states_of(sql, dead).values()) == ["queued", "waiting", "waiting"]
        until(page, f'document.querySelector(\'#workflows-body tr[data-workflow-id="{dead.id}"] '
                    'td[data-col="queued"]\').textContent === "1"')  # fmt: skip
        assert page.run(GRAPH)["states"] == states_of(sql, dead)  # type: ignore[index]


LINKS = """Object.fromEntries([...document.querySelectorAll("#detail-links dd")]
  .map((dd) => [dd.dataset.field, dd.textContent]))"""


def test_a_jobs_detail_links_its_workflow_parents_and_dependents(
    settings: Settings, made: dict[str, WorkflowJobs], page: DevTools
) -> None:
    live = made["live"]
    first, left, right, last = live.jobs
    with LiveServer(create_app(settings)) as server:
        open_page(page, server, f"#job={left.id}")
        until(page, f'document.getElementById("detail-id").textContent === "#{left.id}"')
        until(page, f"({LINKS}).dependents === '{last.id}'")
        assert page.run(LINKS) == {
            "workflow": str(live.id), "depends on": str(first.id), "dependents": str(last.id)
        }  # fmt: skip
        click(page, f'#detail-links a[data-job="{first.id}"]')
        until(page, f'document.getElementById("detail-id").textContent === "#{first.id}"')
        until(page, f"({LINKS}).dependents === '{left.id}, {right.id}'")
        metadata = json.loads(
            str(page.run('document.getElementById("detail-metadata").textContent'))
        )
        assert metadata["team"] == "data"

        click(page, "#detail-links a[data-workflow]")
        until(page, f'document.getElementById("workflow-id").textContent === "{live.id}"')
        assert page.run('!document.getElementById("workflow-detail").hidden') is True
        # A step's box opens its job.
        click(page, f'#workflow-graph .step[data-step-id="{last.id}"]')
        until(page, f'document.getElementById("detail-id").textContent === "#{last.id}"')


FIT = """[document.documentElement.scrollWidth, document.documentElement.clientWidth,
  document.getElementById("workflow-graph-scroll").scrollWidth,
  document.getElementById("workflow-graph-scroll").clientWidth]"""


@pytest.mark.parametrize("screen", [LAPTOP, PHONE], ids=["1440x900", "390x844"])
def test_the_view_fits_the_screen_and_a_long_graph_scrolls_sideways(
    settings: Settings, queue: Queue, page: DevTools, shots: Path, screen: tuple[int, int]
) -> None:
    steps = [{"task": f"step-{n}"} for n in range(12)]
    long = queue.enqueue_workflow(chain(*steps))
    page.viewport(*screen, mobile=screen == PHONE)
    with LiveServer(create_app(settings)) as server:
        open_page(page, server, f"#workflow={long.id}")
        until(page, f'document.getElementById("workflow-id").textContent === "{long.id}"')
        until(page, 'document.querySelectorAll("#workflow-graph path.edge").length === 11')
        page_width, client, graph_width, graph_client = page.run(FIT)  # type: ignore[misc]
        page.screenshot(shots / f"workflow-{screen[0]}x{screen[1]}.png")
    # No sideways scroll of the page (a laptop's vertical scrollbar takes 15 px).
    assert page_width <= client <= screen[0]
    # Twelve layers side by side: wider than either screen, scrolled inside its box.
    assert graph_width > graph_client


ACTIONS_SHOWN = 'getComputedStyle(document.getElementById("workflow-actions")).display !== "none"'


@pytest.mark.parametrize(("token", "sees"), [("wf-read", False), ("wf-admin", True)])
def test_only_an_admin_token_sees_cancel_and_retry(
    settings: Settings, made: dict[str, WorkflowJobs], page: DevTools, token: str, sees: bool
) -> None:
    app = create_app(settings.replace(api_tokens=("wf-admin",), api_read_tokens=("wf-read",)))
    with LiveServer(app) as server:
        page.goto(f"{server.url}/dashboard#token={token}&workflow={made['dead'].id}")
        until(page, f'document.getElementById("workflow-id").textContent === "{made["dead"].id}"')
        until(page, 'document.getElementById("status").textContent.startsWith("Updated")')
        assert page.run(ACTIONS_SHOWN) is sees
