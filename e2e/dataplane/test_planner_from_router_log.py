"""The planner reads the real router's own log (issue 44 item 7): turns served through the
router and the vLLM CPU P/D pair, the router logging JSON as in a cluster; the trace read back
from its log has each conversation's turns in order with their prompt and answer tokens, and a
plan runs on it (simulated on the GPU profile)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from boomsim import plan
from dataplane.turns import counted, reuse, router_completion, words

pytestmark = [pytest.mark.engine, pytest.mark.timeout(900)]

MANIFEST = Path(__file__).resolve().parents[2] / "examples" / "qwen3-32b-adaptive.yaml"


def test_a_plan_replays_the_conversations_the_router_logged(dataplane) -> None:
    router = dataplane.router("router-planned", log_json=True)
    rng = random.Random(4401)
    sent: dict[str, list[tuple[int, int]]] = {}
    for conv in ("plan-a", "plan-b"):
        prompt = words(rng, 300)
        for _ in range(3):
            before = reuse(router)
            tokens, _, _ = router_completion(router, dataplane.model, prompt, conv, stream=False)
            counted(router, before)  # logged once counted: the line is written then
            sent.setdefault(conv, []).append((len(prompt), len(tokens)))
            prompt = prompt + tokens + words(rng, 40)
    log = dataplane.run_dir / "router-planned.log"
    trace = plan.read_trace(log, rate_per_s=1.0)
    replayed = [[(p, a) for p, a, _ in turns] for _, turns in trace.sessions]
    assert replayed == [sent["plan-a"], sent["plan-b"]]
    assert trace.dropped_turns == 0
    assert all(think >= 0 for _, turns in trace.sessions for _, _, think in turns)
    rows = plan.plan(plan.read_manifest(MANIFEST), trace, policies=["affinity"])
    assert [r["turns"] for r in rows] == [6, 6]
