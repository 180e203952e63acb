"""`python -m boomsim` (`make sim`): the calibration table, the sweeps, the plot, the speed.

make sim                      # calibration, every sweep at full size, plot (minutes)
make sim ARGS=--quick         # the same, smaller (seconds); written to a temporary folder
make sim ARGS="speed --turns 1000000"
make sim ARGS=fit             # re-derive the GPU profile's fitted constants
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from boomsim import calibrate, plot, speed, sweep

RESULTS = Path(__file__).resolve().parent.parent / "results"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="boomsim", description=__doc__.splitlines()[0])
    ap.add_argument(
        "what", nargs="?", default="all", choices=("all", "calibrate", "sweep", "speed", "fit")
    )
    ap.add_argument("--quick", action="store_true", help="smaller sweeps")
    ap.add_argument("--turns", type=int, default=100_000, help="speed: turns to simulate")
    ap.add_argument("--out", type=Path, help="where results.json and the plot go")
    args = ap.parse_args(argv)
    out = args.out or (Path(tempfile.gettempdir()) / "boomsim-quick" if args.quick else RESULTS)
    results: dict[str, Any] = {}
    if args.what == "fit":
        print(calibrate.fit_gpu())
        return
    if args.what == "speed":
        print(json.dumps(speed.measure(args.turns), indent=1))
        return
    if args.what in ("all", "calibrate"):
        rows = calibrate.gpu_table()
        results["calibration"] = rows
        print("Seeds' 1P1D table (Qwen3-32B, P's prefix cache off), mean TTFT:\n")
        print(calibrate.gpu_markdown(rows) + "\n")
    if args.what in ("all", "sweep"):
        sizes = sweep.QUICK if args.quick else sweep.FULL
        for name, key, fn in (
            ("ratios", "ratio", sweep.ratios),
            ("sessions", "sessions", sweep.sessions),
            ("kv", "kv_blocks", sweep.kv),
            ("suffix", "suffix", sweep.suffix),
        ):
            start = time.process_time()
            rows = fn(sizes)
            results[name] = rows
            print(f"Sweep: {name} ({time.process_time() - start:.1f} s CPU)\n")
            print(sweep.markdown(rows, key) + "\n")
        out.mkdir(parents=True, exist_ok=True)
        print(f"Plot: {plot.pd_ratio(results['ratios'], out / 'pd_ratio.png')}")
    if results:
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.json").write_text(json.dumps(results, indent=1, default=str) + "\n")
        print(f"Results: {out / 'results.json'}")


if __name__ == "__main__":
    main()
