"""The medians of `compare.sh`'s runs: what to read instead of its rows.

Why: one run pair on a shared VM can differ by more than the change being measured, and the
drift is the machine's (the engines, the same code in both trees, drift with the router).
So the summary gives, per number of conversations, each tree's median router CPU per turn and
the median over rounds of this tree's CPU over REF's, both as measured and divided by the
engines' CPU per turn of the same run (which takes out most of the machine's drift).

Reads the table rows `compare.sh` prints (`| round | tree | load | conversations | turns/s |
router CPU | engines CPU |`) on stdin; prints a markdown table.
"""

from __future__ import annotations

import statistics
import sys
from collections import defaultdict
from collections.abc import Iterable

THIS = "this"


def parse(lines: Iterable[str]) -> dict[tuple[str, int], dict[str, tuple[float, float]]]:
    """(round, conversations) -> tree -> (router CPU, engines CPU), from compare.sh's rows."""
    runs: dict[tuple[str, int], dict[str, tuple[float, float]]] = defaultdict(dict)
    for line in lines:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 7 or not cells[0].isdigit():
            continue
        rnd, tree, _, conversations, _, router, engines = cells
        runs[(rnd, int(conversations))][tree] = (float(router), float(engines))
    return runs


def summarize(runs: dict[tuple[str, int], dict[str, tuple[float, float]]]) -> list[str]:
    """The summary table's lines (rounds missing either tree are left out)."""
    by_level: dict[int, list[tuple[str, tuple[float, float], tuple[float, float]]]] = {}
    for (_, level), trees in sorted(runs.items()):
        other = [t for t in trees if t != THIS]
        if THIS in trees and len(other) == 1:
            by_level.setdefault(level, []).append((other[0], trees[other[0]], trees[THIS]))
    if not by_level:
        return ["no complete round"]
    ref = next(iter(by_level.values()))[0][0]
    out = [
        f"| conversations | rounds | {ref} router CPU ms/turn | this | this/{ref} "
        f"| this/{ref}, per engine CPU |",
        "|---|---|---|---|---|---|",
    ]
    for level, pairs in sorted(by_level.items()):
        base = statistics.median(b[0] for _, b, _ in pairs)
        mine = statistics.median(t[0] for _, _, t in pairs)
        ratio = statistics.median(t[0] / b[0] for _, b, t in pairs)
        norm = statistics.median((t[0] / t[1]) / (b[0] / b[1]) for _, b, t in pairs)
        out.append(
            f"| {level} | {len(pairs)} | {base:.2f} | {mine:.2f} | {ratio:.2f} | {norm:.2f} |"
        )
    return out


def main() -> None:
    print("\n".join(summarize(parse(sys.stdin))))


if __name__ == "__main__":
    main()
