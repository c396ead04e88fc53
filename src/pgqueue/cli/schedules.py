"""Schedules (periodic jobs): ``schedules`` (the list), ``schedules enable``,
``schedules disable``, ``schedules delete``. Schedules are declared in the
workers' code; these commands only look at them and switch them."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from ..core import schedules
from ..core.jobs import JobState
from ..core.schedules import ScheduleRecord
from ..queue import Queue
from . import output
from .app import app, state_of, wants_json
from .options import JsonFlag

__all__: list[str] = []

schedules_app = typer.Typer(
    help="Periodic jobs, declared in the workers' code: list them, switch them on and off.",
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
        state.out.print("no schedules (a worker writes those its code declares when it starts)")
    else:
        state.out.print(_table(records, datetime.now(UTC), state.out.width))


_COLUMNS = (
    output.Column("name", flexible=True),
    output.Column("status"),
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
