"""The demo handlers, under their older import path ``examples.tasks:HANDLERS``.

They live in ``pgqueue.demo`` (so that ``pgqueue up`` works from any folder);
read that module for how a handler is written.
"""

from __future__ import annotations

from pgqueue.demo import HANDLERS

__all__ = ["HANDLERS"]
