"""Single jobs: ``jobs list``, ``jobs show``, ``jobs watch``, ``jobs cancel``,
``jobs retry``, ``jobs signal``."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.panel import Panel
from rich.syntax import Syntax
from rich.table import Table

from ..core.errors import InvalidJob
from ..core.jobs import Job, JobState
from ..core.reads import LIST_VIEWS, MAX_ERROR_SEARCH
from ..queue import Queue
from . import output
from .app import jobs_app, state_of, wants_json
from .options import JsonFlag, read_json

__all__: list[str] = []

JobIdArgument = Annotated[int, typer.Argument(metavar="ID")]


# The states a listing takes: every job state, and the views of queued jobs.
_STATES = (*JobState, *LIST_VIEWS)


@jobs_app.command("list")
def jobs_list(
    ctx: typer.Context,
    state_filter: Annotated[
        str | None,
        typer.Option(
            "--state",
            help=f"One of {', '.join(_STATES)} (scheduled: queued for later; retrying: queued "
            "after a failed attempt).",
        ),
    ] = None,
    queue: Annotated[str | None, typer.Option(help="Only this queue.")] = None,
    task: Annotated[str | None, typer.Option(help="Only this task.")] = None,
    error_contains: Annotated[
        str | None,
        typer.Option(help="Only jobs whose last error contains this text (case-sensitive)."),
    ] = None,
    payload_contains: Annotated[
        str | None,
        typer.Option(
            metavar="JSON",
            help="Only jobs whose payload contains this JSON object: '{\"order\": 42}'.",
        ),
    ] = None,
    metadata_contains: Annotated[
        str | None,
        typer.Option(metavar="JSON", help="Only jobs whose metadata contains this JSON object."),
    ] = None,
    limit: Annotated[int, typer.Option(min=1, max=1000, help="At most this many.")] = 50,
    before: Annotated[
        int | None, typer.Option(help="Only ids below this one (the next page: the last id shown).")
    ] = None,
    json_out: JsonFlag = False,
) -> None:
    """Jobs, newest first."""
    state = state_of(ctx)
    if state_filter is not None and state_filter not in _STATES:
        raise typer.BadParameter(f"must be one of {', '.join(_STATES)}", param_hint="'--state'")
    if error_contains is not None and not 1 <= len(error_contains) <= MAX_ERROR_SEARCH:
        raise typer.BadParameter(
            f"must be 1 to {MAX_ERROR_SEARCH} characters", param_hint="'--error-contains'"
        )
    with state.queue() as q:
        try:
            jobs = q.list_jobs(
                state=state_filter,
                queue=queue,
                task=task,
                error_contains=error_contains,
                payload_contains=payload_contains,
                metadata_contains=metadata_contains,
                before_id=before,
                limit=limit,
            )
        except InvalidJob as exc:  # a search that is not a JSON object
            flag = f"'--{exc.field.replace('_', '-')}'"
            raise typer.BadParameter(exc.problem, param_hint=flag) from None
        redaction = q.settings.redaction  # parsed once, not per job
        jobs = [output.shown(job, redaction) for job in jobs]
    if wants_json(ctx, json_out):
        output.emit_json([job.to_dict() for job in jobs])
        return
    if not jobs:
        state.out.print("no jobs")
        return
    state.out.print(output.jobs_table(jobs, datetime.now(UTC), state.out.width))
    if len(jobs) == limit:
        state.err.print(f"[dim]more may follow: --before {jobs[-1].id}[/]")


@jobs_app.command("show")
def jobs_show(ctx: typer.Context, job_id: JobIdArgument, json_out: JsonFlag = False) -> None:
    """Everything about one job."""
    _on_one_job(ctx, json_out, lambda q: q.get(job_id), _print_job)


@jobs_app.command("watch")
def jobs_watch(
    ctx: typer.Context,
    job_id: JobIdArgument,
    timeout: Annotated[
        float, typer.Option(min=0.001, help="Seconds to follow the job before giving up.")
    ] = 3600.0,
    json_out: JsonFlag = False,
) -> None:
    """Follow one job until it ends: its state, each progress report (how far,
    and its info), then how it ended. Exit 1 unless it succeeded."""
    state = state_of(ctx)
    as_json = wants_json(ctx, json_out)
    with state.queue() as q:
        redaction = q.settings.redaction

        def say(job: Job) -> None:
            job = output.shown(job, redaction)
            if as_json:
                output.emit_json(job.to_dict())  # one line per report: JSON Lines
            else:
                state.out.print(_progress_line(job))

        first = q.get(job_id)
        if not as_json:
            state.out.print(
                f"job {first.id} ({escape(first.task)}): {output.state_text(first.state)}"
            )
        ended = output.shown(q.wait(job_id, timeout, on_progress=say), redaction)
    if as_json:
        output.emit_json(ended.to_dict())
    else:
        state.out.print(_ending_line(ended))
    if ended.state is not JobState.SUCCEEDED:
        raise typer.Exit(1)


def _progress_line(job: Job) -> str:
    """A progress report: the fraction as a percentage, then the info."""
    fraction = "-" if job.progress_fraction is None else f"{job.progress_fraction:.0%}"
    info = "" if job.progress_info is None else "  " + escape(_compact(job.progress_info))
    return f"  {fraction:>4}{info}"


def _ending_line(job: Job) -> str:
    ended = f"job {job.id} {output.state_text(job.state)}"
    if job.state is JobState.SUCCEEDED:
        return ended if job.result is None else f"{ended}: {escape(_compact(job.result))}"
    return ended if job.last_error is None else f"{ended}: {escape(job.last_error.splitlines()[0])}"


def _compact(value: object) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": "))


def _on_one_job(
    ctx: typer.Context,
    json_out: bool,
    act: Callable[[Queue], Job],
    say: Callable[[Console, Job], None],
) -> None:
    """Act on one job; print it as JSON, or say what happened."""
    state = state_of(ctx)
    with state.queue() as q:
        job = output.shown(act(q), q.settings.redaction)
    if wants_json(ctx, json_out):
        output.emit_json(job.to_dict())
    else:
        say(state.out, job)


def _print_job(out: Console, job: Job) -> None:
    table = Table(box=None, show_header=False, pad_edge=False)
    table.add_column(style="bold")
    table.add_column()
    for name, value in job.to_dict().items():
        if name in ("payload", "result", "errors", "metadata", "progress_info", "last_checkpoint"):
            continue
        if name == "state":
            shown = output.state_text(job.state)
        elif name == "progress_fraction" and value is not None:
            shown = f"{value:.0%}"
        elif value is None:
            shown = "[dim]-[/]"
        else:
            shown = escape(str(value))
        table.add_row(name, shown)
    out.print(Panel(table, title=f"job {job.id}", title_align="left", expand=False))
    if job.errors:
        out.print(_errors_table(job))
    for name in ("payload", "metadata", "progress_info", "last_checkpoint", "result"):
        value = getattr(job, name)
        if value is not None:
            out.print(f"[bold]{name}[/]")
            out.print(
                Syntax(
                    json.dumps(value, indent=2, ensure_ascii=False),
                    "json",
                    background_color="default",
                )
            )


def _errors_table(job: Job) -> Table:
    """Every failed attempt kept, oldest first: the error's first line, and the
    lines after it (the head of its traceback) dimmed."""
    table = Table(title="failed attempts", title_justify="left", box=None, pad_edge=False)
    for name in ("attempt", "at", "worker", "error"):
        table.add_column(name, no_wrap=name != "error")
    for error in job.errors:
        first, _, rest = error.error.partition("\n")
        table.add_row(
            str(error.attempt),
            error.at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S"),
            escape(error.worker or "-"),
            escape(first) + (f"\n[dim]{escape(rest)}[/]" if rest else ""),
        )
    return table


@jobs_app.command("cancel")
def jobs_cancel(ctx: typer.Context, job_id: JobIdArgument, json_out: JsonFlag = False) -> None:
    """Cancel a queued or running job (a running one's handler is stopped, its result dropped)."""
    _on_one_job(
        ctx,
        json_out,
        lambda q: q.cancel(job_id),
        lambda out, job: out.print(f"cancelled job [bold]{job.id}[/] ({escape(job.task)})"),
    )


@jobs_app.command("signal")
def jobs_signal(
    ctx: typer.Context,
    job_id: JobIdArgument,
    name: Annotated[str, typer.Argument(metavar="NAME", help="The signal's name.")],
    payload: Annotated[
        str, typer.Option(help="The signal's payload: any JSON (default: null).")
    ] = "null",
    json_out: JsonFlag = False,
) -> None:
    """Send a signal to a job, for its handler's job.wait_for_signal(NAME): consumed once;
    a job asleep waiting for it runs now."""
    try:
        body = read_json(payload)
    except ValueError as exc:
        raise typer.BadParameter(f"not valid JSON: {exc}", param_hint="'--payload'") from None
    _on_one_job(
        ctx,
        json_out,
        lambda q: q.signal(job_id, name, body),
        lambda out, job: out.print(
            f"sent signal {escape(name)} to job [bold]{job.id}[/] ({escape(job.task)}, "
            f"{output.state_text(job.state)})"
        ),
    )


@jobs_app.command("retry")
def jobs_retry(
    ctx: typer.Context,
    job_id: Annotated[int | None, typer.Argument(metavar="[ID]")] = None,
    all_dead: Annotated[
        bool,
        typer.Option("--all-dead", help="Retry every dead job (of --queue, or of all queues)."),
    ] = False,
    queue: Annotated[str | None, typer.Option(help="With --all-dead: only this queue.")] = None,
    json_out: JsonFlag = False,
) -> None:
    """Put a dead or cancelled job back in its queue, or every dead job with --all-dead."""
    if (job_id is None) == (not all_dead):
        raise typer.BadParameter(
            "give a job ID or --all-dead (not both)", param_hint="'ID' / '--all-dead'"
        )
    if queue is not None and not all_dead:
        raise typer.BadParameter("only goes with --all-dead", param_hint="'--queue'")
    if job_id is not None:
        _on_one_job(
            ctx,
            json_out,
            lambda q: q.retry(job_id),
            lambda out, job: out.print(
                f"job [bold]{job.id}[/] ({escape(job.task)}) is queued again"
            ),
        )
        return
    state = state_of(ctx)
    with state.queue() as q:
        count = q.retry_dead(queue)
    if wants_json(ctx, json_out):
        output.emit_json({"retried": count, "queue": queue})
    else:
        where = f" of queue {escape(queue)}" if queue else ""
        state.out.print(f"retried {count} dead job(s){where}")
