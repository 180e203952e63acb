"""One simulation run: a cluster, a policy, a workload; its summary and its cost.

Why one function: the calibration, the sweep, the speed check and the tests all run the same
thing with other parameters, so none of them can build a cluster differently."""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from boomsim.cluster import Cluster, Topology
from boomsim.loop import Loop
from boomsim.policies import Settings
from boomsim.profiles import Profile
from boomsim.workload import ClosedLoop, OpenLoop, Replay, Send, Turns


@dataclass(frozen=True)
class Load:
    """How turns arrive: closed-loop clients (rate None), sessions at `rate` per second, or
    recorded sessions at their own offsets (`replay`, from `trace.py`: the conversations
    passed to `run` are then not used)."""

    clients: int = 8
    max_active: int = 8
    rate: float | None = None
    seed: int = 0
    burst_cv: float = 1.0
    """Open loop: the arrival gaps' coefficient of variation (1: Poisson; `OpenLoop`)."""
    replay: tuple[tuple[float, Turns], ...] | None = None


@dataclass
class Result:
    summary: dict[str, Any]
    wall_s: float
    events: int
    engines: dict[str, Any] = field(default_factory=dict)

    @property
    def turns_per_wall_s(self) -> float:
        return float(self.summary["turns"]) / max(self.wall_s, 1e-9)


def run(
    profile: Profile,
    topo: Topology,
    settings: Settings,
    convs: Iterator[Turns],
    load: Load,
    *,
    check: bool = False,
) -> Result:
    """Simulate until every conversation is done; `check` verifies block conservation on
    every engine at the end (tests)."""
    loop = Loop()
    cluster = Cluster(loop, profile, topo, settings)
    if load.replay is not None:
        Replay(loop, _send(cluster), list(load.replay)).start()
    elif load.rate is None:
        ClosedLoop(loop, _send(cluster), convs, load.clients, load.max_active).start()
    else:
        rng = random.Random(load.seed + 1)
        OpenLoop(loop, _send(cluster), convs, load.rate, rng, load.burst_cv).start()
    start = time.process_time()
    loop.run()
    wall = time.process_time() - start
    span = loop.now  # the pools integrate from 0 until the last event (a lease's end, say)
    shares = {e.name: e.pool.held_share(span) for e in cluster.prefill + cluster.decode}
    engines = {}
    for e in cluster.prefill + cluster.decode:
        if check:
            e.pool.check()
        engines[e.name] = {
            "computed": e.computed,
            "loaded": e.loaded,
            "tier_loaded": e.tier_loaded,
            "busy_s": round(e.busy_s, 3),
            "evicted_blocks": e.pool.evicted,
            "held_share": round(shares[e.name], 4),
            "lease_ends": dict(sorted(e.lease_ends.items())),
        }
    summary = cluster.metrics.summary()
    held = [shares[d.name] for d in cluster.decode]
    summary["kv_held"] = sum(held) / len(held) if held else float("nan")
    return Result(summary, wall, loop.events, engines)


def _send(cluster: Cluster) -> Send:
    def send(
        conv: int, index: int, prompt: int, answer: int, done: Callable[[float], None]
    ) -> None:
        cluster.metrics.started(cluster.loop.now)
        cluster.turn(conv, index, prompt, answer, done)

    return send
