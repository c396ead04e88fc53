"""The README's code runs as printed: the quick start is examples/quickstart.py
word for word, and every Python block of the README runs as a script."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")
PYTHON_BLOCKS = re.findall(r"^```python\n(.*?)^```$", README, flags=re.DOTALL | re.MULTILINE)


def run_script(path: Path, db_url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(path)],
        env={"DATABASE_URL": db_url, "PATH": "/usr/bin:/bin"},
        cwd=path.parent,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_readme_quick_start_is_the_example_file_word_for_word() -> None:
    example = (ROOT / "examples" / "quickstart.py").read_text(encoding="utf-8")
    body = example.split('"""\n\n', 1)[1]  # after the module docstring
    assert body in PYTHON_BLOCKS


def test_quickstart_runs_and_its_job_succeeds(db_url: str, sql: psycopg.Connection) -> None:
    done = run_script(ROOT / "examples" / "quickstart.py", db_url)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "{'sent': True}"
    counts = dict(sql.execute("SELECT task, count(*) FROM pgqueue_jobs GROUP BY task").fetchall())
    assert counts == {"send_email": 1, "resize": 1000, "send_receipt": 1}
    assert sql.execute("SELECT count(*) FROM orders").fetchone()[0] == 1


@pytest.mark.parametrize("block", PYTHON_BLOCKS, ids=lambda b: b.splitlines()[0][:40])
def test_every_python_block_of_the_readme_runs_as_printed(
    block: str, db_url: str, tmp_path: Path
) -> None:
    script = tmp_path / "block.py"
    script.write_text(block, encoding="utf-8")
    done = run_script(script, db_url)
    assert done.returncode == 0, done.stderr[-2000:]


def test_the_readme_has_python_blocks() -> None:
    assert len(PYTHON_BLOCKS) >= 2
