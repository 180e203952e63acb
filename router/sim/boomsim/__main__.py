"""`python -m boomsim` (`make sim`): the calibration table, the sweeps, the plot, the speed.

make sim                      # calibration, every sweep at full size over 3 seeds, the
                              # sensitivity table, plot, and docs/simulation.md's tables
                              # (stamped: `publish.py`)
make sim ARGS=--quick         # the same, smaller (seconds); written to a temporary folder
make sim ARGS="speed --turns 1000000"
make sim ARGS=fit             # re-derive the GPU profile's fitted constants
make sim ARGS=cpu             # the fair benchmark's CPU runs predicted (`cpu.py`)
make sim ARGS="plan --manifest examples/qwen3-32b-adaptive.yaml --trace router.log"
                              # a deployment on a recorded workload (`plan.py`)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from boomsim import calibrate, cpu, plan, plot, publish, sensitivity, speed, sweep

from bench.harness.repo import RESULTS as BENCH_RESULTS

RESULTS = Path(__file__).resolve().parent.parent / "results"
SWEEPS = (
    ("ratios", "ratio", sweep.ratios, "P:D ratio (agentic sessions, {spd} per decoder arriving "
     "at {rate}/s per decoder)"),
    ("sessions", "sessions", sweep.sessions, "Sessions (4P8D, N agentic sessions arriving "
     f"within {sweep.SESSION_WINDOW_S:.0f} s)"),
    ("kv", "kv_blocks", sweep.kv, "KV per role (1P2D, both roles at N blocks of 16 tokens; "
     "226,000 is the H200 default)"),
    ("suffix", "suffix", sweep.suffix, "Suffix length (1P2D, vLLM's multi-turn shape with user "
     "turns of s/2..s tokens, 32 clients, {sc} conversations)"),
)  # fmt: skip
"""Each sweep: its results key, the swept field, the function, the heading it is published
under."""


def main(argv: list[str] | None = None) -> None:
    args_in = sys.argv[1:] if argv is None else argv
    if args_in[:1] == ["plan"]:
        plan.main(args_in[1:])
        return
    ap = argparse.ArgumentParser(prog="boomsim", description=__doc__.splitlines()[0])
    ap.add_argument(
        "what",
        nargs="?",
        default="all",
        choices=("all", "calibrate", "cpu", "sweep", "speed", "fit"),
    )
    ap.add_argument("--quick", action="store_true", help="smaller sweeps")
    ap.add_argument("--turns", type=int, default=100_000, help="speed: turns to simulate")
    ap.add_argument("--out", type=Path, help="where results.json and the plot go")
    args = ap.parse_args(args_in)
    out = args.out or (Path(tempfile.gettempdir()) / "boomsim-quick" if args.quick else RESULTS)
    results: dict[str, Any] = {}
    if args.what == "fit":
        print(calibrate.fit_gpu())
        return
    if args.what == "speed":
        print(json.dumps(speed.measure(args.turns), indent=1))
        return
    published: dict[str, str] = {}
    if args.what in ("all", "calibrate"):
        rows = calibrate.gpu_table()
        results["calibration"] = rows
        published["calibration"] = calibrate.gpu_markdown(rows)
        print("Seeds' 1P1D table (Qwen3-32B, P's prefix cache off), mean TTFT:\n")
        print(published["calibration"] + "\n")
    if args.what in ("all", "cpu"):
        start = time.process_time()
        cpu_rows = cpu.table(cpu.load(BENCH_RESULTS / "production"))
        results["cpu"] = [dataclasses.asdict(r) for r in cpu_rows]
        published["cpu"] = cpu.markdown(cpu_rows)
        took = time.process_time() - start
        print(f"The fair benchmark's CPU runs, predicted / measured ({took:.1f} s CPU):\n")
        print(published["cpu"] + "\n")
    if args.what in ("all", "sweep"):
        sizes = sweep.QUICK if args.quick else sweep.FULL
        sections = []
        for name, key, fn, heading in SWEEPS:
            start = time.process_time()
            rows = sweep.over_seeds(fn, sizes, key)
            results[name] = rows
            table = sweep.markdown(rows, key)
            title = heading.format(
                spd=sizes.sessions_per_decoder,
                rate=sizes.rate_per_decoder,
                sc=sizes.suffix_conversations,
            )
            sections.append(f"### {title}\n\n{table}")
            print(f"Sweep: {name} ({time.process_time() - start:.1f} s CPU)\n")
            print(table + "\n")
        published["sweeps"] = "\n\n".join(sections)
        start = time.process_time()
        results["sensitivity"] = sensitivity.over_seeds(sizes)
        published["sensitivity"] = sensitivity.markdown(results["sensitivity"])
        print(f"Sensitivity ({time.process_time() - start:.1f} s CPU)\n")
        print(published["sensitivity"] + "\n")
        out.mkdir(parents=True, exist_ok=True)
        print(f"Plot: {plot.pd_ratio(results['ratios'], out / 'pd_ratio.png')}")
    if args.what == "all" and out == RESULTS:  # the full run, into the repository
        print(f"Published: {publish.publish(published)}")
    if results:
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.json").write_text(json.dumps(results, indent=1, default=str) + "\n")
        print(f"Results: {out / 'results.json'}")


if __name__ == "__main__":
    main()
