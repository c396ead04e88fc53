"""Bulk actions: ``jobs bulk cancel|retry|delete`` on the jobs a filter matches.

Each first counts the jobs that match and asks before acting (``--yes``
skips the question, ``--dry-run`` only counts). Without any filter an
action needs ``--all``. The work is done by
``Queue.bulk`` in batches of 1,000 jobs (pgqueue.bulk).
"""

# No "from __future__ import annotations": Typer reads the options of the
# commands made in _command at run time, and their help names the action.

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Annotated

import typer
from rich.console import Console

from ..core.bulk import BulkAction, JobFilter
from ..core.errors import InvalidJob
from . import output
from .app import jobs_app, state_of, wants_json
from .options import JsonFlag, parse_duration, parse_time

__all__: list[str] = []

bulk_app = typer.Typer(
    help="Cancel, retry or delete every job a filter matches, in batches.", no_args_is_help=True
)
jobs_app.add_typer(bulk_app, name="bulk")

_DONE = {BulkAction.CANCEL: "cancelled", BulkAction.RETRY: "retried", BulkAction.DELETE: "deleted"}
_HELP = {
    BulkAction.CANCEL: "Cancel the queued and running jobs that match (running jobs lose their "
    "lease: their result is dropped).",
    BulkAction.RETRY: "Put the dead and cancelled jobs that match back in their queue (a job "
    "whose key another job holds now is left as it is).",
    BulkAction.DELETE: "Delete the finished jobs that match (succeeded, dead, cancelled; the "
    "outcome totals keep them).",
}
_CUTOFF = "A time (ISO 8601 with a zone) or an age (7d, 2h30m) by the database's clock."


def _cutoff(text: str | None, flag: str) -> datetime | timedelta | None:
    if text is None:
        return None
    for parse in (parse_duration, parse_time):
        try:
            value = parse(text)
        except typer.BadParameter:
            continue
        return value if isinstance(value, datetime) else timedelta(seconds=value)
    raise typer.BadParameter(
        f"{text!r} is neither an age (30s, 2h, 7d) nor an ISO 8601 time with a zone",
        param_hint=f"'{flag}'",
    )


def _command(action: BulkAction) -> Callable[..., None]:
    def command(
        ctx: typer.Context,
        queue: Annotated[str | None, typer.Option(help="Only this queue.")] = None,
        task: Annotated[str | None, typer.Option(help="Only this task.")] = None,
        state_filter: Annotated[
            str | None,
            typer.Option("--state", help=f"Only this state: {', '.join(action.states)}."),
        ] = None,
        enqueued_before: Annotated[
            str | None,
            typer.Option(
                "--enqueued-before", metavar="TIME|AGE", help=f"Enqueued before. {_CUTOFF}"
            ),
        ] = None,
        finished_before: Annotated[
            str | None,
            typer.Option(
                "--finished-before",
                metavar="TIME|AGE",
                help=f"Finished before (not for cancel). {_CUTOFF}",
            ),
        ] = None,
        error_contains: Annotated[
            str | None,
            typer.Option("--error-contains", metavar="TEXT", help="Last error contains this text."),
        ] = None,
        error_kind: Annotated[
            str | None,
            typer.Option(
                "--error-kind",
                metavar="TEXT",
                help="Last error of this kind (a dead-letter group's error: ids as <id>, "
                "numbers as <n>).",
            ),
        ] = None,
        ids: Annotated[
            list[int] | None,
            typer.Option("--id", metavar="ID", help="Only this job (repeat it: a selection)."),
        ] = None,
        every: Annotated[
            bool,
            typer.Option(
                "--all", help="Without any filter: act on every job the action applies to."
            ),
        ] = False,
        yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask first.")] = False,
        dry_run: Annotated[
            bool, typer.Option("--dry-run", help="Only count the jobs that match.")
        ] = False,
        json_out: JsonFlag = False,
    ) -> None:
        try:
            where = JobFilter(
                queue=queue,
                task=task,
                state=state_filter,
                enqueued_before=_cutoff(enqueued_before, "--enqueued-before"),
                finished_before=_cutoff(finished_before, "--finished-before"),
                error_contains=error_contains,
                error_kind=error_kind,
                ids=ids or None,
                all=every,
            )
            if not dry_run:
                where.check_scope(action)
        except InvalidJob as exc:
            raise typer.BadParameter(exc.problem, param_hint=_flag(exc.field)) from None
        _run(ctx, action, where, yes=yes, dry_run=dry_run, as_json=wants_json(ctx, json_out))

    command.__doc__ = _HELP[action]
    return command


def _flag(field: str) -> str:
    flags = {"state": "'--state'", "ids": "'--id'"}
    return flags.get(field, f"'--{field.replace('_', '-')}'")


def _run(
    ctx: typer.Context,
    action: BulkAction,
    where: JobFilter,
    *,
    yes: bool,
    dry_run: bool,
    as_json: bool,
) -> None:
    state = state_of(ctx)
    with state.queue() as q:
        try:
            matched = q.bulk(action, where, dry_run=True)
        except InvalidJob as exc:  # a filter that does not fit the action
            raise typer.BadParameter(exc.problem, param_hint=_flag(exc.field)) from None
        if dry_run or not matched:
            _report(state.out, action, matched, dry_run=True, as_json=as_json)
            return
        if not yes:
            typer.confirm(f"{action} {matched} job(s)?", abort=True, err=True)
        count = q.bulk(action, where)
    _report(state.out, action, count, dry_run=False, as_json=as_json)


def _report(out: Console, action: BulkAction, count: int, *, dry_run: bool, as_json: bool) -> None:
    if as_json:
        output.emit_json({"action": str(action), "dry_run": dry_run, "count": count})
    elif dry_run:
        out.print(f"{count} job(s) match; nothing was {_DONE[action]}")
    else:
        out.print(f"{_DONE[action]} {count} job(s)")


for _action in BulkAction:
    bulk_app.command(str(_action), help=_HELP[_action])(_command(_action))
