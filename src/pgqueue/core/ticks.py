"""When a schedule ticks: a cron expression in a time zone, or an interval;
and which of the ticks since a schedule was due a scheduler enqueues (its
catch-up). Pure functions of the times given, in the manner of arq's cron.py:
the flows of ``schedules`` give them the database's clock.

The cron parser is cronsim: 5 fields, or 6 with the seconds first; ``L``,
``LW``, ``#``, names of days and months. Intervals count from 1970-01-01 UTC,
so ``every=3600`` ticks on the hour, whoever plans it. Every tick is a whole
second, and is given in UTC.

Daylight saving time, as cronsim (and Debian's cron) does it: a 5-field
expression with a fixed minute and hour (``30 2 * * *``) runs once per day
whatever the clock does. On the day a zone skips the hour, the tick runs at
the first minute that exists (03:00 in Europe/Berlin); on the day it repeats
the hour, it runs at the first 02:30 only. Every other expression (``*/15 * *
* *``, ``0 * * * *``, any 6-field one) follows the clock as it runs: a local
time that does not exist does not tick, and one that happens twice ticks
twice (tests/unit/test_scheduling.py shows each case).
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Literal, Protocol, get_args
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from .errors import InvalidSchedule

__all__ = [
    "CATCH_UP_MODES",
    "ON_TIME_SECONDS",
    "Cadence",
    "CatchUp",
    "Cron",
    "Every",
    "Plan",
    "cadence",
    "next_tick",
    "plan",
]

CatchUp = Literal["none", "last", "all"]
CATCH_UP_MODES: tuple[CatchUp, ...] = get_args(CatchUp)
# With catch_up="none", a tick this late still runs: a worker that restarts
# across a tick has not missed it.
ON_TIME_SECONDS = 60.0
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_SECOND = timedelta(seconds=1)


class Cadence(Protocol):
    """When a schedule ticks (every tick a whole second, in UTC)."""

    def ticks_after(self, moment: datetime) -> Iterator[datetime]:
        """The ticks strictly after ``moment``, in order."""
        ...

    def back(self, moment: datetime, count: int) -> datetime | None:
        """A time at or before the ``count``-th newest tick up to ``moment``
        (None: no tick before it), so that a catch-up walks a bounded stretch."""
        ...


@dataclass(frozen=True, slots=True)
class Cron:
    expr: str
    zone: ZoneInfo

    def ticks_after(self, moment: datetime) -> Iterator[datetime]:
        # Compared in UTC: two local times of one zone compare by wall clock.
        newest = moment.astimezone(UTC)
        # cronsim walks local wall-clock time; in a repeated hour that can
        # come back before a tick already given, and a skipped hour can map
        # two times onto its first minute: keep only ticks that move forward.
        for tick in _walk(self.expr, moment.astimezone(self.zone)):
            instant = tick.astimezone(UTC)
            if instant > newest:
                newest = instant
                yield instant

    def back(self, moment: datetime, count: int) -> datetime | None:
        start = moment.replace(microsecond=0) + _SECOND  # its first step back is `moment`
        steps = _walk(self.expr, start.astimezone(self.zone), reverse=True)
        found = list(itertools.islice(steps, count))
        return found[-1].astimezone(UTC) if found else None


@dataclass(frozen=True, slots=True)
class Every:
    seconds: int

    def ticks_after(self, moment: datetime) -> Iterator[datetime]:
        step = timedelta(seconds=self.seconds)
        tick = _EPOCH + ((moment - _EPOCH) // step + 1) * step
        while True:
            yield tick
            tick += step

    def back(self, moment: datetime, count: int) -> datetime | None:
        step = timedelta(seconds=self.seconds)
        return _EPOCH + ((moment - _EPOCH) // step - count + 1) * step


def cadence(name: str, cron: str | None, every_seconds: int | None, tz: str) -> Cadence:
    """The timing of a schedule, checked: raises InvalidSchedule."""
    if cron is None:
        if every_seconds is None:
            raise InvalidSchedule(name, "cron", "give cron or every")
        return Every(every_seconds)
    from cronsim import CronSimError

    zone = _zone(name, tz)
    try:
        _walk(cron, _EPOCH.astimezone(zone))  # parses, and says what is wrong
    except CronSimError as exc:
        raise InvalidSchedule(name, "cron", f"{exc} in {cron!r}") from None
    return Cron(cron, zone)


def _walk(expr: str, start: datetime, reverse: bool = False) -> Iterator[datetime]:
    """cronsim's ticks of ``expr`` from ``start``. cronsim is imported on
    first use: a worker without cron schedules never needs it (about 0.002 s
    of its start)."""
    from cronsim import CronSim

    return CronSim(expr, start, reverse=reverse)


def _zone(name: str, tz: str) -> ZoneInfo:
    try:
        return ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise InvalidSchedule(
            name, "tz", f"unknown time zone {tz!r} (an IANA name, e.g. Europe/Berlin or UTC)"
        ) from None


def next_tick(timing: Cadence, moment: datetime) -> datetime | None:
    return next(timing.ticks_after(moment), None)


@dataclass(frozen=True, slots=True)
class Plan:
    """What a scheduler does with a due schedule: enqueue ``ticks`` (oldest
    first), then wait for ``next_run_at`` (None: no tick ahead). Ticks from
    ``missed_from`` up to the first of ``ticks`` (or to now) are not enqueued,
    as ``catch_up`` says."""

    ticks: list[datetime]
    next_run_at: datetime | None
    missed_from: datetime | None
    catch_up: CatchUp


def plan(timing: Cadence, due: datetime, now: datetime, catch_up: CatchUp, limit: int) -> Plan:
    """Which ticks from ``due`` (the planned tick) to ``now`` to enqueue:
    with "none" the newest, if it is at most ON_TIME_SECONDS late; with
    "last" the newest; with "all" the newest ``limit``."""
    ticks = _recent(timing, due, now, limit if catch_up == "all" else 1)
    late = bool(ticks) and (now - ticks[-1]).total_seconds() > ON_TIME_SECONDS
    if catch_up == "none" and late:
        ticks = []
    missed = due if not ticks or ticks[0] > due else None
    return Plan(ticks, next_tick(timing, now), missed, catch_up)


def _recent(timing: Cadence, since: datetime, now: datetime, count: int) -> list[datetime]:
    """The newest ``count`` ticks from ``since`` to ``now``, oldest first."""
    bound = timing.back(now, count)
    start = since if bound is None or bound < since else bound
    ticks: deque[datetime] = deque(maxlen=count)
    for tick in timing.ticks_after(start - _SECOND):
        if tick > now:
            break
        ticks.append(tick)
    return list(ticks)
