"""Where the benchmarks find the repository and keep what they measured.

Why one module: every family reads the same example manifest and writes its published results
into one folder, apart from the code (`e2e/bench/results/`); a second spelling of either path
would drift the day one of them moves.
"""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
RESULTS = REPO / "e2e" / "bench" / "results"
"""The published results of every family: the README and the docs link here."""
