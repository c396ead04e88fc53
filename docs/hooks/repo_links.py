"""MkDocs hook: links from a page to the repository's own files.

The pages are read on GitHub as well as on the site, so they link to files
outside docs/ (`../results/benchmark.png`, `../bench/README.md`). MkDocs
would report each as a broken link. Here an image outside docs/ is copied
into the site under `repo/` and its link pointed there; a link to any other
repository file becomes its path in code, since the site does not carry the
sources. A link to a file that does not exist is a warning, which fails the
strict build like any other broken link.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path, PurePosixPath
from typing import Any

from mkdocs.structure.files import File, Files

log = logging.getLogger("mkdocs.hooks.repo_links")

# [text](target) and ![alt](target); a target with a scheme or a bare anchor is not ours.
LINK = re.compile(r"(?P<bang>!?)\[(?P<text>[^\]]*)\]\((?P<target>[^)\s#]+)(?P<anchor>#[^)\s]*)?\)")
IMAGE_SUFFIXES = {".png", ".svg", ".jpg", ".jpeg", ".gif"}
SITE_FOLDER = "repo"


def _outside(config: Any, page_uri: str, target: str) -> Path | None:
    """The repository path a relative link of a page names, when outside docs/."""
    if ":" in target or target.startswith("/"):
        return None
    docs = Path(config["docs_dir"]).resolve()
    path = (docs / PurePosixPath(page_uri).parent / target).resolve()
    return None if path.is_relative_to(docs) else path


def _root(config: Any) -> Path:
    return Path(config["config_file_path"]).resolve().parent


def on_files(files: Files, config: Any) -> Files:
    """Carry into the site every image outside docs/ that a page shows."""
    wanted: set[Path] = set()
    for page in files.documentation_pages():
        for link in LINK.finditer(Path(page.abs_src_path or "").read_text(encoding="utf-8")):
            path = _outside(config, page.src_uri, link["target"])
            if link["bang"] and path is not None and path.is_file():
                wanted.add(path)
    root = _root(config)
    for path in sorted(wanted):
        uri = f"{SITE_FOLDER}/{path.relative_to(root).as_posix()}"
        files.append(File.generated(config, uri, abs_src_path=str(path)))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    root = _root(config)

    def replace(link: re.Match[str]) -> str:
        path = _outside(config, page.file.src_uri, link["target"])
        if path is None:
            return link[0]
        if not path.exists() or not path.is_relative_to(root):
            log.warning(
                "%s: link to %s, which does not exist in the repository", page.file.src_uri, path
            )
            return link[0]
        relative = path.relative_to(root).as_posix()
        if link["bang"] and path.suffix.lower() in IMAGE_SUFFIXES:
            depth = len(PurePosixPath(page.file.src_uri).parent.parts)
            return f"![{link['text']}]({'../' * depth}{SITE_FOLDER}/{relative})"
        text = link["text"].strip("`")
        return f"`{relative}`" if text in (relative, path.name, "") else f"{text} (`{relative}`)"

    return LINK.sub(replace, markdown)
