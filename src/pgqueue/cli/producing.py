"""Producing: ``enqueue`` (one job) and ``enqueue-file`` (a JSON-lines file)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import IO, Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from ..core.errors import EnqueueOutcomeUnknown, InvalidJob, PgQueueError
from ..core.job_spec import JobSpec
from ..core.settings import Settings
from ..db.driver import DRIVER_ERRORS
from ..queue import Queue
from . import output
from .app import State, app, describe, state_of, wants_json
from .options import JsonFlag, option, parse_duration, parse_time, read_json

__all__ = ["parse_line"]

# The exit code of a command stopped by Ctrl-C (128 + SIGINT), as shells use
# and as Typer gives every other command.
INTERRUPTED = 130


@app.command("enqueue")
def enqueue_cmd(
    ctx: typer.Context,
    task: Annotated[str, typer.Argument(help="Task name (the handler's key).")],
    payload: Annotated[str, typer.Option(help="The job's payload: a JSON object.")] = "{}",
    queue: Annotated[str, typer.Option(help="Queue name.")] = "default",
    priority: Annotated[int, typer.Option(help="Higher runs first (-32767..32767).")] = 0,
    delay: Annotated[str | None, typer.Option(help="Run after this long: 30, 45s, 5m, 2h.")] = None,
    run_at: Annotated[
        str | None, typer.Option("--run-at", help="Run at this ISO 8601 time (with a zone).")
    ] = None,
    idempotency_key: Annotated[
        str | None,
        typer.Option("--idempotency-key", help="The job's key: no second job while it holds it."),
    ] = None,
    unique_scope: Annotated[
        str | None,
        typer.Option(
            "--unique-scope",
            help="While the job holds its key: queued, active (queued or running), always "
            "(default). Without --idempotency-key: key of task and payload.",
        ),
    ] = None,
    unique_period: Annotated[
        str | None,
        typer.Option(
            "--unique-period", help="At most one job per key in each such period: 1h, 1d."
        ),
    ] = None,
    on_conflict: Annotated[
        str | None,
        typer.Option(
            "--on-conflict",
            help="When another job holds the key and is still waiting: ignore (default), "
            "replace (its payload, metadata, priority) or extend (replace, and run after "
            "this delay: a debounce).",
        ),
    ] = None,
    concurrency_key: Annotated[
        str | None,
        typer.Option(
            "--concurrency-key", help="What the queue's per-key limits count by (a tenant...)."
        ),
    ] = None,
    max_attempts: Annotated[
        int | None,
        typer.Option("--max-attempts", help="Attempts before the job is dead (default: 5)."),
    ] = None,
    timeout: Annotated[str | None, typer.Option(help="Time limit of one attempt: 30s, 5m.")] = None,
    batch: Annotated[
        str | None, typer.Option("--batch", help="The id of an open batch the job joins.")
    ] = None,
    json_out: JsonFlag = False,
) -> None:
    """Add one job."""
    state = state_of(ctx)
    try:
        body = read_json(payload)
    except ValueError as exc:
        raise typer.BadParameter(f"not valid JSON: {exc}", param_hint="'--payload'") from None
    if not isinstance(body, dict):
        raise typer.BadParameter(
            f"must be a JSON object, got {type(body).__name__}", param_hint="'--payload'"
        )
    fields: dict[str, Any] = {
        "queue": queue,
        "priority": priority,
        "idempotency_key": idempotency_key,
        "unique_scope": unique_scope,
        "on_conflict": on_conflict,
        "concurrency_key": concurrency_key,
        "max_attempts": max_attempts,
        "batch": batch,
    }
    if unique_period is not None:
        fields["unique_period_seconds"] = option(parse_duration, unique_period, "--unique-period")
    if delay is not None:
        fields["delay"] = option(parse_duration, delay, "--delay")
    if run_at is not None:
        fields["run_at"] = option(parse_time, run_at, "--run-at")
    if timeout is not None:
        fields["timeout"] = option(parse_duration, timeout, "--timeout")
    with state.queue() as q:
        job = q.enqueue(task, body, **fields)
    if wants_json(ctx, json_out):
        output.emit_json({**job.to_dict(), "duplicate": job.duplicate, "debounced": job.debounced})
    elif job.debounced:
        when = job.run_at.astimezone().strftime("%Y-%m-%d %H:%M:%S %Z")
        state.out.print(
            f"job [bold]{job.id}[/] holds idempotency key {escape(repr(job.idempotency_key))}"
            f" and was waiting: {job.debounced} (its payload is this one; it runs at {when})"
        )
    elif job.duplicate:
        state.out.print(
            f"job [bold]{job.id}[/] already holds idempotency key "
            f"{escape(repr(job.idempotency_key))} (it is {output.state_text(job.state)});"
            " nothing new was written"
        )
    else:
        when = job.run_at.astimezone().strftime("%Y-%m-%d %H:%M:%S %Z")
        state.out.print(
            f"enqueued job [bold]{job.id}[/]: {escape(job.task)} on queue "
            f"{escape(job.queue)}, runs {'at ' + when if delay or run_at else 'now'}"
        )


# -- enqueue-file ---------------------------------------------------------------------------


class _Rejected(Exception):
    pass


def parse_line(text: str, settings: Settings) -> JobSpec:
    """One line of a jobs file as a validated job, or _Rejected saying why."""
    try:
        value = read_json(text)
    except json.JSONDecodeError as exc:
        raise _Rejected(f"not valid JSON: {exc.msg} (column {exc.colno})") from None
    except ValueError as exc:
        raise _Rejected(f"not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise _Rejected(f"must be a JSON object, got {type(value).__name__}")
    try:
        return JobSpec.from_fields(value, default_max_attempts=settings.default_max_attempts)
    except InvalidJob as exc:
        raise _Rejected(f"{exc.field}: {exc.problem}") from None


@dataclass
class _FileSummary:
    lines: int = 0
    created: int = 0
    existing: int = 0
    written_lines: int = 0
    rejected: list[tuple[int, str]] = field(default_factory=list)
    not_written: tuple[int, int] | None = None  # first and last line held back
    outcome_unknown: bool = False  # not_written's lines may have been written after all
    stopped_at: int | None = None  # the line after which nothing was read
    failure: str | None = None
    interrupted: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "lines": self.lines,
            "created": self.created,
            "existing": self.existing,
            "written_lines": self.written_lines,
            "rejected": [{"line": n, "reason": r} for n, r in self.rejected],
            "not_written": (
                None
                if self.not_written is None
                else {"first_line": self.not_written[0], "last_line": self.not_written[1]}
            ),
            "not_written_may_have_been": self.outcome_unknown,
            "unread_after_line": self.stopped_at,
            "error": self.failure,
            "interrupted": self.interrupted,
        }


class _Loader:
    """Reads a JSON-lines file into chunks of good jobs and writes each chunk
    in one transaction; keeps the summary of what happened to every line."""

    def __init__(
        self, settings: Settings, chunk_size: int, atomic: bool, progress: Progress
    ) -> None:
        self.settings = settings
        self.chunk_size = chunk_size
        self.atomic = atomic
        self.progress = progress
        self.summary = _FileSummary()
        self.pending: list[tuple[int, JobSpec]] = []

    def load(self, handle: IO[bytes], q: Queue, size: int | None) -> None:
        s = self.summary
        bar = self.progress.add_task("enqueue", total=size, info="")
        for number, raw in enumerate(handle, 1):
            self._take(number, raw.decode("utf-8", "replace").strip())
            s.lines = number
            written = s.created + s.existing
            info = f"{written} written, {len(s.rejected)} rejected"
            self.progress.update(bar, advance=len(raw), info=info)
            if not self.atomic and len(self.pending) >= self.chunk_size and not self._flush(q):
                s.stopped_at = number
                return
        if not (self.atomic and s.rejected):
            self._flush(q)
        self.progress.update(bar, info=f"{s.written_lines} written, {len(s.rejected)} rejected")

    def _take(self, number: int, text: str) -> None:
        if not text:
            return
        try:
            self.pending.append((number, parse_line(text, self.settings)))
        except _Rejected as exc:
            self.summary.rejected.append((number, str(exc)))

    def _flush(self, q: Queue) -> bool:
        """Write the pending lines; False (and why, in the summary) if that failed."""
        if not self.pending:
            return True
        with _commit_before_interrupt():
            try:
                results = q.enqueue_many([spec for _, spec in self.pending])
            except (PgQueueError, *DRIVER_ERRORS) as exc:
                self._hold_back(describe(exc)[0])
                self.summary.outcome_unknown = isinstance(exc, EnqueueOutcomeUnknown)
                return False
            self.summary.created += sum(r.created for r in results)
            self.summary.existing += sum(not r.created for r in results)
            self.summary.written_lines += len(results)
            self.pending.clear()
        return True

    def interrupt(self) -> None:
        """Ctrl-C: nothing more is read, nothing more is written."""
        self.summary.interrupted = True
        self.summary.stopped_at = self.summary.lines
        self._hold_back("interrupted (Ctrl-C)")

    def _hold_back(self, failure: str) -> None:
        self.summary.failure = failure
        if self.pending:
            self.summary.not_written = (self.pending[0][0], self.pending[-1][0])


@contextlib.contextmanager
def _commit_before_interrupt() -> Iterator[None]:
    """While a chunk is written, a first Ctrl-C waits for the write to end, so
    that the summary says for sure whether the chunk was written; a second
    Ctrl-C interrupts at once."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers belong to the main thread
        return
    received: list[int] = []

    def on_sigint(signum: int, frame: Any) -> None:
        received.append(signum)
        if len(received) > 1:
            raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if received:
        raise KeyboardInterrupt


@app.command("enqueue-file")
def enqueue_file_cmd(
    ctx: typer.Context,
    path: Annotated[
        str,
        typer.Argument(
            metavar="JOBS.JSONL",
            help="One JSON job per line ('-' reads stdin): "
            '{"task": ..., "payload": {...}, "queue", "priority", "delay", "run_at", '
            '"max_attempts", "timeout", "idempotency_key", "unique_scope", '
            '"unique_period_seconds", "on_conflict"}.',
        ),
    ],
    chunk_size: Annotated[
        int, typer.Option("--chunk-size", min=1, max=5000, help="Jobs written per transaction.")
    ] = 1000,
    atomic: Annotated[
        bool,
        typer.Option(
            "--atomic",
            help="All or nothing: write no job if any line is rejected, and "
            "write all in one transaction.",
        ),
    ] = False,
    json_out: JsonFlag = False,
) -> None:
    """Add the jobs of a JSON-lines file, in chunks; bad lines are reported, not written.

    Each chunk of good lines is one transaction: it is written whole or not at
    all. Exit code 1 when any line was rejected or a chunk failed to write;
    130 when interrupted (Ctrl-C), after the summary of what was written.
    """
    state = state_of(ctx)
    as_json = wants_json(ctx, json_out)
    settings = state.settings()
    try:
        handle: IO[bytes] = sys.stdin.buffer if path == "-" else open(path, "rb")  # noqa: SIM115
    except OSError as exc:
        raise typer.BadParameter(
            f"cannot open {path}: {exc.strerror}", param_hint="'JOBS.JSONL'"
        ) from None
    size = None if path == "-" else os.fstat(handle.fileno()).st_size
    progress = Progress(
        TextColumn("enqueue"),
        BarColumn(),
        TaskProgressColumn(),
        TextColumn("{task.fields[info]}"),
        TimeElapsedColumn(),
        console=state.err,
        transient=False,
        disable=as_json or not state.err.is_terminal,
    )
    loader = _Loader(settings, chunk_size, atomic, progress)
    try:
        with handle, state.queue(settings) as q, progress:
            loader.load(handle, q, size)
    except KeyboardInterrupt:
        loader.interrupt()
    _report_file(state, loader, as_json)
    s = loader.summary
    if s.interrupted:
        raise typer.Exit(INTERRUPTED)
    if s.failure or s.rejected:
        raise typer.Exit(1)


def _report_file(state: State, loader: _Loader, as_json: bool) -> None:
    s = loader.summary
    if as_json:
        output.emit_json({**s.to_dict(), "atomic": loader.atomic, "written": s.written_lines > 0})
    else:
        _print_file_summary(state.out, s, loader.atomic, len(loader.pending))
    if s.failure:
        output.error_line(s.failure, console=state.err)
    elif s.rejected:
        output.error_line(f"{len(s.rejected)} line(s) rejected", console=state.err)


def _print_file_summary(out: Console, s: _FileSummary, atomic: bool, held_back: int) -> None:
    out.print(
        f"read {s.lines} line(s): [green]{s.created} created[/], "
        f"{s.existing} already existed (idempotency key), "
        f"[{'red' if s.rejected else 'green'}]{len(s.rejected)} rejected[/]"
    )
    if s.rejected:
        table = Table("line", "reason", box=None, header_style="bold", pad_edge=False)
        for number, reason in s.rejected[:50]:
            table.add_row(str(number), escape(reason))
        out.print(table)
        if len(s.rejected) > 50:
            out.print(f"... and {len(s.rejected) - 50} more rejected line(s) (--json lists all)")
    if s.interrupted:
        held = f"{_unwritten(s.not_written, s.outcome_unknown)}; " if s.not_written else ""
        out.print(
            f"[bold red]interrupted[/] after line {s.stopped_at}: {held}lines after "
            f"{s.stopped_at} were not read; {s.written_lines} job(s) from earlier lines "
            "were written"
        )
    elif atomic and s.rejected:
        out.print(
            f"[bold]nothing was written[/] (--atomic): {held_back} good line(s) were held back"
        )
    elif s.not_written is not None:
        after = f"; lines after {s.stopped_at} were not read" if s.stopped_at else ""
        unwritten = _unwritten(s.not_written, s.outcome_unknown)
        out.print(
            f"[bold red]{unwritten}[/] ({escape(s.failure or '')})"
            f"{after}; {s.written_lines} job(s) from earlier lines were written"
        )
    elif s.rejected:
        out.print(
            f"every other line was written ({s.written_lines} job(s)); fix the rejected "
            "lines and enqueue them again"
        )


def _unwritten(lines: tuple[int, int], unknown: bool = False) -> str:
    if unknown:  # EnqueueOutcomeUnknown: their commit went out unanswered
        return f"lines {lines[0]}-{lines[1]} may have been written (the outcome is unknown)"
    return f"lines {lines[0]}-{lines[1]} were not written"
