"""``python -m pgqueue``: the same as the ``pgqueue`` command."""

from __future__ import annotations

from .console import main

if __name__ == "__main__":
    main()
