"""Workflows: jobs composed into chains, groups and fan-ins, enqueued
together in one transaction under one workflow id.

    chain(a, b, c)            b waits for a, c for b; each step's handler gets
                              the previous step's result in ``job.parents``
    group(a, b, c)            a, b and c run in parallel
    chain(group(a, b), d)     fan-in: d waits for a and b and gets both
                              results, in that order
    chain(a, group(b, c))     fan-out: b and c wait for a

A step is a job's fields (a mapping, as ``Queue.enqueue_many`` takes:
``{"task": ..., "payload": ..., "queue": ...}``), a ``JobSpec``, or a chain
or group. ``by_name`` reads the shape ``POST /workflows`` takes: jobs named
by the client, each naming the jobs it depends on. Both make a
``dependencies.Graph``; ``Queue.enqueue_workflow`` inserts it. No I/O here.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from .dependencies import (
    Graph,
    WorkflowJobs,
    cancel_workflow,
    enqueue_graph,
    get_workflow,
    retry_workflow,
)
from .errors import InvalidJob, WorkflowNotFound
from .flows import Flow, Statement
from .job_spec import JobSpec, build_specs
from .jobs import JobState
from .json_text import printable

__all__ = [
    "Chain",
    "Group",
    "Step",
    "Workflow",
    "WorkflowSummary",
    "act",
    "by_name",
    "chain",
    "enqueue",
    "graph_of",
    "group",
    "list_workflows",
    "specs_maker",
]

# The most jobs one workflow may have.
MAX_WORKFLOW_JOBS = 100_000


@dataclass(frozen=True, slots=True)
class Chain:
    """Steps one after the other; make one with ``chain``."""

    steps: tuple[Step, ...]


@dataclass(frozen=True, slots=True)
class Group:
    """Steps side by side; make one with ``group``."""

    steps: tuple[Step, ...]


Step = JobSpec | Mapping[str, Any] | Chain | Group
# What Queue.enqueue_workflow takes: a composition, or named jobs (``by_name``).
Workflow = Step | Sequence[Mapping[str, Any]]


def chain(*steps: Step) -> Chain:
    """Each step waits for the one before (for all of a group's last jobs)."""
    if not steps:
        raise InvalidJob("chain", "needs at least one step")
    return Chain(steps)


def group(*steps: Step) -> Group:
    """The steps run in parallel; what follows the group waits for all of them."""
    if not steps:
        raise InvalidJob("group", "needs at least one step")
    return Group(steps)


MakeSpecs = Callable[[Sequence[JobSpec | Mapping[str, Any]]], list[JobSpec]]
Stamp = Callable[[list[JobSpec]], list[JobSpec]]


def graph_of(workflow: Step, make_specs: MakeSpecs) -> Graph:
    """The jobs of a composition and their edges, in the order written."""
    jobs: list[JobSpec | Mapping[str, Any]] = []
    after: list[tuple[int, ...]] = []

    def add(step: Step, before: tuple[int, ...]) -> tuple[int, ...]:
        # Returns the jobs that end the step: what comes next waits for them.
        if isinstance(step, Chain):
            for inner in step.steps:
                before = add(inner, before)
            return before
        if isinstance(step, Group):
            return tuple(place for inner in step.steps for place in add(inner, before))
        jobs.append(step)
        after.append(before)
        return (len(jobs) - 1,)

    add(workflow, ())
    _check_size(len(jobs))
    return Graph(tuple(make_specs(jobs)), tuple(after))


def by_name(jobs: Sequence[Mapping[str, Any]], make_specs: MakeSpecs) -> Graph:
    """A graph from jobs that each have a ``name`` and may name the jobs they
    depend on in ``depends_on``; the other fields are a job's. InvalidJob
    (``jobs[3].depends_on``...) for a missing, repeated or unknown name."""
    _check_size(len(jobs))
    names: list[str] = []
    wanted: list[list[str]] = []
    fields: list[dict[str, Any]] = []
    for index, job in enumerate(jobs):
        if not isinstance(job, Mapping):
            raise InvalidJob(f"jobs[{index}]", f"must be an object, got {type(job).__name__}")
        rest = dict(job)
        names.append(_name(index, rest.pop("name", None), names))
        wanted.append(_names(index, rest.pop("depends_on", None)))
        fields.append(rest)
    place = {name: i for i, name in enumerate(names)}
    after = []
    for index, parents in enumerate(wanted):
        unknown = [name for name in parents if name not in place]
        if unknown:
            shown = ", ".join(repr(printable(name)) for name in unknown)
            raise InvalidJob(
                f"jobs[{index}].depends_on", f"no job of the workflow is named {shown}"
            )
        after.append(tuple(place[name] for name in parents))
    return Graph(tuple(make_specs(fields)), tuple(after), tuple(names))


def _name(index: int, name: Any, taken: list[str]) -> str:
    if not isinstance(name, str) or not 1 <= len(name) <= 200:
        raise InvalidJob(f"jobs[{index}].name", "must be a string of 1 to 200 characters")
    if name in taken:
        raise InvalidJob(f"jobs[{index}].name", f"{printable(name)!r} names two jobs")
    return name


def _names(index: int, value: Any) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(name, str) for name in value):
        raise InvalidJob(f"jobs[{index}].depends_on", "must be a list of job names")
    return list(dict.fromkeys(value))


def _check_size(count: int) -> None:
    if not 1 <= count <= MAX_WORKFLOW_JOBS:
        raise InvalidJob("jobs", f"a workflow has 1 to {MAX_WORKFLOW_JOBS} jobs, got {count}")


def enqueue(
    workflow: Workflow, default_max_attempts: int, stamp: Stamp = list
) -> Flow[WorkflowJobs]:
    """Insert a workflow's jobs (a composition, or named jobs as ``by_name``
    reads them) under a new workflow id; run it in one transaction: all or
    nothing. ``stamp`` is given the checked jobs (tracing.py puts the
    caller's trace context in their metadata)."""
    make = specs_maker(default_max_attempts, stamp)
    # (A JobSpec is a tuple too: a sequence, but one job.)
    if isinstance(workflow, JobSpec | Mapping | Chain | Group):
        graph = graph_of(workflow, make)
    else:
        graph = by_name(workflow, make)
    workflow_id = uuid.uuid4()
    jobs = yield from enqueue_graph(graph, workflow_id)
    return WorkflowJobs(workflow_id, jobs)


_ACTIONS = {"show": get_workflow, "cancel": cancel_workflow, "retry": retry_workflow}


def act(action: str, workflow_id: uuid.UUID | str) -> Flow[WorkflowJobs]:
    """Show, cancel or retry a workflow (WorkflowNotFound for an id that is
    no workflow's, or no uuid at all)."""
    if action not in _ACTIONS:
        raise ValueError(f"action must be one of {', '.join(_ACTIONS)}, got {action!r}")
    try:
        key = workflow_id if isinstance(workflow_id, uuid.UUID) else uuid.UUID(workflow_id)
    except (TypeError, ValueError, AttributeError):
        raise WorkflowNotFound(workflow_id) from None
    return _ACTIONS[action](key)


def specs_maker(default_max_attempts: int, stamp: Stamp = list) -> MakeSpecs:
    """Check a workflow's jobs as ``enqueue_many`` checks a batch; a workflow
    job has no key (InvalidJob naming it)."""

    def make(jobs: Sequence[JobSpec | Mapping[str, Any]]) -> list[JobSpec]:
        specs = stamp(build_specs(jobs, default_max_attempts=default_max_attempts))
        for index, spec in enumerate(specs):
            if spec.idempotency_key is not None:
                raise InvalidJob(
                    f"jobs[{index}].idempotency_key", "a job of a workflow cannot have a key"
                )
            if spec.batch_id is not None:
                raise InvalidJob(f"jobs[{index}].batch", "a job of a workflow cannot join a batch")
        return specs

    return make


# What a workflow listing may keep (workflow_list): a workflow with a job not
# ended, with none, with only succeeded jobs, with a dead or a cancelled job.
LIST_STATES = ("running", "finished", "succeeded", "dead", "cancelled")
MAX_LIST = 200


@dataclass(frozen=True, slots=True)
class WorkflowSummary:
    """One workflow of a listing: how many of its jobs are in each state
    (``counts``, every state named), when its first job was enqueued, the
    task of its first job (a workflow has no name of its own), and the last
    time one of its jobs ended. ``first_job`` is the listing's cursor."""

    id: uuid.UUID
    first_job: int
    jobs: int
    counts: dict[str, int]
    created_at: datetime
    last_finished_at: datetime | None
    first_task: str

    @property
    def finished(self) -> bool:
        """Every job ended (succeeded, dead or cancelled)."""
        return not any(self.counts[s] for s in ("waiting", "queued", "running"))


def list_workflows(
    *, state: str | None = None, before: int | None = None, limit: int = 50
) -> Flow[list[WorkflowSummary]]:
    """Workflows newest first, with their jobs counted by state; pass the
    last one's ``first_job`` as ``before`` for the next page. ``state``
    keeps one of ``LIST_STATES`` (InvalidJob naming the argument otherwise)."""
    if state is not None and state not in LIST_STATES:
        raise InvalidJob("state", f"must be one of {', '.join(LIST_STATES)}, got {state!r}")
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIST:
        raise InvalidJob("limit", f"must be between 1 and {MAX_LIST}, got {limit!r}")
    if before is not None and (
        isinstance(before, bool) or not isinstance(before, int) or not 1 <= before < 2**63
    ):
        raise InvalidJob("before", f"must be a job id (a positive integer), got {before!r}")
    rows = yield Statement("workflow_list", {"state": state, "before": before, "limit": limit})
    return [
        WorkflowSummary(
            id=row["workflow_id"],
            first_job=row["first_job"],
            jobs=row["jobs"],
            counts={s.value: row[s.value] for s in JobState},
            created_at=row["created_at"],
            last_finished_at=row["last_finished_at"],
            first_task=row["first_task"],
        )
        for row in rows
    ]
