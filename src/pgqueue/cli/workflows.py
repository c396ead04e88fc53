"""Workflows: ``workflows show ID``, ``workflows cancel ID``, ``workflows
retry ID``. A workflow is made by the library (``Queue.enqueue_workflow``)
or ``POST /workflows``; these commands look at one and act on it."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from ..core.dependencies import WorkflowJobs
from . import output
from .app import app, state_of, wants_json
from .options import JsonFlag

__all__: list[str] = []

workflows_app = typer.Typer(help="Workflows (jobs that wait for other jobs): show, cancel, retry.")
app.add_typer(workflows_app, name="workflows")

IdArgument = Annotated[str, typer.Argument(metavar="ID", help="The workflow's id (a uuid).")]


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
