"""The process supervisor behind ``pgqueue up`` and ``pgqueue worker
--processes N``, with small real child processes: restarts with a growing
delay, a second signal that does not wait, and a process group left behind."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from collections.abc import Iterator

import pytest

from pgqueue.processes import Child, ProcessSupervisor

pytestmark = [
    pytest.mark.acceptance,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="signals and /proc"),
]

# Children that say "ready" once their signal handling is in place: one stops
# on SIGTERM with exit code 0, one ignores it, and one stops but leaves a
# grandchild behind in its process group.
READY = "print('ready', flush=True); time.sleep(60)"
STEADY = f"import signal, sys, time; signal.signal(signal.SIGTERM, lambda *a: sys.exit(0)); {READY}"
STUBBORN = f"import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); {READY}"
PARENT = (
    "import signal, subprocess, sys, time; "
    "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
    f"signal.signal(signal.SIGTERM, lambda *a: sys.exit(0)); {READY}"
)


class Watch:
    """What the supervisor and its children said; sends this process a
    signal once some lines have all been said."""

    def __init__(self) -> None:
        self.said: list[str] = []
        self._triggers: list[tuple[tuple[str, ...], int]] = []
        self._lock = threading.Lock()  # children's lines come from reader threads

    def on(self, *needles: str, sig: int) -> None:
        self._triggers.append((needles, sig))

    def event(self, action: str, message: str, level: int) -> None:
        self._saw(message)

    def output(self, name: str, line: str) -> None:
        self._saw(f"{name}: {line}")

    def _saw(self, line: str) -> None:
        with self._lock:
            self.said.append(line)
            for needles, sig in list(self._triggers):
                if all(any(needle in s for s in self.said) for needle in needles):
                    self._triggers.remove((needles, sig))
                    # From another thread, as a terminal would; the handler runs in this one.
                    threading.Thread(target=os.kill, args=(os.getpid(), sig)).start()

    def supervise(self, *children: Child, stop_timeout: float) -> int:
        supervisor = ProcessSupervisor(
            children, stop_timeout=stop_timeout, on_event=self.event, on_output=self.output
        )
        return supervisor.run()


@pytest.fixture
def watch() -> Iterator[Watch]:
    yield Watch()


def _python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_a_dying_child_is_restarted_later_each_time_and_a_signal_stops_all(
    watch: Watch,
) -> None:
    flaky = Child("flaky", _python("import sys; sys.exit(3)"), restart=True)
    # While flaky waits 2 s to start again.
    watch.on("steady: ready", "restarting in 2 s", sig=signal.SIGTERM)
    code = watch.supervise(flaky, Child("steady", _python(STEADY)), stop_timeout=30)
    restarts = [line for line in watch.said if "restarting" in line]
    assert restarts == [
        "flaky exited with 3; restarting in 1 s",
        "flaky exited with 3; restarting in 2 s",
    ], watch.said
    assert watch.said[-1] == "steady exited with code 0", watch.said
    assert code == 0, watch.said


def test_a_second_signal_kills_at_once(watch: Watch) -> None:
    watch.on("stubborn: ready", sig=signal.SIGTERM)
    watch.on("got SIGTERM", sig=signal.SIGTERM)
    code = watch.supervise(Child("stubborn", _python(STUBBORN)), stop_timeout=600)
    assert watch.said[-1] == f"stubborn exited with code {-signal.SIGKILL}", watch.said
    assert not any("did not stop within" in line for line in watch.said), watch.said
    assert code == 1


def test_what_a_child_leaves_in_its_group_is_killed_and_the_stop_is_not_clean(
    watch: Watch,
) -> None:
    watch.on("parent: ready", sig=signal.SIGTERM)
    code = watch.supervise(Child("parent", _python(PARENT)), stop_timeout=3)
    assert "killing what is left of parent's process group" in watch.said, watch.said
    assert watch.said[-1] == "parent exited with code 0", watch.said
    assert code == 1


def test_without_an_event_sink_the_supervisor_logs(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="pgqueue.processes")
    supervisor = ProcessSupervisor([Child("quick", _python("pass"))], stop_timeout=5)
    assert supervisor.run() == 1  # a child that is not restarted ended by itself
    assert "quick exited with code 0; stopping everything" in caplog.text
