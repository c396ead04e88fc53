"""The two faces of the queue: ``Queue`` (blocking) and ``AsyncQueue`` (asyncio).

Both drive the same transition generators from ``transitions``; this module
only owns connections: a pool that checks connections on checkout (so a
database restart costs one failed check, not a failed call; the producers'
retried calls skip it: retrying.py), bounded waits, and running a transition
on the caller's own connection so that a job commits or rolls back with the
caller's data.
"""

from __future__ import annotations

from .async_queue import AsyncQueue
from .blocking import Queue

__all__ = ["AsyncQueue", "Queue"]
