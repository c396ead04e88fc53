"""Jobs that wait for other jobs: the flows that insert a graph of jobs, and
show, cancel or retry a workflow. (A claimed job's parents' results come
with the claim: job_claim reads them.)

A graph is a list of new jobs, each with the ids of existing jobs it depends
on (``JobSpec.depends_on``) and the places of the graph's own jobs it waits
for (``after``). ``enqueue_graph`` inserts it in one transaction:

    job_unarchive      take archived parents back into the hot table
    job_lock_parents   lock the existing parents (so that none ends unseen
                       while the new edges are written) and read their states
    job_reserve_ids    the new jobs' ids, so that edges can name them
    job_insert_graph   the jobs, each waiting, queued, or cancelled at once
                       (``plan``: a parent already dead or cancelled applies
                       the policy now), its edges, and has_dependents on
                       its existing parents

From then on the statements that end a job release its dependents
(pgqueue_release, migrations/0011_workflows.sql and 0013_release_by_key.sql). No I/O here.
"""

from __future__ import annotations

import heapq
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .errors import InvalidJob, JobNotFound, WorkflowNotFound
from .flows import Flow, Statement
from .job_spec import JobSpec, spec_columns
from .jobs import Job, JobState

__all__ = [
    "Graph",
    "WorkflowJobs",
    "cancel_workflow",
    "dependents",
    "enqueue_graph",
    "get_workflow",
    "plan",
    "retry_workflow",
]

_FAILED = {JobState.DEAD.value, JobState.CANCELLED.value}
_UNFINISHED = {JobState.WAITING.value, JobState.QUEUED.value, JobState.RUNNING.value}


@dataclass(frozen=True, slots=True)
class Graph:
    """New jobs and their edges: ``after[i]`` are the places (in ``specs``)
    of the jobs job ``i`` waits for, besides ``specs[i].depends_on`` (ids
    of existing jobs). ``names`` name the jobs for error messages."""

    specs: tuple[JobSpec, ...]
    after: tuple[tuple[int, ...], ...]
    names: tuple[str, ...] = ()

    def name(self, place: int) -> str:
        return self.names[place] if self.names else f"jobs[{place}]"

    def order(self) -> list[int]:
        """The places in an order where every job comes after the jobs it
        waits for (otherwise in the order given); InvalidJob naming a cycle
        when there is none."""
        waiting = [len(set(parents)) for parents in self.after]
        children: list[list[int]] = [[] for _ in self.specs]
        for child, parents in enumerate(self.after):
            for parent in set(parents):
                children[parent].append(child)
        ready = [place for place, n in enumerate(waiting) if n == 0]
        ordered: list[int] = []
        while ready:
            place = heapq.heappop(ready)
            ordered.append(place)
            for child in children[place]:
                waiting[child] -= 1
                if waiting[child] == 0:
                    heapq.heappush(ready, child)
        if len(ordered) < len(self.specs):
            raise InvalidJob("depends_on", f"the jobs form a cycle: {self._cycle(set(ordered))}")
        return ordered

    def _cycle(self, done: set[int]) -> str:
        # Every job left waits for another job left: walk back until a place repeats.
        place = next(p for p in range(len(self.specs)) if p not in done)
        seen: list[int] = []
        while place not in seen:
            seen.append(place)
            place = next(p for p in self.after[place] if p not in done)
        loop = seen[seen.index(place) :]
        # Each job of `loop` waits for the next: name them in the order they would run.
        return " -> ".join(self.name(p) for p in [loop[0], *reversed(loop[1:]), loop[0]])


def plan(graph: Graph, order: Sequence[int], known: dict[int, str]) -> list[tuple[str, int]]:
    """Each new job's first state and how many parents it waits for, given
    the states of the existing parents (``known``): cancelled at once when a
    parent already failed and its policy is cancel; waiting for the parents
    that have not ended; queued when none is left."""
    first: list[tuple[str, int]] = [("queued", 0)] * len(graph.specs)
    for place in order:
        spec = graph.specs[place]
        failed = any(known[i] in _FAILED for i in spec.depends_on) or any(
            first[p][0] == "cancelled" for p in graph.after[place]
        )
        if failed and spec.on_dependency_failure == "cancel":
            first[place] = ("cancelled", 0)
            continue
        left = sum(known[i] in _UNFINISHED for i in spec.depends_on) + sum(
            first[p][0] != "cancelled" for p in set(graph.after[place])
        )
        first[place] = ("waiting" if left else "queued", left)
    return first


def enqueue_graph(graph: Graph, workflow_id: uuid.UUID | None = None) -> Flow[list[Job]]:
    """Insert the graph's jobs (one transaction: run it in one); return them
    in the graph's order. InvalidJob, nothing written, for a cycle or an
    unknown id."""
    order = graph.order()
    outside = sorted({i for spec in graph.specs for i in spec.depends_on})
    known: dict[int, str] = {}
    if outside:
        # Parents moved to the archive come back first (job_unarchive).
        yield Statement("job_unarchive", {"ids": outside})
        rows = yield Statement("job_lock_parents", {"ids": outside})
        known = {row["id"]: row["state"] for row in rows}
        for place, spec in enumerate(graph.specs):
            missing = [i for i in spec.depends_on if i not in known]
            if missing:
                named = len(graph.specs) > 1 or graph.names
                field = f"{graph.name(place)}.depends_on" if named else "depends_on"
                raise InvalidJob(field, f"no job with id {', '.join(map(str, missing))}")
    rows = yield Statement("job_reserve_ids", {"count": len(graph.specs)})
    ids: list[int] = rows[0]["ids"]
    first = plan(graph, order, known)
    jobs: list[Job] = yield Statement(
        "job_insert_graph", _graph_params(graph, ids, first, outside, workflow_id), jobs=True
    )
    by_id = {job.id: job for job in jobs}
    return [by_id[i] for i in ids]


def _graph_params(
    graph: Graph,
    ids: list[int],
    first: list[tuple[str, int]],
    outside: list[int],
    workflow_id: uuid.UUID | None,
) -> dict[str, Any]:
    parents: list[int] = []
    children: list[int] = []
    for place, spec in enumerate(graph.specs):
        for parent in [*spec.depends_on, *dict.fromkeys(ids[p] for p in graph.after[place])]:
            parents.append(parent)
            children.append(ids[place])
    has_dependents = {p for places in graph.after for p in places}
    specs = graph.specs
    return spec_columns(specs) | {
        "ids": ids,
        "state": [state for state, _ in first],
        "waiting_on": [
            left if s.depends_on or graph.after[p] else None
            for p, (s, (_, left)) in enumerate(zip(specs, first, strict=True))
        ],
        "policy": [s.on_dependency_failure for s in specs],
        "has_dependents": [p in has_dependents for p in range(len(specs))],
        "workflow_id": workflow_id,
        "parents": parents,
        "children": children,
        "outside": outside,
    }


@dataclass(frozen=True, slots=True)
class WorkflowJobs:
    """A workflow's jobs in id order; each job's ``depends_on`` are its edges."""

    id: uuid.UUID
    jobs: list[Job]

    def edges(self) -> list[tuple[int, int]]:
        """(parent, child) pairs, children in id order, parents as given."""
        return [(parent, job.id) for job in self.jobs for parent in job.depends_on or ()]

    def counts(self) -> dict[str, int]:
        """How many jobs are in each state (every state named)."""
        return {state.value: sum(job.state is state for job in self.jobs) for state in JobState}


def get_workflow(workflow_id: uuid.UUID) -> Flow[WorkflowJobs]:
    jobs: list[Job] = yield Statement("workflow_jobs", {"workflow_id": workflow_id}, jobs=True)
    if not jobs:
        raise WorkflowNotFound(workflow_id)
    return WorkflowJobs(workflow_id, jobs)


def cancel_workflow(workflow_id: uuid.UUID) -> Flow[WorkflowJobs]:
    """Cancel every job of the workflow that has not ended (running jobs'
    leases revoked); return the workflow as it is then."""
    yield Statement("workflow_cancel", {"workflow_id": workflow_id})
    return (yield from get_workflow(workflow_id))


def retry_workflow(workflow_id: uuid.UUID) -> Flow[WorkflowJobs]:
    """Put the workflow's dead and cancelled jobs back, with fresh budgets:
    queued, or waiting for those of their parents that have not succeeded."""
    yield Statement("workflow_retry", {"workflow_id": workflow_id})
    return (yield from get_workflow(workflow_id))


# The most dependents a job's read returns (a fan-out may have many more).
MAX_DEPENDENTS = 1000


def dependents(job_id: int) -> Flow[list[int]]:
    """The ids of the jobs that depend on this one (at most
    ``MAX_DEPENDENTS``, smallest first); JobNotFound for an unknown id."""
    if isinstance(job_id, bool) or not isinstance(job_id, int) or not 1 <= job_id < 2**63:
        raise JobNotFound(job_id)
    rows = yield Statement("job_dependents", {"id": job_id, "limit": MAX_DEPENDENTS})
    if not rows:
        raise JobNotFound(job_id)
    return list(rows[0]["dependents"])
