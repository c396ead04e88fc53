"""The process supervisor behind ``pgqueue up`` and ``pgqueue worker
--processes N``, with small real child processes: restarts with a growing
delay, a second signal that does not wait, and a process group left behind."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

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


# A supervisor in a process of its own (this one runs threads, and a
# supervisor with other threads never forks): its child's first start is a
# fork running ``first``, which records how it runs and dies; the restart
# runs argv, which records that and waits for the stop.
FORKING = """
import os, signal, sys
from pgqueue.processes import Child, ProcessSupervisor

out = sys.argv[1]
supervisor = os.getpid()

def first() -> int:
    default = signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    with open(out, "a") as f:
        f.write(f"fork {os.getppid() == supervisor} {os.getpgid(0) == os.getpid()} {default}\\n")
    return 3

again = f"import time; open({out!r}, 'a').write('argv\\\\n'); time.sleep(60)"
child = Child("w", [sys.executable, "-c", again], restart=True, fork=first)
sys.exit(ProcessSupervisor([child], stop_timeout=10).run())
"""


def test_a_first_start_is_a_fork_and_a_restart_runs_argv(tmp_path: Path) -> None:
    out = tmp_path / "starts"
    out.touch()
    proc = subprocess.Popen([sys.executable, "-c", FORKING, str(out)])
    try:
        deadline = time.monotonic() + 30
        while out.read_text().count("\n") < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        # The fork: the supervisor's child, leading its own group, with the
        # default SIGTERM (not the supervisor's handler); then, restarted, argv.
        assert out.read_text().splitlines() == ["fork True True True", "argv"]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


ABORTED = """
import os, sys, time
from pgqueue.processes import Child, ProcessSupervisor

def work() -> int:
    print(os.getpid(), flush=True)
    time.sleep(60)
    return 0

def check() -> None:
    time.sleep(0.5)
    raise RuntimeError("the handlers cannot be loaded")

child = Child("w", [sys.executable, "-c", "pass"], restart=True, fork=work)
ProcessSupervisor([child], stop_timeout=10).run(after_start=check)
"""


def test_a_failing_check_after_the_start_stops_the_children_and_is_raised() -> None:
    done = subprocess.run(
        [sys.executable, "-c", ABORTED], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1
    assert "RuntimeError: the handlers cannot be loaded" in done.stderr
    pid = int(done.stdout.split()[0])  # the forked child said its pid
    assert not Path(f"/proc/{pid}").exists()
