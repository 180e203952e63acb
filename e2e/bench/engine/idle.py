"""What a decoder that retains blocks and serves nothing costs in CPU, with the idle wait on and
off (`BOOMERANG_IDLE_STEP_S`, `boomerang.connector.plugin.idle_loop`).

For each mode: start P and D as `boomerang up` does (tiny model, D's TTL 480 s), run a two-turn
chat straight against the engines (`pdclient`: turn 2 pulls turn 1's blocks back from D, and D
then retains turn 2's), wait for the worker's 1 s spin after D's last step, then read the CPU
of D's and P's process groups from /proc over `--window` seconds. Then, still retaining, a
follow-up turn pulls D's blocks (P's `external_kv_transfer` tokens say how many), and after a
few idle seconds the follow-up's handle is released through D's lease API, timed until D's KV
usage falls. The modes run one after the other (one P/D pair at a time on two cores).

    make bench-idle ARGS="--window 60"
"""

from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from boomerang.connector.plugin.idle_policy import DEFAULT_IDLE_STEP_S, ENV_IDLE_STEP
from boomerang.facts.engine import LEASE_PATH
from boomerang.local import pdclient, stack
from boomerang.local.engine_client import samples

from bench.harness import machine, proc_cpu
from bench.harness.pair import bench_manifest, start_engines, stop_all
from bench.harness.repo import RESULTS

PORTS = stack.LocalPorts(
    router=31080, prefill=31100, decode=31200, prefill_side_channel=31600, decode_side_channel=31700
)
MODES = {"idle wait on": str(DEFAULT_IDLE_STEP_S), "idle wait off": "0"}
USAGE = "vllm:kv_cache_usage_perc"
HISTORY = 1024
SETTLE_S = 3.0
"""After D's last step its worker spins for vLLM's 1 s window: start measuring after it."""


def usage(url: str) -> float:
    return sum(s.value for s in samples(pdclient.scrape(url), USAGE))


def release(d_url: str, token: str, request_id: str) -> dict[str, Any]:
    body = json.dumps({"request_ids": [request_id]}).encode()
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {token}"}
    req = urllib.request.Request(f"{d_url}{LEASE_PATH}/release", body, headers)
    with urllib.request.urlopen(req, timeout=30) as resp:
        answer: dict[str, Any] = json.loads(resp.read())
    return answer


def freed_within(d_url: str, below: float, limit_s: float) -> float | None:
    """Seconds until D's KV usage drops below `below` (None: not within `limit_s`)."""
    started = time.monotonic()
    while time.monotonic() - started < limit_s:
        if usage(d_url) < below:
            return time.monotonic() - started
        time.sleep(0.02)
    return None


def one_mode(dd: Any, venv: Path, run_dir: Path, period: str, window: float) -> dict[str, Any]:
    env = {**os.environ, ENV_IDLE_STEP: period}
    ctx, pids = start_engines(dd, run_dir, venv, PORTS, env)
    p, d, model = ctx["p"], ctx["d"], ctx["model"]
    rng = random.Random(3600)
    try:
        history = [rng.randrange(16, 8000) for _ in range(HISTORY)]
        first = pdclient.pd_turn(p, d, model, history, None)
        prompt = history + first.tokens + [rng.randrange(16, 8000) for _ in range(64)]
        second = pdclient.pd_turn(p, d, model, prompt, first.handle)
        assert second.handle, "D returned no handle"
        time.sleep(SETTLE_S)
        held = usage(d)
        cpu = proc_cpu.measure({"D": pids[1], "P": pids[0]}, window)
        threads = proc_cpu.measure({"D": pids[1]}, 5.0, threads=True)["D"]
        print(f"D's busiest threads over 5 s: {proc_cpu.busiest(threads)}", flush=True)
        follow = prompt + second.tokens + [rng.randrange(16, 8000) for _ in range(64)]
        pulled = pdclient.external_tokens(pdclient.scrape(p))
        third = pdclient.pd_turn(p, d, model, follow, second.handle)
        pulled = pdclient.external_tokens(pdclient.scrape(p)) - pulled
        assert third.handle, "D returned no handle"
        time.sleep(SETTLE_S)
        before = usage(d)
        started = time.monotonic()
        released = release(d, stack.read_lease_token(run_dir), third.handle["remote_request_id"])
        call_s = time.monotonic() - started
        freed = freed_within(d, before, 10.0)
    finally:
        stop_all(pids)
    return {
        "period_s": float(period),
        "window_s": window,
        "d_usage_while_measured": held,
        "cpu": cpu,
        "d_threads_5s": threads,
        "follow_up_ttft_s": third.ttft_s,
        "follow_up_pulled": pulled,
        "follow_up_prompt": len(follow),
        "release": released,
        "release_call_s": call_s,
        "release_freed_s": None if freed is None else call_s + freed,
    }


def format_table(results: dict[str, dict[str, Any]]) -> str:
    lines = [
        "| mode | D total (cores) | D API server / engine core / worker | P total (cores) "
        "| follow-up TTFT | pulled / prompt | release freed in |",
        "|---|---|---|---|---|---|---|",
    ]
    for mode, r in results.items():
        dcpu = r["cpu"]["D"]
        parts = sorted((k, v) for k, v in dcpu.items() if k != "total")
        freed = r["release_freed_s"]
        lines.append(
            f"| {mode} | {dcpu['total']:.3f} | {' / '.join(f'{k} {v:.3f}' for k, v in parts)} "
            f"| {r['cpu']['P']['total']:.3f} | {r['follow_up_ttft_s'] * 1000:.0f} ms "
            f"| {r['follow_up_pulled']:.0f} / {r['follow_up_prompt']} "
            f"| {'-' if freed is None else f'{freed:.2f} s'} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--window", type=float, default=60.0, help="seconds of CPU measured")
    ap.add_argument("--modes", default=",".join(MODES), help="which modes, in this order")
    ap.add_argument("--out", type=Path, default=RESULTS / "idle.json")
    args = ap.parse_args()
    dd = bench_manifest("tiny", ttl="480s")
    venv = stack.ensure_engine_venv()
    header = f"machine: {machine.describe(venv)}"
    print(header, flush=True)
    results = {}
    for mode in args.modes.split(","):
        run_dir = Path(tempfile.mkdtemp(prefix="boomerang-bench-idle-"))
        print(f"{mode}: logs in {run_dir}", flush=True)
        results[mode] = one_mode(dd, venv, run_dir, MODES[mode], args.window)
        print(json.dumps(results[mode]), flush=True)
    args.out.write_text(json.dumps({"machine": header, "results": results}, indent=2))
    print(header)
    print(f"D retains a two-turn chat's blocks and serves nothing; CPU over {args.window:.0f} s")
    print(format_table(results))


if __name__ == "__main__":
    main()
