"""The documentation's code runs as printed: the quick start of
docs/getting-started.md is examples/quickstart.py word for word, and every
Python block of the README, the getting-started page, the concepts page and
the how-tos runs as a script."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

ROOT = Path(__file__).resolve().parents[3]
# The pages whose blocks are whole programs (the reference pages hold fragments).
PAGES = [
    ROOT / "README.md",
    ROOT / "docs" / "getting-started.md",
    ROOT / "docs" / "concepts.md",
    *sorted((ROOT / "docs" / "howto").glob("*.md")),
]


def python_blocks(page: Path) -> list[str]:
    text = page.read_text(encoding="utf-8")
    return re.findall(r"^```python\n(.*?)^```$", text, flags=re.DOTALL | re.MULTILINE)


BLOCKS = [
    pytest.param(block, id=f"{page.relative_to(ROOT)}:{block.splitlines()[0][:40]}")
    for page in PAGES
    for block in python_blocks(page)
]


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


def test_the_quick_start_is_the_example_file_word_for_word() -> None:
    example = (ROOT / "examples" / "quickstart.py").read_text(encoding="utf-8")
    body = example.split('"""\n\n', 1)[1]  # after the module docstring
    assert body in python_blocks(ROOT / "docs" / "getting-started.md")


def test_quickstart_runs_and_its_job_succeeds(db_url: str, sql: psycopg.Connection) -> None:
    done = run_script(ROOT / "examples" / "quickstart.py", db_url)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "{'sent': True}"
    counts = dict(sql.execute("SELECT task, count(*) FROM pgqueue_jobs GROUP BY task").fetchall())
    assert counts == {"send_email": 1, "resize": 1000, "send_receipt": 1}
    assert sql.execute("SELECT count(*) FROM orders").fetchone()[0] == 1


def test_the_readme_example_runs_its_job(db_url: str, tmp_path: Path) -> None:
    [example] = python_blocks(ROOT / "README.md")
    script = tmp_path / "example.py"
    script.write_text(example, encoding="utf-8")
    done = run_script(script, db_url)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "{'sent': True}"


@pytest.mark.parametrize("block", BLOCKS)
def test_every_python_block_of_the_docs_runs_as_printed(
    block: str, db_url: str, tmp_path: Path
) -> None:
    script = tmp_path / "block.py"
    script.write_text(block, encoding="utf-8")
    done = run_script(script, db_url)
    assert done.returncode == 0, done.stderr[-2000:]


def test_the_pages_have_python_blocks() -> None:
    assert all(python_blocks(page) for page in PAGES[:2])
    assert len(BLOCKS) >= 10
