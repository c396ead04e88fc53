"""Every dashboard view has its two screenshots (a laptop's 1440x900 and a
phone's 390x844) committed under docs/img/dashboard/ and shown in
docs/api.md. They are made by ``python -m bench.plots.screenshots``, not
here: this only checks that none is missing, stale in name, or too big."""

from __future__ import annotations

import re
import struct
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "src/pgqueue/api/dashboard/index.html"
SHOTS = ROOT / "docs/img/dashboard"
DOC = ROOT / "docs/api.md"
SIZES = {"desktop": (1440, 900), "phone": (390, 844)}
MAX_BYTES = 200 * 1024


def views() -> list[str]:
    nav = PAGE.read_text().split('<nav id="tabs"', 1)[1].split("</nav>", 1)[0]
    return re.findall(r'data-view="([a-z]+)"', nav)


def png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n", f"{path.name} is not a PNG"
    width, height = struct.unpack(">II", head[16:24])
    return width, height


def test_every_view_has_both_screenshots_on_disk_and_in_the_docs() -> None:
    found = views()
    assert {"overview", "jobs", "dead", "workers", "schedules", "workflows"} <= set(found)
    doc = DOC.read_text()
    for view in found:
        for size, (width, height) in SIZES.items():
            path = SHOTS / f"{view}-{size}.png"
            assert path.is_file(), f"missing {path.relative_to(ROOT)}"
            assert png_size(path) == (width, height), path.name
            assert path.stat().st_size <= MAX_BYTES, f"{path.name} is over 200 KB"
            assert f"img/dashboard/{view}-{size}.png" in doc, (
                f"docs/api.md does not show {path.name}"
            )


def test_no_screenshot_is_left_of_a_view_that_is_gone() -> None:
    expected = {f"{view}-{size}.png" for view in views() for size in SIZES}
    assert {p.name for p in SHOTS.glob("*.png")} == expected
