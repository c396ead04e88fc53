"""What every chart shares: the footer naming the machine and the run, and
saving."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from bench.record import ResultRecord

__all__ = ["finish", "footer", "plt", "save"]


def footer(fig: Any, record: ResultRecord) -> None:
    m, s = record.machine, record.server
    fig.text(
        0.01,
        0.01,
        f"{m.get('cores')} cores {m.get('cpu', '')}, PostgreSQL {s.get('server_version')} "
        f"(fsync {s.get('fsync')}, synchronous_commit {s.get('synchronous_commit')}); "
        f"shared machine, medians with min-max; {record.created_at[:10]}, "
        f"commit {record.git_commit}",
        fontsize=7,
        color="0.4",
    )


def save(fig: Any, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"wrote {path}")
    return path


def finish(
    fig: Any, record: ResultRecord, path: Path, *, title: str = "", bottom: float = 0.04
) -> Path:
    """Title, footer, layout (``bottom`` of the figure left for the footer)
    and save."""
    if title:
        fig.suptitle(title)
    footer(fig, record)
    fig.tight_layout(rect=(0, bottom, 1, 1))
    return save(fig, path)
