"""Which commit a measurement was made at (one helper for the benchmarks and the simulator).

Why: sittings of different routers, and tables of different decision code, must never be read
as one, so every published result names the commit it ran from, `-dirty` when the tree had
uncommitted changes.
"""

from __future__ import annotations

import subprocess
from pathlib import Path


def source_revision(repo: Path) -> str | None:
    """`git describe --always --dirty` of `repo` (7-digit hashes); None outside a checkout."""
    try:
        out = subprocess.run(
            ["git", "-C", str(repo), "describe", "--always", "--dirty", "--abbrev=7"],
            capture_output=True, text=True, timeout=30, check=True,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None
