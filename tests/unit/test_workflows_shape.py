"""The I/O-free parts of workflows: what chain and group compose, the order
a graph is planned in, the cycles it refuses, the first state of each new
job, and the parents' results a claimed job gets."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from pgqueue import InvalidJob, Job, JobSpec, JobState, Settings, chain, group
from pgqueue.core.dependencies import Graph, plan
from pgqueue.core.transitions import claim
from pgqueue.core.workflows import by_name, graph_of, specs_maker
from pgqueue.db import driver
from tests.unit.memory import MemoryDatabase

make = specs_maker(5)


def spec(task: str, **fields: Any) -> JobSpec:
    return JobSpec.build(task, **fields)


def test_chain_and_group_compose_fan_out_and_fan_in() -> None:
    graph = graph_of(
        chain(spec("a"), group(chain(spec("b"), spec("c")), spec("d")), spec("e")), make
    )
    assert [s.task for s in graph.specs] == ["a", "b", "c", "d", "e"]
    assert graph.after == ((), (0,), (1,), (0,), (2, 3))


def test_a_group_alone_has_no_edges() -> None:
    assert graph_of(group({"task": "a"}, {"task": "b"}), make).after == ((), ())


def test_the_order_puts_parents_first_and_keeps_the_given_order_otherwise() -> None:
    graph = by_name(
        [
            {"name": "z", "task": "t", "depends_on": ["x", "y"]},
            {"name": "x", "task": "t"},
            {"name": "y", "task": "t", "depends_on": ["x"]},
        ],
        make,
    )
    assert graph.order() == [1, 2, 0]


@pytest.mark.parametrize(
    ("after", "cycle"),
    [
        (((1,), (0,)), "jobs[0] -> jobs[1] -> jobs[0]"),
        (((), (2,), (1,), (2,)), "jobs[1] -> jobs[2] -> jobs[1]"),
        (((0,),), "jobs[0] -> jobs[0]"),
    ],
)
def test_a_cycle_is_refused_and_named(after: tuple[tuple[int, ...], ...], cycle: str) -> None:
    graph = Graph(tuple(spec("t") for _ in after), after)
    with pytest.raises(InvalidJob, match="cycle") as caught:
        graph.order()
    assert cycle in caught.value.problem


def test_plan_applies_each_policy_to_parents_that_already_ended() -> None:
    graph = Graph(
        (
            spec("a", depends_on=[1, 2]),  # one dead: cancelled
            spec("b", depends_on=[1, 2], on_dependency_failure="run"),  # dead counts done
            spec("c", depends_on=[3]),  # waits for a running job
            spec("d"),  # waits for a (cancelled) and c
            spec("e", on_dependency_failure="run"),  # a cancelled counts done; waits for c
        ),
        ((), (), (), (0, 2), (0, 2)),
    )
    known = {1: "succeeded", 2: "dead", 3: "running"}
    assert plan(graph, graph.order(), known) == [
        ("cancelled", 0),
        ("queued", 0),
        ("waiting", 1),
        ("cancelled", 0),
        ("waiting", 1),
    ]


def test_a_workflow_job_has_no_key_and_names_are_checked() -> None:
    with pytest.raises(InvalidJob) as caught:
        graph_of(chain({"task": "a"}, {"task": "b", "idempotency_key": "k"}), make)
    assert caught.value.field == "jobs[1].idempotency_key"
    with pytest.raises(InvalidJob) as caught:
        by_name([{"name": "a", "task": "t", "depends_on": "b"}], make)
    assert caught.value.field == "jobs[0].depends_on"


def test_a_claimed_job_gets_its_parents_results_in_order_from_the_claim() -> None:
    db = MemoryDatabase()
    done = db.add(result=7)
    db.jobs[done]["state"] = "succeeded"
    failed = db.add()
    db.jobs[failed]["state"] = "dead"
    plain = db.add()
    child = db.add(depends_on=[done, failed, 99])
    jobs = driver.drive(claim(Settings(), limit=10, worker="w"), db)
    assert {job.id: job.parents for job in jobs} == {plain: (), child: (7, None, None)}


def test_claim_rows_give_their_parents_column_to_the_jobs() -> None:
    db = MemoryDatabase()
    row = db.jobs[db.add(depends_on=[1, 2])]
    names = [*row, "parents"]
    values = tuple(row.values())
    with_parents, without = Job.from_tuples(names, [(*values, [{"a": 1}, None]), (*values, None)])
    assert with_parents.parents == ({"a": 1}, None) and without.parents == ()


def test_a_job_read_from_a_claim_row_is_a_plain_frozen_job_equal_to_one_from_a_mapping() -> None:
    db = MemoryDatabase()
    row = db.jobs[db.add(payload={"n": 1})]
    row["errors"] = [
        {"attempt": 1, "error": "boom", "worker": "w", "at": "2026-12-01T00:00:00+00:00"}
    ]
    (job,) = Job.from_tuples([*row, "parents"], [(*row.values(), None)])
    assert type(job) is Job and job == Job.from_row(row)
    assert job.state is JobState.QUEUED and job.errors[0].error == "boom"
    with pytest.raises(dataclasses.FrozenInstanceError):
        job.payload = {}  # type: ignore[misc]
