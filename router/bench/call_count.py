"""Function calls the router makes per turn: a measure of its code that a busy VM cannot blur.

Why: on the shared 2-core VMs this project runs on, the router's CPU per turn moves by 5-20 %
from one run to the next (the machine, not the code), so a change of a few per cent cannot be
told from noise by timing (`router_bench`, `compare.sh`). How many Python functions, and how
many C functions, a turn calls does not depend on the machine's mood: counted by a profile hook
in the router process, over the same conversations, it says exactly what a change added to or
took from a turn, and where. It is not time (a call to `orjson.loads` and one to a small
method count alike), so it complements the CPU tables, it does not replace them.

    make bench-calls                       # this tree: calls per plain turn, top functions
    make bench-calls ARGS="--ref 2d3eadf"  # this tree against a commit, by function
    make bench-calls ARGS="--stream"       # streamed turns (16 tokens, one event each)

The fake engines (`router_bench --serve-engines`) and the conversations (`bench_turns`) are the
router benchmark's: every turn after a conversation's first is a verified hit. The router runs
with a hook counting each call by file and qualified name (a coroutine counts each time it
resumes, as entering its frame again costs); a warm-up of `--warmup` conversations is not
counted (first calls fill caches and lazy imports), then `--conversations` of 8 turns each, one
at a time. Health probes that fall inside the run count too: two runs of one tree gave 637.2
and 637.1 Python calls per plain turn.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_procs import use_uvloop
from bench_turns import conversation, think_times
from router_bench import TURNS, engines_and_router

from boomerang.router.engines.upstream import EngineClient


def _hook_and_serve(out: str, argv: list[str]) -> None:
    """The router's process: count every call from here on; SIGUSR1 restarts the count, SIGUSR2
    writes it to `out` (JSON: "file:qualified name" or "C:name" -> calls)."""
    counts: collections.Counter[str] = collections.Counter()

    def hook(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            code = frame.f_code
            counts[f"{os.path.basename(code.co_filename)}:{code.co_qualname}"] += 1
        elif event == "c_call":
            counts[f"C:{getattr(arg, '__qualname__', repr(arg))}"] += 1

    def write(*_: Any) -> None:
        sys.setprofile(None)
        Path(f"{out}.part").write_text(json.dumps(dict(counts)))
        os.replace(f"{out}.part", out)  # whole when it appears: the driver polls for it

    signal.signal(signal.SIGUSR1, lambda *_: counts.clear())
    signal.signal(signal.SIGUSR2, write)
    from boomerang.router.__main__ import main

    sys.setprofile(hook)
    main(argv)


def count(router_src: str | None, conversations: int, warmup: int, stream: bool) -> dict[str, int]:
    """Calls per function over `conversations` conversations through a router whose code is
    imported from `router_src` (None: as this process imports it)."""
    if router_src is not None:
        sys.path.insert(0, router_src)  # spawn() passes this process's sys.path on
    try:
        return asyncio.run(_count(conversations, warmup, stream))
    finally:
        if router_src is not None:
            sys.path.remove(router_src)


async def _count(conversations: int, warmup: int, stream: bool) -> dict[str, int]:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "calls.json")
        client = EngineClient()
        try:
            with engines_and_router(["-m", "call_count", "--serve-router", out]) as (url, pids):
                urls = {"router": url["r"]}
                await _run(client, urls, "w", warmup, stream)
                os.kill(pids["router"], signal.SIGUSR1)
                await asyncio.sleep(0.2)
                await _run(client, urls, "m", conversations, stream)
                os.kill(pids["router"], signal.SIGUSR2)
                deadline = time.monotonic() + 10
                while not os.path.exists(out) and time.monotonic() < deadline:
                    await asyncio.sleep(0.05)
            data: dict[str, int] = json.loads(Path(out).read_text())
            return data
        finally:
            await client.close()


async def _run(client: EngineClient, urls: dict[str, str], tag: str, n: int, stream: bool) -> None:
    latencies: list[float] = []
    for k in range(n):
        cid = f"{tag}{k}"
        done = await conversation(
            client, urls, cid, TURNS, think_times(cid, 0.0), float("inf"), latencies, stream
        )
        if done != TURNS:
            raise RuntimeError(f"conversation {cid} ran {done} of {TURNS} turns")


def totals(calls: dict[str, int], turns: int) -> tuple[float, float]:
    """Python and C function calls per turn."""
    c = sum(v for k, v in calls.items() if k.startswith("C:"))
    return (sum(calls.values()) - c) / turns, c / turns


def table(runs: dict[str, dict[str, int]], turns: int, top: int) -> list[str]:
    """The totals per tree, then the functions whose calls per turn differ most between the
    first tree and the last (with one tree: the most called)."""
    lines = ["| tree | Python calls per turn | C calls per turn |", "|---|---|---|"]
    for name, calls in runs.items():
        py, c = totals(calls, turns)
        lines.append(f"| {name} | {py:.1f} | {c:.1f} |")
    names = list(runs)
    first, last = runs[names[0]], runs[names[-1]]
    keys = sorted(
        set(first) | set(last),
        key=lambda k: (
            (-abs(last.get(k, 0) - first.get(k, 0)), k) if len(runs) > 1 else (-last[k], k)
        ),
    )[:top]
    head = " | ".join(f"{n} calls per turn" for n in names)
    lines += ["", f"| function | {head} |", "|---|" + "---|" * len(names)]
    for k in keys:
        cells = " | ".join(f"{runs[n].get(k, 0) / turns:.2f}" for n in names)
        lines.append(f"| `{k}` | {cells} |")
    return lines


def main(argv: list[str] | None = None) -> None:
    """Count, print the tables."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--serve-router"]:
        use_uvloop()
        _hook_and_serve(argv[1], argv[2:])
        return
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--ref", help="also count the router of this commit (a git worktree)")
    ap.add_argument("--conversations", type=int, default=50, help="counted, of 8 turns each")
    ap.add_argument("--warmup", type=int, default=10, help="conversations not counted")
    ap.add_argument("--stream", action="store_true", help="streamed turns")
    ap.add_argument("--top", type=int, default=25, help="functions listed")
    args = ap.parse_args(argv)
    turns = args.conversations * TURNS
    runs: dict[str, dict[str, int]] = {}
    if args.ref:
        with tempfile.TemporaryDirectory() as tmp:
            tree = os.path.join(tmp, "ref")
            git = ["git", "worktree"]
            subprocess.run(
                [*git, "add", "--detach", tree, args.ref], check=True, capture_output=True
            )
            try:
                runs[args.ref] = count(
                    f"{tree}/router/src", args.conversations, args.warmup, args.stream
                )
            finally:
                subprocess.run([*git, "remove", "--force", tree], check=False, capture_output=True)
    runs["this tree"] = count(None, args.conversations, args.warmup, args.stream)
    kind = "streamed" if args.stream else "plain"
    print(f"{turns} {kind} turns ({args.conversations} conversations of {TURNS}), one at a time")
    print("\n".join(table(runs, turns, args.top)))


if __name__ == "__main__":
    main()
