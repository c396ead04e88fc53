"""Where pgqueue's jitter comes from: retries' backoff, the maintenance
chores' spread, a claim's first queue."""

from __future__ import annotations

import random

__all__ = ["chance"]

# The OS's randomness, not the random module's generator: an application
# that seeds that one alike in every process (or a fork that copies it)
# would give every worker the same jitter, and pgqueue's draws would move
# the application's own sequence.
chance = random.SystemRandom()
