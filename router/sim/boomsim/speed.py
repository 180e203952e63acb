"""How fast the simulator runs: simulated turns per second of CPU time.

Why measured, not assumed: the simulator must answer a million-turn question (4P8D, thousands
of sessions) in minutes on two cores, and its speed is the loop's and the router's decisions'
cost in Python, which only a run can tell."""

from __future__ import annotations

from typing import Any

from boomsim.cluster import Topology
from boomsim.policies import Settings
from boomsim.profiles import h200_qwen3_32b
from boomsim.run import Load, run
from boomsim.workload import MULTI_TURN, stream

MEAN_TURNS = 5
"""vLLM's multi-turn shape: 4-6 user turns a conversation."""


def measure(turns: int, policy: str = "adaptive", clients: int = 512) -> dict[str, Any]:
    """Simulate about `turns` turns of the multi-turn shape on 4P8D with `clients` clients."""
    convs = stream(MULTI_TURN, max(1, turns // MEAN_TURNS), seed=0)
    r = run(h200_qwen3_32b(), Topology(4, 8), Settings(policy), convs, Load(clients, clients))
    return {
        "policy": policy,
        "turns": r.summary["turns"],
        "events": r.events,
        "cpu_s": r.wall_s,
        "turns_per_cpu_s": r.turns_per_wall_s,
        "simulated_s": r.summary["span_s"],
    }
