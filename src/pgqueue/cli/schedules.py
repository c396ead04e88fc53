"""Schedules (periodic jobs): ``schedules`` (the list), ``schedules enable``,
``schedules disable``, ``schedules delete``, ``schedules run`` (one job now),
and ``schedules create`` / ``schedules update`` for runtime schedules (those
declared in the workers' code are changed in the code)."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from ..core import schedules
from ..core.jobs import JobState
from ..core.schedules import ScheduleRecord
from ..queue import Queue
from . import output
from .app import app, state_of, wants_json
from .options import JsonFlag, option, parse_duration

__all__: list[str] = []

schedules_app = typer.Typer(
    help="Periodic jobs, declared in the workers' code or created at run time: list them, "
    "create and change runtime ones, switch them on and off, run one now.",
    invoke_without_command=True,
)
app.add_typer(schedules_app, name="schedules")

NameArgument = Annotated[str, typer.Argument(metavar="NAME", help="The schedule's name.")]
_STATUS_STYLES = {"enabled": "green", "disabled": "yellow", "retired": "dim"}


@schedules_app.callback()
def schedules_list(ctx: typer.Context, json_out: JsonFlag = False) -> None:
    """Every schedule: its timing, when it runs next, when it last ran, its last job."""
    if ctx.invoked_subcommand is not None:
        return
    state = state_of(ctx)
    with state.queue() as q:
        records = q.run(schedules.list_schedules())
    if wants_json(ctx, json_out):
        output.emit_json({"schedules": [record.to_dict() for record in records]})
    elif not records:
        state.out.print(
            "no schedules (a worker writes those its code declares when it starts; "
            "`pgqueue schedules create` makes one at run time)"
        )
    else:
        state.out.print(_table(records, datetime.now(UTC), state.out.width))


_COLUMNS = (
    output.Column("name", flexible=True),
    output.Column("status"),
    output.Column("origin", optional=True),
    output.Column("timing", flexible=True),
    output.Column("task", flexible=True),
    output.Column("queue", flexible=True, optional=True),
    output.Column("next run"),
    output.Column("last run", optional=True),
    output.Column("last job", optional=True),
)


def _table(records: list[ScheduleRecord], now: datetime, width: int) -> Table:
    """The schedules, one line each, fitted to a terminal ``width`` wide."""
    rows = []
    for r in records:
        timing = r.spec if r.cron is None or r.tz == "UTC" else f"{r.spec} ({r.tz})"
        job = "-"
        if r.last_job_id is not None:
            state = output.state_text(JobState(r.last_job_state)) if r.last_job_state else "pruned"
            job = f"{r.last_job_id} {state}"
        rows.append(
            (
                escape(r.name),
                f"[{_STATUS_STYLES[r.status]}]{r.status}[/]",
                r.origin,
                escape(timing),
                escape(r.task),
                escape(r.queue),
                _when(r.next_run_at, now) if r.status == "enabled" else "-",
                _when(r.last_run_at, now),
                job,
            )
        )
    return output.fitted_table(_COLUMNS, rows, width)


def _when(moment: datetime | None, now: datetime) -> str:
    if moment is None:
        return "-"
    seconds = (now - moment).total_seconds()
    return output.age(seconds) + (" ago" if seconds >= 0 else "")


def _switch(
    ctx: typer.Context, json_out: bool, act: Callable[[Queue], ScheduleRecord], done: str
) -> None:
    state = state_of(ctx)
    with state.queue() as q:
        record = act(q)
    if wants_json(ctx, json_out):
        output.emit_json(record.to_dict())
        return
    state.out.print(f"schedule [bold]{escape(record.name)}[/] {done}")
    if record.status == "retired":
        state.out.print(
            "[dim]it is retired (no worker's code declares it): it fires only when declared "
            "again[/]"
        )


@schedules_app.command("enable")
def schedules_enable(ctx: typer.Context, name: NameArgument, json_out: JsonFlag = False) -> None:
    """Switch a schedule on. It starts from its next tick: the time it was off is not caught up."""
    _switch(ctx, json_out, lambda q: q.run(schedules.set_enabled(name, True)), "is enabled")


@schedules_app.command("disable")
def schedules_disable(ctx: typer.Context, name: NameArgument, json_out: JsonFlag = False) -> None:
    """Switch a schedule off, on every worker, until it is switched on (restarts keep it off)."""
    _switch(ctx, json_out, lambda q: q.run(schedules.set_enabled(name, False)), "is disabled")


@schedules_app.command("delete")
def schedules_delete(ctx: typer.Context, name: NameArgument, json_out: JsonFlag = False) -> None:
    """Delete a schedule (a retired one, typically); its jobs stay.

    A worker whose code still declares it creates it again when it starts.
    """
    state = state_of(ctx)
    with state.queue() as q:
        q.run(schedules.delete(name))
    if wants_json(ctx, json_out):
        output.emit_json({"deleted": name})
    else:
        state.out.print(f"schedule [bold]{escape(name)}[/] deleted")


# -- runtime schedules ---------------------------------------------------------------------

TaskOption = Annotated[
    str | None, typer.Option(help="The task each job runs (create: default the name).")
]
CronOption = Annotated[
    str | None, typer.Option(help="A cron expression: '*/15 * * * *' (or --every).")
]
EveryOption = Annotated[
    str | None, typer.Option(help="Every this long, in whole seconds: 60, 5m, 1h (or --cron).")
]
TzOption = Annotated[str | None, typer.Option(help="The IANA zone of --cron (default UTC).")]
PayloadOption = Annotated[
    str | None, typer.Option(metavar="JSON", help="Each job's payload: a JSON object.")
]
QueueOption = Annotated[str | None, typer.Option(help="Each job's queue (default: default).")]
PriorityOption = Annotated[int | None, typer.Option(help="Each job's priority.")]
MaxAttemptsOption = Annotated[
    int | None, typer.Option("--max-attempts", help="Each job's attempts (default: the worker's).")
]
TimeoutOption = Annotated[str | None, typer.Option(help="Each job's time limit: 30s, 5m.")]
CatchUpOption = Annotated[
    str | None,
    typer.Option("--catch-up", help="Ticks missed while no worker ran: none, last (default), all."),
]
CatchUpLimitOption = Annotated[
    int | None,
    typer.Option("--catch-up-limit", help="With --catch-up all: at most this many (default 100)."),
]


def _fields(
    task: str | None,
    cron: str | None,
    every: str | None,
    tz: str | None,
    payload: str | None,
    queue: str | None,
    priority: int | None,
    max_attempts: int | None,
    timeout: str | None,
    catch_up: str | None,
    catch_up_limit: int | None,
) -> dict[str, Any]:
    """The options given, as the fields of Queue.create_schedule / update_schedule."""
    fields: dict[str, Any] = {
        "task": task,
        "cron": cron,
        "tz": tz,
        "queue": queue,
        "priority": priority,
        "max_attempts": max_attempts,
        "catch_up": catch_up,
        "catch_up_limit": catch_up_limit,
    }
    if every is not None:
        fields["every"] = option(parse_duration, every, "--every")
    if timeout is not None:
        fields["timeout"] = option(parse_duration, timeout, "--timeout")
    if payload is not None:
        fields["payload"] = _payload(payload)
    return {name: value for name, value in fields.items() if value is not None}


def _payload(text: str) -> dict[str, Any]:
    try:
        body = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise typer.BadParameter(f"not valid JSON: {exc}", param_hint="'--payload'") from None
    if not isinstance(body, dict):
        raise typer.BadParameter(
            f"must be a JSON object, got {type(body).__name__}", param_hint="'--payload'"
        )
    return body


def _written(ctx: typer.Context, json_out: bool, record: ScheduleRecord, done: str) -> None:
    state = state_of(ctx)
    if wants_json(ctx, json_out):
        output.emit_json(record.to_dict())
        return
    when = "-" if record.next_run_at is None else record.next_run_at.astimezone().isoformat()
    state.out.print(
        f"schedule [bold]{escape(record.name)}[/] {done}: {escape(record.spec)}"
        f"{'' if record.cron is None or record.tz == 'UTC' else f' ({escape(record.tz)})'}, "
        f"task {escape(record.task)}, next run {when}"
        f"{'' if record.enabled else ' (disabled)'}"
    )


@schedules_app.command("create")
def schedules_create(
    ctx: typer.Context,
    name: NameArgument,
    task: TaskOption = None,
    cron: CronOption = None,
    every: EveryOption = None,
    tz: TzOption = None,
    payload: PayloadOption = None,
    queue: QueueOption = None,
    priority: PriorityOption = None,
    max_attempts: MaxAttemptsOption = None,
    timeout: TimeoutOption = None,
    catch_up: CatchUpOption = None,
    catch_up_limit: CatchUpLimitOption = None,
    disabled: Annotated[bool, typer.Option("--disabled", help="Create it switched off.")] = False,
    json_out: JsonFlag = False,
) -> None:
    """Create a runtime schedule; it starts at its first tick after now.

    Refused if any schedule has the name (one declared in code included).
    """
    fields = _fields(
        task, cron, every, tz, payload, queue, priority, max_attempts, timeout, catch_up,
        catch_up_limit,
    )  # fmt: skip
    with state_of(ctx).queue() as q:
        record = q.create_schedule(name, enabled=not disabled, **fields)
    _written(ctx, json_out, record, "created")


@schedules_app.command("update")
def schedules_update(
    ctx: typer.Context,
    name: NameArgument,
    task: TaskOption = None,
    cron: CronOption = None,
    every: EveryOption = None,
    tz: TzOption = None,
    payload: PayloadOption = None,
    queue: QueueOption = None,
    priority: PriorityOption = None,
    max_attempts: MaxAttemptsOption = None,
    timeout: TimeoutOption = None,
    catch_up: CatchUpOption = None,
    catch_up_limit: CatchUpLimitOption = None,
    json_out: JsonFlag = False,
) -> None:
    """Change a runtime schedule: the options given change, the others stay.

    A new --cron or --every replaces the timing, which starts again from its
    first tick after now. One declared in code is changed in the code.
    """
    fields = _fields(
        task, cron, every, tz, payload, queue, priority, max_attempts, timeout, catch_up,
        catch_up_limit,
    )  # fmt: skip
    with state_of(ctx).queue() as q:
        record = q.update_schedule(name, **fields)
    _written(ctx, json_out, record, "updated")


@schedules_app.command("run")
def schedules_run(ctx: typer.Context, name: NameArgument, json_out: JsonFlag = False) -> None:
    """Enqueue one job of a schedule now; its next tick stays.

    The same command twice within one second enqueues one job.
    """
    state = state_of(ctx)
    with state.queue() as q:
        job = q.run_schedule_now(name)
    if wants_json(ctx, json_out):
        output.emit_json({**job.to_dict(), "duplicate": job.duplicate})
    elif job.duplicate:
        state.out.print(
            f"schedule [bold]{escape(name)}[/] was run this second already: job "
            f"[bold]{job.id}[/] ({output.state_text(job.state)}); nothing new was written"
        )
    else:
        state.out.print(
            f"schedule [bold]{escape(name)}[/] run now: enqueued job [bold]{job.id}[/] "
            f"({escape(job.task)} on queue {escape(job.queue)})"
        )
