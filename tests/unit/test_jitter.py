"""pgqueue's jitter does not follow the application's seed of the random
module, and draws nothing from it."""

from __future__ import annotations

import random

from pgqueue.core.settings import Settings
from pgqueue.core.transitions import claim
from pgqueue.db.deadlines import backoff_delay


def test_a_seeded_random_module_neither_fixes_the_jitter_nor_moves() -> None:
    delays = []
    for _ in range(3):
        random.seed(7)  # as an application might, alike in every process
        delays.append(backoff_delay(10))
        assert random.random() == random.Random(7).random(), "pgqueue drew from it"
    assert len(set(delays)) == 3


def test_a_claims_first_queue_does_not_follow_the_seed() -> None:
    firsts = set()
    for _ in range(40):
        random.seed(7)
        flow = claim(Settings(), queues=[f"q{i}" for i in range(8)], limit=3, worker="w")
        statement = next(flow)
        firsts.add(tuple(statement.params["queues"]))
    assert len(firsts) > 1
