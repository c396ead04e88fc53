"""The deadline watchdog (pgqueue.deadlines): timers fire at their time,
withdrawn ones never, and withdrawn entries do not pile up in its heap."""

from __future__ import annotations

import threading
import time

from pgqueue.db.deadlines import _Watchdog


def test_a_timer_fires_and_a_withdrawn_one_does_not() -> None:
    watchdog = _Watchdog()
    fired: list[str] = []
    done = threading.Event()
    kept = watchdog.at(time.monotonic() + 0.05, lambda: (fired.append("kept"), done.set()))
    dropped = watchdog.at(time.monotonic() + 0.01, lambda: fired.append("dropped"))
    watchdog.withdraw(dropped)
    assert done.wait(5)
    time.sleep(0.05)
    assert fired == ["kept"]
    watchdog.withdraw(kept)  # after it fired: nothing to forget


def test_withdrawn_timers_are_dropped_from_the_heap_before_their_time() -> None:
    watchdog = _Watchdog()
    far = time.monotonic() + 3600
    live = [watchdog.at(far, lambda: None) for _ in range(10)]
    for _ in range(1000):  # a producer's calls: each ends long before its deadline
        watchdog.withdraw(watchdog.at(far, lambda: None))
    assert len(watchdog._heap) <= 2 * len(live) + 1
    assert all(timer.callback is not None for timer in live)
