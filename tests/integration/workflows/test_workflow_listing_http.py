"""GET /workflows (a real client, a real database): every workflow newest
first with its jobs counted by state, as SQL counts them; each state filter
keeps what SQL keeps; pages follow the cursor; bad input is a 422 naming the
parameter; the listing walks its index. GET /workflows/{id} gives a graph
what it needs: each step's state, result and errors, and the edges."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import psycopg
import pytest

from pgqueue import Queue, Settings, chain, group
from pgqueue.core.dependencies import WorkflowJobs
from pgqueue.sql import QUERIES
from tests.support import api_client


@pytest.fixture
async def api(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    async with api_client(settings) as client:
        yield client


def finish(queue: Queue, fail: set[str] = frozenset()) -> None:  # type: ignore[assignment]
    """Run every claimable job once: tasks in ``fail`` die, the rest succeed."""
    while claimed := queue.claim(10):
        for job in claimed:
            if job.task in fail:
                queue.fail(job, f"{job.task} broke\nTraceback: ...")
            else:
                queue.ack(job, {"done": job.task})


def kinds(queue: Queue) -> dict[str, WorkflowJobs]:
    """Four workflows, oldest first: succeeded, dead (its last step
    cancelled), cancelled by an operator, and one still running."""
    ok = queue.enqueue_workflow(chain({"task": "fetch"}, {"task": "store"}))
    finish(queue)
    dead = queue.enqueue_workflow(
        chain({"task": "parse", "max_attempts": 1}, group({"task": "x"}, {"task": "y"}))
    )
    finish(queue, {"parse"})
    stopped = queue.enqueue_workflow(group({"task": "g1"}, {"task": "g2"}))
    queue.workflow(stopped.id, "cancel")
    live = queue.enqueue_workflow(chain({"task": "first"}, {"task": "second"}))
    return {"succeeded": ok, "dead": dead, "cancelled": stopped, "running": live}


SQL_FILTERS = {
    None: "true",
    "running": "bool_or(state IN ('waiting', 'queued', 'running'))",
    "finished": "NOT bool_or(state IN ('waiting', 'queued', 'running'))",
    "succeeded": "bool_and(state = 'succeeded')",
    "dead": "bool_or(state = 'dead')",
    "cancelled": "bool_or(state = 'cancelled')",
}


def expected(sql: psycopg.Connection[Any], having: str) -> list[tuple[str, dict[str, int]]]:
    rows = sql.execute(
        "SELECT workflow_id::text, jsonb_object_agg(state, n) FROM ("
        " SELECT workflow_id, state, count(*) AS n, min(id) AS first FROM pgqueue_jobs"
        " WHERE workflow_id IN (SELECT workflow_id FROM pgqueue_jobs"
        f"  WHERE workflow_id IS NOT NULL GROUP BY 1 HAVING {having})"
        " GROUP BY 1, 2) s GROUP BY 1 ORDER BY min(first) DESC"
    ).fetchall()
    return [(wid, counts) for wid, counts in rows]


async def test_every_filter_lists_the_workflows_and_counts_sql_finds(
    api: httpx.AsyncClient, queue: Queue, sql: psycopg.Connection[Any]
) -> None:
    made = kinds(queue)
    for state, having in SQL_FILTERS.items():
        got = await api.get("/workflows", params={"state": state} if state else {})
        assert got.status_code == 200, got.text
        listed = got.json()["workflows"]
        want = expected(sql, having)
        assert [w["workflow_id"] for w in listed] == [wid for wid, _ in want], state
        for workflow, (_, counts) in zip(listed, want, strict=True):
            assert {k: n for k, n in workflow["counts"].items() if n} == counts
            assert workflow["jobs"] == sum(counts.values())
    everything = (await api.get("/workflows")).json()["workflows"]
    assert [w["workflow_id"] for w in everything] == [
        str(made[k].id) for k in ("running", "cancelled", "dead", "succeeded")
    ]
    dead = everything[2]
    assert dead["counts"] == {
        "waiting": 0, "queued": 0, "running": 0, "succeeded": 0, "dead": 1, "cancelled": 2
    }  # fmt: skip
    assert dead["finished"] is True and dead["first_task"] == "parse"
    assert everything[0]["finished"] is False and everything[0]["last_finished_at"] is None


async def test_pages_follow_the_cursor_newest_first(api: httpx.AsyncClient, queue: Queue) -> None:
    made = [queue.enqueue_workflow({"task": f"t{n}"}).id for n in range(5)]
    seen: list[str] = []
    cursor: int | None = None
    for _ in range(3):
        params: dict[str, Any] = {"limit": 2} | ({"cursor": cursor} if cursor else {})
        page = (await api.get("/workflows", params=params)).json()
        seen += [w["workflow_id"] for w in page["workflows"]]
        cursor = page["next_cursor"]
    assert seen == [str(w) for w in reversed(made)]
    assert cursor is None


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"state": "waiting"}, "state"),
        ({"state": ""}, "state"),
        ({"limit": 0}, "limit"),
        ({"limit": 201}, "limit"),
        ({"cursor": "x"}, "cursor"),
        ({"cursor": 0}, "cursor"),
    ],
)
async def test_a_bad_filter_is_a_422_naming_it(
    api: httpx.AsyncClient, params: dict[str, Any], field: str
) -> None:
    got = await api.get("/workflows", params=params)
    assert got.status_code == 422, got.text
    assert got.json()["field"] == field


async def test_an_unknown_workflow_is_a_404(api: httpx.AsyncClient) -> None:
    for bad in ("nope", "6f1c1f1e-0000-4000-8000-000000000000"):
        got = await api.get(f"/workflows/{bad}")
        assert got.status_code == 404, got.text
        acted = await api.post(
            f"/workflows/{bad}/retry", headers={"Content-Type": "application/json"}
        )
        assert acted.status_code == 404, acted.text


async def test_a_workflow_gives_each_steps_state_result_and_errors_and_the_edges(
    api: httpx.AsyncClient, queue: Queue
) -> None:
    made = kinds(queue)["dead"]
    parse, x, y = made.jobs
    body = (await api.get(f"/workflows/{made.id}")).json()
    steps = {job["id"]: job for job in body["jobs"]}
    assert steps[parse.id]["state"] == "dead"
    assert steps[parse.id]["last_error"].startswith("parse broke")
    assert [e["error"] for e in steps[parse.id]["errors"]] == [steps[parse.id]["last_error"]]
    assert steps[x.id]["state"] == "cancelled" and steps[x.id]["depends_on"] == [parse.id]
    assert body["edges"] == [
        {"parent": parse.id, "child": x.id},
        {"parent": parse.id, "child": y.id},
    ]
    ok = kinds(queue)["succeeded"]
    shown = (await api.get(f"/workflows/{ok.id}")).json()
    assert [job["result"] for job in shown["jobs"]] == [{"done": "fetch"}, {"done": "store"}]


def test_the_listing_walks_its_index_and_reads_only_the_listed_workflows_jobs(
    queue: Queue, sql: psycopg.Connection[Any]
) -> None:
    for n in range(20):
        queue.enqueue_workflow(chain({"task": f"a{n}"}, {"task": f"b{n}"}))
    # Many more workflows than a page, and many jobs that belong to none.
    sql.execute(
        "INSERT INTO pgqueue_workflows (id, first_job, last_job) "
        "SELECT gen_random_uuid(), -g, -g FROM generate_series(1, 5000) g"
    )
    queue.enqueue_many([{"task": "plain"}] * 2000)
    sql.execute("ANALYZE pgqueue_workflows")
    sql.execute("ANALYZE pgqueue_jobs")
    for state in (None, "running"):
        params = {"state": state, "before": None, "limit": 5}
        plan = "\n".join(
            row[0] for row in sql.execute("EXPLAIN " + QUERIES["workflow_list"], params)
        )
        assert "pgqueue_workflows_first_job" in plan, plan
        assert "Seq Scan" not in plan, plan
        assert "Sort" not in plan.replace("Sort Key", ""), plan


async def test_a_jobs_dependents_are_the_jobs_that_wait_for_it(
    api: httpx.AsyncClient, queue: Queue
) -> None:
    made = queue.enqueue_workflow(chain({"task": "a"}, group({"task": "b"}, {"task": "c"})))
    a, b, c = made.jobs
    plain = queue.enqueue("after", depends_on=[b.id])
    got = await api.get(f"/jobs/{a.id}/dependents")
    assert got.status_code == 200, got.text
    assert got.json() == {"job_id": a.id, "dependents": [b.id, c.id]}
    assert (await api.get(f"/jobs/{b.id}/dependents")).json()["dependents"] == [plain.id]
    assert (await api.get(f"/jobs/{plain.id}/dependents")).json()["dependents"] == []
    assert queue.dependents(a.id) == [b.id, c.id]
    missing = await api.get("/jobs/999999/dependents")
    assert missing.status_code == 404, missing.text
    bad = await api.get("/jobs/x/dependents")
    assert bad.status_code == 422 and bad.json()["field"] == "job_id", bad.text
