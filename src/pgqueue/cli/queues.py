"""The queues: ``queues`` (the table of watching.py), and their controls:
``queues pause``, ``queues resume`` and ``queues limit``; the per-key
latency objectives of fair queues: ``queues key-objective`` and
``queues keys``."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.markup import escape

from ..core.key_objectives import KeyObjective, removed
from ..core.queue_controls import QueueControls
from . import output, watching
from .app import app, state_of, wants_json
from .options import JsonFlag, option, parse_duration

__all__ = ["parse_rate"]

queues_app = typer.Typer(
    help="Per queue: jobs by state, age of the oldest runnable job, jobs done in the last "
    "minute; and the queues' pause and limits.",
    invoke_without_command=True,
)
app.add_typer(queues_app, name="queues")

Name = Annotated[str, typer.Argument(help="The queue's name.", show_default=False)]
KEY_COLUMNS = (
    output.Column("key", flexible=True),
    output.Column("objective", justify="right"),
    output.Column("wait", justify="right"),
    output.Column("shortfall", justify="right"),
)
# A limit given as this word is removed.
NONE = "none"


@queues_app.callback()
def queues_cmd(ctx: typer.Context, json_out: JsonFlag = False) -> None:
    """Per queue: jobs by state, age of the oldest runnable job, jobs done in the last minute.

    queued/scheduled/running/waiting are now (waiting: for the jobs they depend
    on); succeeded/failed/dead/cancelled are totals since the queue began
    (failed counts failed attempts); done/min counts jobs that succeeded or
    died in the last 60 s. A paused queue is marked so.
    """
    if ctx.invoked_subcommand is None:
        watching.print_queues(ctx, json_out)


@queues_app.command("pause")
def pause_cmd(ctx: typer.Context, name: Name, json_out: JsonFlag = False) -> None:
    """Start no more jobs of a queue, on any worker; its running jobs finish."""
    with state_of(ctx).queue() as q:
        _print(ctx, q.pause(name), json_out)


@queues_app.command("resume")
def resume_cmd(ctx: typer.Context, name: Name, json_out: JsonFlag = False) -> None:
    """Start jobs of a paused queue again (idle workers are woken at once)."""
    with state_of(ctx).queue() as q:
        _print(ctx, q.resume(name), json_out)


@queues_app.command("limit")
def limit_cmd(
    ctx: typer.Context,
    name: Name,
    concurrency: Annotated[
        str | None,
        typer.Option(help="At most N jobs of the queue running at once, on all workers; none."),
    ] = None,
    concurrency_per_key: Annotated[
        str | None,
        typer.Option(help="At most N running at once per concurrency_key; none."),
    ] = None,
    rate: Annotated[
        str | None,
        typer.Option(
            help="At most N starts per period: 100/1m, 5/1s, or 100 (the period set already); none."
        ),
    ] = None,
    rate_per_key: Annotated[
        str | None,
        typer.Option(help="At most N starts per period per concurrency_key: 10/1m; none."),
    ] = None,
    fair: Annotated[
        bool | None,
        typer.Option(
            "--fair/--no-fair",
            help="Share the queue's slots across concurrency_key values, round robin.",
        ),
    ] = None,
    max_start_lag: Annotated[
        str | None,
        typer.Option(
            help="The queue's latency objective: its jobs should start within this long "
            "(30, 5s, 2m); workers of several queues claim first from those furthest "
            "behind theirs; none.",
        ),
    ] = None,
    json_out: JsonFlag = False,
) -> None:
    """Change a queue's limits; those not given stay ("none" removes one)."""
    changes: dict[str, Any] = {}
    for key, value, flag in (
        ("concurrency_limit", concurrency, "--concurrency"),
        ("concurrency_limit_per_key", concurrency_per_key, "--concurrency-per-key"),
    ):
        if value is not None:
            changes[key] = option(_count, value, flag)
    for key, value, flag in (
        ("rate_limit", rate, "--rate"),
        ("rate_limit_per_key", rate_per_key, "--rate-per-key"),
    ):
        if value is not None:
            changes[key], period = option(parse_rate, value, flag)
            if period is not None and changes.setdefault("rate_period_seconds", period) != period:
                raise typer.BadParameter("--rate and --rate-per-key have one period")
    if fair is not None:
        changes["fair"] = fair
    if max_start_lag is not None:
        changes["max_start_lag_seconds"] = option(_seconds, max_start_lag, "--max-start-lag")
    if not changes:
        raise typer.BadParameter(
            "give at least one of --concurrency, --concurrency-per-key, --rate, --rate-per-key, "
            "--fair/--no-fair, --max-start-lag"
        )
    with state_of(ctx).queue() as q:
        _print(ctx, q.set_limits(name, **changes), json_out)


@queues_app.command("key-objective")
def key_objective_cmd(
    ctx: typer.Context,
    name: Name,
    key: Annotated[str, typer.Argument(help="The concurrency_key.", show_default=False)],
    max_start_lag: Annotated[
        str,
        typer.Option(
            help="The key's latency objective: its jobs should start within this long "
            "(30, 5s, 2m); none removes it.",
            show_default=False,
        ),
    ],
    json_out: JsonFlag = False,
) -> None:
    """Declare the latency objective of one concurrency_key of a fair queue: a key
    whose next job has waited half of it is claimed before the round robin."""
    seconds = option(_seconds, max_start_lag, "--max-start-lag")
    with state_of(ctx).queue() as q:
        objective = q.set_key_objective(name, key, seconds)
    if wants_json(ctx, json_out):
        output.emit_json(objective.to_dict() if objective else removed(name, key))
        return
    said = "no objective"
    if objective is not None:
        said = f"start within {output.age(objective.max_start_lag_seconds)} (its next job "
        said += f"has waited {output.age(objective.wait_seconds)})"
    state_of(ctx).out.print(f"{escape(name)} {escape(key)}: {said}")


@queues_app.command("keys")
def keys_cmd(
    ctx: typer.Context,
    name: Annotated[
        str | None,
        typer.Argument(help="The queue's name (default: every queue's).", show_default=False),
    ] = None,
    json_out: JsonFlag = False,
) -> None:
    """The per-key latency objectives of a queue, or of every queue: each key's
    objective, how long its next job has waited, and how far that is past
    the objective."""
    with state_of(ctx).queue() as q:
        objectives = q.key_objectives(name)
    if wants_json(ctx, json_out):
        output.emit_json([o.to_dict() for o in objectives])
        return
    out = state_of(ctx).out
    if not objectives:
        out.print(f"{escape(name)}: no key objectives" if name else "no key objectives")
        return
    columns = KEY_COLUMNS if name else (output.Column("queue", flexible=True), *KEY_COLUMNS)
    rows = [_key_cells(o) if name else [escape(o.queue), *_key_cells(o)] for o in objectives]
    out.print(output.fitted_table(columns, rows, out.width))


def _key_cells(o: KeyObjective) -> list[str]:
    behind = f"[red]{output.age(o.shortfall_seconds)}[/]" if o.shortfall_seconds else "-"
    return [escape(o.key), output.age(o.max_start_lag_seconds), output.age(o.wait_seconds), behind]


def _seconds(text: str) -> float | None:
    return None if text.strip().lower() == NONE else parse_duration(text)


def _count(text: str) -> int | None:
    if text.strip().lower() == NONE:
        return None
    try:
        return int(text)
    except ValueError:
        raise typer.BadParameter(f"{text!r} is not a whole number (or {NONE})") from None


def parse_rate(text: str) -> tuple[int | None, float | None]:
    """``N/PERIOD`` (100/1m), ``N`` (the period stays) or ``none``: the
    number of starts and the period in seconds."""
    count, slash, period = text.partition("/")
    if not slash:
        return _count(count), None
    if count.strip().lower() == NONE:
        raise typer.BadParameter(f"{NONE} takes no period")
    return _count(count), parse_duration(period)


def _print(ctx: typer.Context, controls: QueueControls, json_out: bool) -> None:
    if wants_json(ctx, json_out):
        output.emit_json(controls.to_dict())
    else:
        state_of(ctx).out.print(f"{escape(controls.queue)}: {output.controls_text(controls)}")
