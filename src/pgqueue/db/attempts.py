"""What the end of one attempt on a connection says about the call's writes.

A call's statements run through ``Attempt.bounded``, which follows the
statement in flight and the COMMIT; when the attempt fails, ``failed``
records in the call's key whether a write may have landed, and ``verdict``
(for a call that is not retried) picks the error that says so.
"""

from __future__ import annotations

from typing import Any, TypeVar

import psycopg

from .. import sql
from ..core.enqueue import LOSABLE, CallKey
from ..core.errors import DatabaseUnavailable, EnqueueOutcomeUnknown, OutcomeUnknown
from ..core.flows import Flow
from . import deadlines

__all__ = ["STANDBY_WAIT_CANCELLED", "WRITE_FREE", "Attempt", "first_line"]

T = TypeVar("T")

# The statements whose answer, lost, leaves nothing written: reads, and the
# reservation of ids (a lost id is a gap in the sequence, not a job).
WRITE_FREE = sql.READS | LOSABLE

STANDBY_WAIT_CANCELLED = (
    "its commit waited for a synchronous standby past the deadline and was "
    "cancelled: it committed on the server, but its replication is not confirmed"
)


class Attempt:
    """One attempt's statements, and what its end says about the call's
    writes. A statement that the server answered with an error committed
    nothing. A lost connection (or one cut at the deadline) leaves the
    outcome unknown if a write may have committed: in a transaction, from
    its COMMIT on; without one (each statement commits alone), while a
    statement that writes was out (``WRITE_FREE`` lists those that do not).
    A write answered after the cancel with a WARNING committed locally
    while it waited for a synchronous standby: its replication is not
    confirmed. Once the cancel went out no further statement is sent. With
    ``per_statement``, each statement (the COMMIT included) has the whole
    deadline of its own. ``committed_write``: without a transaction, a
    statement that writes was answered, so it committed: a call that fails
    after it (a bulk action's later batch) was partly made."""

    def __init__(
        self,
        what: str,
        call: CallKey | None,
        transaction: bool,
        cutoff: deadlines.Cutoff,
        *,
        per_statement: bool = False,
    ) -> None:
        self.what = what
        self.call = call
        self.transaction = transaction
        self.cutoff = cutoff
        self.per_statement = per_statement
        self.commit_sent = False
        self.in_flight: str | None = None  # the statement sent and not answered
        self.warned_write: str | None = None
        self.committed_write: str | None = None

    def committing(self) -> None:
        self.commit_sent = True
        if self.per_statement:
            self.cutoff.restart()

    def bounded(self, flow: Flow[T]) -> Flow[T]:
        """The flow, its statements watched (see the class's docstring)."""
        try:
            statement = next(flow)
            while True:
                if self.cutoff.cancelled:
                    raise psycopg.errors.QueryCanceled("cancelled at the call's deadline")
                if self.per_statement:
                    self.cutoff.restart()
                self.in_flight = statement.name
                try:
                    rows = yield statement
                except Exception as exc:  # the driver's KeyTaken: the statement failed
                    self.in_flight = None
                    statement = flow.throw(exc)
                    continue
                self.in_flight = None
                if statement.name not in WRITE_FREE:
                    if self.cutoff.warned:
                        self.warned_write = self.warned_write or statement.name
                    if not self.transaction:
                        self.committed_write = self.committed_write or statement.name
                statement = flow.send(rows)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]

    def failed(
        self, exc: Exception, conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]
    ) -> None:
        """Record in the call's key whether ``exc`` leaves its writes unknown."""
        if self.call is None or isinstance(exc, psycopg.errors.ReadOnlySqlTransaction):
            return
        answered = isinstance(exc, psycopg.Error) and exc.sqlstate is not None
        lost = conn.broken or self.cutoff.cut or not answered
        if self.transaction:
            unsure = lost and self.commit_sent
        else:
            writing = self.in_flight is not None and self.in_flight not in WRITE_FREE
            unsure = (lost and writing) or self.warned_write is not None
        self.call.unsure = self.call.unsure or unsure

    def verdict(self, exc: Exception, seconds: float) -> Exception:
        """What a call that is not retried raises for ``exc`` (after
        ``failed``): OutcomeUnknown if a write may have landed or an
        earlier one committed, DatabaseUnavailable if a statement was cut at
        the deadline, else ``exc`` itself."""
        unsure = self.call is not None and self.call.unsure
        # (A flow's own error, JobNotFound say, comes after writes that
        # changed nothing it would not have said.)
        partly = self.committed_write is not None and isinstance(exc, (psycopg.Error, OSError))
        if unsure or partly:
            if self.warned_write is not None:
                reason = STANDBY_WAIT_CANCELLED
            elif not unsure:
                reason = (
                    f"it failed after some of its writes had committed ({self.committed_write}): "
                    f"it was partly made: {first_line(exc)}"
                )
            elif self.cutoff.cancelled:
                reason = f"a write got no answer within {seconds:g} s (call_timeout_seconds)"
            else:
                reason = f"the connection was lost while a write was out: {first_line(exc)}"
            return self._unknown(reason)
        if self.cutoff.cancelled:
            return DatabaseUnavailable(
                f"{self.what}: a statement got no answer within {seconds:g} s "
                "(call_timeout_seconds) and was cancelled; nothing was written"
            )
        return exc

    def ended(self, result: T) -> T:
        """``result``, unless the commit was cut short waiting for a standby."""
        if self.call is None:
            return result
        if self.warned_write is not None or (self.transaction and self.cutoff.warned):
            self.call.unsure = True
            raise self._unknown(STANDBY_WAIT_CANCELLED)
        self.call.unsure = False
        return result

    def _unknown(self, reason: str) -> OutcomeUnknown:
        """An enqueue's (the call reserved ids) names its jobs."""
        assert self.call is not None
        if self.call.ids is None:
            return OutcomeUnknown(self.what, reason)
        return EnqueueOutcomeUnknown(self.what, self.call.ids, reason, self.call.key)


def first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
