"""``doctor``: the live capacity and health check (core/doctor.py), as a
table or JSON; exit code 1 when a check fails (with ``--strict``, also when
one warns)."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from ..core.doctor import DoctorOptions
from ..core.health import HealthReport
from . import output
from .app import app, state_of, wants_json
from .options import JsonFlag, option, parse_duration

__all__: list[str] = []

_STYLES = {"ok": "green", "warn": "bold yellow", "fail": "bold red"}
_DEFAULTS = DoctorOptions()


@app.command("doctor")
def doctor_cmd(
    ctx: typer.Context,
    window: Annotated[
        str,
        typer.Option(
            "--window", help="How long to measure the rate and the cost per job over (0.1s to 60s)."
        ),
    ] = f"{_DEFAULTS.window_seconds:g}s",
    long_transaction: Annotated[
        str,
        typer.Option("--long-transaction", help="Report transactions open longer than this."),
    ] = f"{_DEFAULTS.long_transaction_seconds:g}s",
    cores: Annotated[
        int | None,
        typer.Option(
            min=1, max=4096, help="The database server's cores, for the headroom in jobs/s."
        ),
    ] = None,
    strict: Annotated[
        bool, typer.Option("--strict", help="Exit 1 on a warning too, not only on a failure.")
    ] = False,
    json_out: JsonFlag = False,
) -> None:
    """Measure what a job costs the database now and how far it goes, and check
    what threatens it: long transactions, vacuum, statistics, the claim's plan,
    risky settings, the schema, stuck jobs, workers.

    Waits --window to measure. Exit code 1 when a check fails (--strict: or warns).
    """
    state = state_of(ctx)
    window_seconds = option(parse_duration, window, "--window")
    if not 0.1 <= window_seconds <= 60:
        raise typer.BadParameter("must be between 0.1s and 60s", param_hint="'--window'")
    threshold = option(parse_duration, long_transaction, "--long-transaction")
    if not 0 < threshold <= 86_400:
        raise typer.BadParameter(
            "must be more than 0 and at most 1d", param_hint="'--long-transaction'"
        )
    with state.queue() as q:
        report = q.doctor(
            window_seconds=window_seconds, long_transaction_seconds=threshold, cores=cores
        )
    if wants_json(ctx, json_out):
        output.emit_json(report.to_dict())
    else:
        state.out.print(_table(report))
        state.out.print(
            f"[{_STYLES[report.status]}]{report.status}[/] as role {escape(report.role)}, "
            f"over {report.window_seconds:g} s"
        )
    if report.status == "fail" or (strict and report.status == "warn"):
        raise typer.Exit(1)


def _table(report: HealthReport) -> Table:
    table = Table(box=None, header_style="bold", pad_edge=False, show_lines=False)
    table.add_column("check", no_wrap=True)
    table.add_column("status", no_wrap=True)
    table.add_column("finding and advice", overflow="fold")
    for check in report.checks:
        text = escape(check.finding)
        if check.advice and check.status != "ok":
            text += f"\n[dim]→ {escape(check.advice)}[/]"
        table.add_row(check.name, f"[{_STYLES[check.status]}]{check.status}[/]", text)
    return table
