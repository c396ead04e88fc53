"""What the command line prints: Rich for people, plain JSON with --json.

Consoles are made per invocation (not at import), so that colour and width
follow the stream the command actually writes to: colours go away when
output is piped, and NO_COLOR is honoured (Rich does both).
"""

from __future__ import annotations

import dataclasses
import io
import json
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from ..core.jobs import Job, JobState
from ..core.queue_controls import QueueControls
from ..core.redaction import Redaction
from ..core.stats import QueueStats

__all__ = [
    "STATE_STYLES",
    "Column",
    "age",
    "controls_text",
    "emit_json",
    "error_line",
    "fitted_table",
    "jobs_table",
    "queues_table",
    "shown",
    "stderr_console",
    "stdout_console",
]

STATE_STYLES = {
    JobState.WAITING: "magenta",
    JobState.QUEUED: "cyan",
    JobState.RUNNING: "yellow",
    JobState.SUCCEEDED: "green",
    JobState.DEAD: "bold red",
    JobState.CANCELLED: "dim",
}


def stdout_console() -> Console:
    return Console(file=sys.stdout, soft_wrap=False)


def stderr_console() -> Console:
    return Console(file=sys.stderr, soft_wrap=True)


def error_line(message: str, *, console: Console | None = None) -> None:
    """One red line on stderr: ``error: <message>`` (only the first line of it)."""
    first = message.strip().splitlines()[0] if message.strip() else "failed"
    (console or stderr_console()).print(f"[bold red]error:[/] {escape(first)}", highlight=False)


def emit_json(value: Any) -> None:
    """One JSON document on stdout, newline-terminated."""
    sys.stdout.write(json.dumps(value, default=_json_default, ensure_ascii=False) + "\n")
    sys.stdout.flush()


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def age(seconds: float | None) -> str:
    """A short human duration: 850ms, 12.5s, 3m04s, 2h05m, 3d04h."""
    if seconds is None:
        return "-"
    if seconds < 0:
        return "in " + age(-seconds)
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours}h{minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d{hours:02d}h"


def shown(job: Job, redaction: Redaction) -> Job:
    """The job as people may see it: its payload's redacted fields hidden
    (Settings.redacted_fields)."""
    payload = redaction.payload(job.task, job.payload)
    return job if payload is job.payload else dataclasses.replace(job, payload=payload)


def state_text(state: JobState) -> str:
    return f"[{STATE_STYLES[state]}]{state}[/]"


@dataclass(frozen=True, slots=True)
class Column:
    """A column of a ``fitted_table``. ``flexible``: cut with an ellipsis
    when the terminal is narrow (names, texts); otherwise the column always
    shows its whole values (ids, states, times). ``optional``: left out when
    even the cut table would not fit (the last optional column first)."""

    name: str
    justify: Literal["left", "right"] = "left"
    flexible: bool = False
    optional: bool = False


# A cut column keeps at least this many characters: a 2-character column
# says nothing.
MIN_CUT_WIDTH = 8
GAP = 2  # between two columns (box=None, padding 1 on each side)


def fitted_table(columns: Sequence[Column], rows: Sequence[Sequence[str]], width: int) -> Table:
    """A table of Rich-markup cells that fits ``width`` characters: the
    flexible columns share the room the others leave, each cut with an
    ellipsis (never below MIN_CUT_WIDTH), and optional columns are left out
    when that is not enough. One line per row: nothing wraps mid-word."""
    natural = [
        max([len(c.name)] + [Text.from_markup(row[i]).cell_len for row in rows])
        for i, c in enumerate(columns)
    ]
    kept = list(range(len(columns)))

    def least(indexes: list[int]) -> int:
        widths = (
            min(natural[i], MIN_CUT_WIDTH) if columns[i].flexible else natural[i] for i in indexes
        )
        return sum(widths) + GAP * (len(indexes) - 1)

    while least(kept) > width and any(columns[i].optional for i in kept):
        kept.remove(max(i for i in kept if columns[i].optional))
    flexible = [i for i in kept if columns[i].flexible]
    room = width - sum(natural[i] for i in kept if i not in flexible) - GAP * (len(kept) - 1)
    widths = _shared(room, [natural[i] for i in flexible])
    table = Table(box=None, header_style="bold", pad_edge=False)
    for i in kept:
        cut = widths[flexible.index(i)] if i in flexible else None
        table.add_column(
            columns[i].name,
            justify=columns[i].justify,
            no_wrap=True,
            overflow="ellipsis",
            width=cut,
            min_width=None if cut is not None else natural[i],
        )
    for row in rows:
        table.add_row(*(row[i] for i in kept))
    return table


def _shared(room: int, wanted: list[int]) -> list[int]:
    """Widths for columns that want ``wanted``, within ``room``: the
    narrowest get all they want, the rest share what is left evenly (never
    below MIN_CUT_WIDTH or above what they want)."""
    widths = [0] * len(wanted)
    left = list(range(len(wanted)))
    for i in sorted(left, key=lambda i: wanted[i]):
        share = room // len(left)
        widths[i] = max(min(wanted[i], share), min(wanted[i], MIN_CUT_WIDTH))
        room -= widths[i]
        left.remove(i)
    return widths


_JOB_COLUMNS = (
    Column("id", "right"),
    Column("queue", flexible=True),
    Column("task", flexible=True),
    Column("state"),
    Column("tries", "right"),
    Column("prio", "right", optional=True),
    Column("enqueued", "right", optional=True),
    Column("run at", "right"),
    Column("last error", flexible=True, optional=True),
)


def jobs_table(jobs: Iterable[Job], now: datetime, width: int) -> Table:
    """The jobs, one line each, fitted to a terminal ``width`` wide."""
    rows = []
    for job in jobs:
        run_in = (job.run_at - now).total_seconds()
        rows.append(
            (
                str(job.id),
                escape(job.queue),
                escape(job.task),
                state_text(job.state),
                f"{job.attempts}/{job.max_attempts}",
                str(job.priority),
                age((now - job.enqueued_at).total_seconds()) + " ago",
                ("in " + age(run_in))
                if job.state is JobState.QUEUED and run_in > 0
                else "now"
                if job.state is JobState.QUEUED
                else "-",
                escape((job.last_error or "").splitlines()[0][:80]) if job.last_error else "",
            )
        )
    return fitted_table(_JOB_COLUMNS, rows, width)


QUEUE_COLUMNS = (
    "queued",
    "scheduled",
    "running",
    "waiting",
    "succeeded",
    "failed",
    "dead",
    "cancelled",
)
# Short headers, so that the table fits 80 columns when piped.
_HEADERS = ("queued", "sched", "running", "wait", "ok", "failed", "dead", "cancel")
QUEUES_CAPTION = (
    "queued (runnable now), sched (later), running, wait (for their dependencies): now.  "
    "ok, failed (attempts), dead, "
    "cancel: totals.  oldest: wait of the oldest runnable job.  1m: ok or dead in the "
    "last minute.  (paused, limits): the queue's controls."
)
RATE_HEADER = "done/s"
# The columns a narrow table keeps longest, first to last (the queue's name
# is always kept, whole).
_KEPT_LONGEST = ("queued", "running", RATE_HEADER, "dead", "oldest", "1m", "failed", "sched")


def queues_table(
    rows: Mapping[str, QueueStats],
    total: QueueStats,
    title: str | None = None,
    *,
    rates: Mapping[str, float] | None = None,
    width: int | None = None,
) -> Table:
    """The per-queue table of ``queues`` and ``top``, with a total row. With
    ``rates`` (jobs done per second by queue; a queue not in it: not known
    yet), a done/s column. With ``width``, the columns least needed go until
    the table fits, so that queue names are never squeezed."""
    lines: list[tuple[str, list[str], str | None]] = [
        (escape(name) + _controls_note(row.controls), _queue_cells(row), None)
        for name, row in rows.items()
    ]
    lines.append(("total", _queue_cells(total), "bold"))
    headers = [*_HEADERS, "oldest", "1m"]
    if rates is not None:
        headers.append(RATE_HEADER)
        for (_, values, _), rate in zip(
            lines, [*(rates.get(name) for name in rows), _sum(rates, rows)], strict=True
        ):
            values.append("-" if rate is None else f"{rate:.1f}")
    shown = list(headers)
    while True:
        table = _queues_grid(lines, headers, shown, title)
        if width is None or _natural_width(table) <= width or not shown:
            return table
        shown.remove(max(shown, key=_drop_order))


def _controls_note(controls: QueueControls | None) -> str:
    if controls is None or not (controls.paused or controls.limited):
        return ""
    return f" [dim]({escape(controls_text(controls))})[/]"


def _sum(rates: Mapping[str, float], names: Iterable[str]) -> float | None:
    """All queues' rate, when each is known."""
    known = [rates.get(name) for name in names]
    return None if None in known else sum(rate or 0.0 for rate in known)


def _drop_order(header: str) -> int:
    """Which column a narrow table drops first: the highest number."""
    return _KEPT_LONGEST.index(header) if header in _KEPT_LONGEST else len(_KEPT_LONGEST)


def _queues_grid(
    lines: list[tuple[str, list[str], str | None]],
    headers: list[str],
    shown: list[str],
    title: str | None,
) -> Table:
    hidden = len(headers) - len(shown)
    table = Table(
        box=None,
        header_style="bold",
        pad_edge=False,
        title=title,
        title_justify="left",
        title_style="bold",
        caption=f"({hidden} more columns on a wider terminal)" if hidden else QUEUES_CAPTION,
        caption_justify="left",
        caption_style="dim",
    )
    table.add_column("queue", overflow="fold")
    picks = [headers.index(header) for header in shown]
    for header in shown:
        table.add_column(header, justify="right", no_wrap=True)
    for label, values, style in lines:
        table.add_row(label, *(values[i] for i in picks), style=style)
    return table


def _natural_width(table: Table) -> int:
    """The columns a table takes when nothing wraps."""
    return Console(width=10_000, file=io.StringIO()).measure(table).maximum


def controls_text(controls: QueueControls) -> str:
    """A queue's pause and limits in a few words: "paused, 5 running (2 per
    key), 100 starts per 1m00s"."""
    c = controls
    words = ["paused" if c.paused else "running"]
    if c.concurrency_limit or c.concurrency_limit_per_key:
        words.append(_pair(c.concurrency_limit, c.concurrency_limit_per_key, "running"))
    if c.rate_limit or c.rate_limit_per_key:
        per = age(c.rate_period_seconds)
        words.append(_pair(c.rate_limit, c.rate_limit_per_key, "starts") + f" per {per}")
    if c.fair:
        words.append("fair across keys")
    if c.max_start_lag_seconds is not None:
        words.append(f"objective: start within {age(c.max_start_lag_seconds)}")
    return ", ".join(words)


def _pair(limit: int | None, per_key: int | None, what: str) -> str:
    """ "at most 5 running (2 per key)", or for a per-key limit alone "at most 2
    running per key"."""
    if limit is None:
        return f"at most {per_key} {what} per key"
    return f"at most {limit} {what}" + (f" ({per_key} per key)" if per_key else "")


def _queue_cells(row: QueueStats) -> list[str]:
    return [
        *(_count(column, getattr(row, column)) for column in QUEUE_COLUMNS),
        age(row.oldest_runnable_seconds) if row.queued else "-",
        str(row.finished_last_minute),
    ]


def _count(name: str, value: int) -> str:
    if value and name == "dead":
        return f"[red]{value}[/]"
    if value and name == "running":
        return f"[yellow]{value}[/]"
    return str(value)
