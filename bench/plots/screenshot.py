"""The dashboard screenshot of the docs (Getting started): docs/img/dashboard.png.

    python -m bench.plots.screenshot [--out docs/img/dashboard.png]

Runs the dashboard test that fills a test database with jobs in every state,
three workers (alive, stalled, gone) and a paused queue, opens the overview
in a real headless Chromium at 1280x900 and checks its numbers against SQL;
the test then writes its screenshot to --out (PGQUEUE_SCREENSHOT_TO). So the
picture is the page as the tests see it, never drawn by hand.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

TEST = "tests/acceptance/test_dashboard_views.py::test_overview_numbers_are_the_databases"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("docs/img/dashboard.png"))
    args = parser.parse_args(argv)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PGQUEUE_SCREENSHOT_TO": str(args.out.resolve())}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", TEST], env=env, check=False)
    if done.returncode == 0:
        print(f"wrote {args.out}")
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
