"""What a handler may ask for besides returning a result or failing.

A handler, sync or async, raises one of these and the worker makes it the
attempt's outcome::

    raise Snooze(30)            run again in 30 s (database clock); the attempt
                                is given back, the job's ``snoozes`` goes up;
                                past the task's max_snoozes the job is dead
    raise CancelJob("reason")   end the job now as cancelled, the reason in
                                last_error; no retry

They are exceptions rather than return values so that a handler's return
value is always its result, and so that code deep inside a handler can ask
too. They are not ``PgQueueError``s: pgqueue does not raise them, handlers do.
"""

from __future__ import annotations

from datetime import timedelta

from .jobs import MAX_DELAY_SECONDS
from .rules import Seconds

__all__ = ["CancelJob", "Snooze", "snooze_seconds"]

_SNOOZE = Seconds(0.0, MAX_DELAY_SECONDS)


def snooze_seconds(value: float | timedelta) -> float:
    """A snooze's delay checked (0 up to ten years), as seconds; InvalidJob if not."""
    return _SNOOZE.check("Snooze seconds", value)


class Snooze(Exception):
    """Run this job again after ``seconds`` (a number or a timedelta) without
    counting the attempt. Raises InvalidJob at once for a delay out of range."""

    def __init__(self, seconds: float | timedelta) -> None:
        self.seconds = snooze_seconds(seconds)
        super().__init__(f"snooze for {self.seconds:g} s")


class CancelJob(Exception):
    """End this job now as cancelled, with ``reason`` as its last_error: no
    retry, whatever attempts are left."""

    def __init__(self, reason: str = "cancelled by its handler") -> None:
        self.reason = str(reason)
        super().__init__(self.reason)
