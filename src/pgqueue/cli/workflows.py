"""Workflows: ``workflows list``, ``workflows show ID``, ``workflows cancel
ID``, ``workflows retry ID``. A workflow is made by the library (``Queue.enqueue_workflow``)
or ``POST /workflows``; these commands look at one and act on it."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from ..core.dependencies import WorkflowJobs
from ..core.jobs import JobState
from ..core.workflows import LIST_STATES, MAX_LIST, WorkflowSummary
from . import output
from .app import app, state_of, wants_json
from .options import JsonFlag

__all__: list[str] = []

workflows_app = typer.Typer(
    help="Workflows (jobs that wait for other jobs): list, show, cancel, retry."
)
app.add_typer(workflows_app, name="workflows")

IdArgument = Annotated[str, typer.Argument(metavar="ID", help="The workflow's id (a uuid).")]


@workflows_app.command("list")
def list_(
    ctx: typer.Context,
    state_filter: Annotated[
        str | None,
        typer.Option(
            "--state",
            help=f"One of {', '.join(LIST_STATES)} (running: a job not ended yet; finished: "
            "every job ended; succeeded: every job succeeded; dead, cancelled: such a job).",
        ),
    ] = None,
    limit: Annotated[int, typer.Option(min=1, max=MAX_LIST, help="At most this many.")] = 50,
    before: Annotated[
        int | None,
        typer.Option(
            min=1, help="Only workflows older than this cursor (the next page: as printed)."
        ),
    ] = None,
    json_out: JsonFlag = False,
) -> None:
    """Workflows, newest first, with their jobs counted by state."""
    state = state_of(ctx)
    if state_filter is not None and state_filter not in LIST_STATES:
        raise typer.BadParameter(f"must be one of {', '.join(LIST_STATES)}", param_hint="'--state'")
    with state.queue() as q:
        found = q.list_workflows(state=state_filter, before=before, limit=limit)
    if wants_json(ctx, json_out):
        output.emit_json([_listed(workflow) for workflow in found])
        return
    if not found:
        state.out.print("no workflows")
        return
    state.out.print(_list_table(found))
    if len(found) == limit:
        state.err.print(f"[dim]more may follow: --before {found[-1].first_job}[/]")


def _listed(workflow: WorkflowSummary) -> dict[str, object]:
    return {
        "workflow_id": str(workflow.id),
        "jobs": workflow.jobs,
        "counts": workflow.counts,
        "finished": workflow.finished,
        "created_at": workflow.created_at,
        "last_finished_at": workflow.last_finished_at,
        "first_task": workflow.first_task,
    }


def _list_table(found: list[WorkflowSummary]) -> Table:
    # The id is never cut (it is what show, cancel and retry take); the
    # states wrap on a narrow terminal.
    table = Table(box=None, header_style="bold", pad_edge=False)
    table.add_column("workflow", no_wrap=True)
    table.add_column("jobs", justify="right", no_wrap=True)
    table.add_column("states")
    table.add_column("first task", overflow="ellipsis")
    table.add_column("created", no_wrap=True)
    for workflow in found:
        states = ", ".join(
            f"{workflow.counts[s]} {output.state_text(s)}" for s in JobState if workflow.counts[s]
        )
        table.add_row(
            str(workflow.id),
            str(workflow.jobs),
            states,
            escape(workflow.first_task),
            workflow.created_at.astimezone().strftime("%Y-%m-%d %H:%M"),
        )
    return table


@workflows_app.command("show")
def show(ctx: typer.Context, workflow_id: IdArgument, json_out: JsonFlag = False) -> None:
    """Every job of the workflow: its state and the jobs it waits for."""
    _act(ctx, workflow_id, "show", json_out)


@workflows_app.command("cancel")
def cancel(ctx: typer.Context, workflow_id: IdArgument, json_out: JsonFlag = False) -> None:
    """Cancel every job of the workflow that has not ended (running ones lose their lease)."""
    _act(ctx, workflow_id, "cancel", json_out)


@workflows_app.command("retry")
def retry(ctx: typer.Context, workflow_id: IdArgument, json_out: JsonFlag = False) -> None:
    """Run the workflow's dead and cancelled jobs again, each after its parents."""
    _act(ctx, workflow_id, "retry", json_out)


def _act(ctx: typer.Context, workflow_id: str, action: str, json_out: bool) -> None:
    state = state_of(ctx)
    with state.queue() as q:
        workflow = q.workflow(workflow_id, action)
        redaction = q.settings.redaction
    if wants_json(ctx, json_out):
        output.emit_json(
            {
                "workflow_id": str(workflow.id),
                "counts": workflow.counts(),
                "jobs": [output.shown(job, redaction).to_dict() for job in workflow.jobs],
                "edges": [{"parent": p, "child": c} for p, c in workflow.edges()],
            }
        )
        return
    counts = ", ".join(f"{n} {name}" for name, n in workflow.counts().items() if n)
    state.out.print(f"workflow {workflow.id}: {len(workflow.jobs)} jobs ({counts})")
    state.out.print(_table(workflow))


def _table(workflow: WorkflowJobs) -> Table:
    table = Table(box=None, header_style="bold", pad_edge=False)
    for name in ("id", "task", "queue", "state", "tries", "waits for"):
        table.add_column(name, justify="right" if name in ("id", "tries") else "left")
    for job in workflow.jobs:
        table.add_row(
            str(job.id),
            escape(job.task),
            escape(job.queue),
            output.state_text(job.state),
            f"{job.attempts}/{job.max_attempts}",
            ", ".join(map(str, job.depends_on or ())) or "-",
        )
    return table
