"""The simulator against the CPU engines (`boomsim.cpu`): the benchmark's conversations replayed
as recorded, D's decode step measured by least squares, and the claim `docs/simulation.md`
makes checked against the published runs."""

from __future__ import annotations

import random
from typing import Any

import pytest
from boomsim import cpu
from boomsim.profiles import DecodeStep, cpu_engines

from bench.harness.repo import RESULTS


def record(conv: str, turn: int, start_ms: float, tpot_ms: float, **kw: Any) -> dict[str, Any]:
    base = {
        "conversation_id": conv,
        "input_num_turns": turn,
        "input_num_tokens": 1000,
        "output_num_tokens": 50,
        "start_time_ms": start_ms,
        "ttft_ms": 100.0,
        "latency_ms": 100.0 + 49 * tpot_ms,
        "tpot_ms": tpot_ms,
    }
    return {**base, **kw}


def test_conversations_are_replayed_as_the_client_recorded_them() -> None:
    records = [
        record("b", 3, 0, 10, input_num_tokens=2200, output_num_tokens=40),
        record("a", 1, 0, 10, input_num_tokens=1500, output_num_tokens=60),
        record("b", 1, 0, 10, input_num_tokens=2000, output_num_tokens=80),
        record("a", 3, 0, 10, input_num_tokens=1700, output_num_tokens=30),
    ]
    assert cpu.conversations(records) == [
        [(1500, 60, 0.0), (1700, 30, 0.0)],
        [(2000, 80, 0.0), (2200, 40, 0.0)],
    ]


def test_the_decode_step_is_recovered_from_streams_that_overlap() -> None:
    """Streams whose TPOT follows a known step exactly: the fit gives the step back."""
    step = DecodeStep(fixed_s=0.004, per_request_s=0.001, per_kv_token_s=3e-7)
    rng = random.Random(7)
    spans = [
        (rng.uniform(0, 5000), rng.uniform(400, 2000), rng.randint(500, 6000)) for _ in range(60)
    ]
    records = []
    for i, (start, length, prompt) in enumerate(spans):
        r = record(f"c{i}", 1, start, 0.0, input_num_tokens=prompt, output_num_tokens=50)
        r["ttft_ms"], r["latency_ms"] = 0.0, length
        records.append(r)
    for r, (_, batch, kv) in zip(records, cpu.decode_samples(records), strict=True):
        r["tpot_ms"] = 1000 * (step.fixed_s + step.per_request_s * batch + step.per_kv_token_s * kv)
    got = cpu.decode_step([{"records": records}])
    assert got.fixed_s == pytest.approx(step.fixed_s, rel=1e-6)
    assert got.per_request_s == pytest.approx(step.per_request_s, rel=1e-6)
    assert got.per_kv_token_s == pytest.approx(step.per_kv_token_s, rel=1e-6)


def test_a_decode_step_needs_streams_to_measure() -> None:
    with pytest.raises(ValueError, match="too few"):
        cpu.decode_step([{"records": [record("a", 1, 0, 10)]}])


def test_the_cpu_profile_takes_the_measured_step_and_prefill() -> None:
    p = cpu_engines(2e-4, 0.0, DecodeStep(0.004, 0.001, 3e-7), kv_blocks=200)
    assert p.prefill_s(1000, 0) == pytest.approx(0.2)
    assert p.step_fixed_s + p.decode_s(8, 20_000) == pytest.approx(0.004 + 0.008 + 0.006)
    assert p.kv_blocks == 200


def test_the_regimes_are_the_benchmark_s_own() -> None:
    topo, load = cpu.topology("pressure, equal engines")
    assert (topo.prefill, topo.decode, topo.p_blocks, topo.d_blocks) == (1, 1, 200, 200)
    assert load.clients == 8
    topo, load = cpu.topology("2p1d, equal engines")
    assert (topo.prefill, topo.decode) == (2, 1)


def test_the_published_runs_are_predicted_as_docs_simulation_md_claims() -> None:
    """TPOT p50 and wall within 25 % on every row of the claimed regimes but the one D's step
    was measured on."""
    rows = cpu.table(cpu.load(RESULTS / "production"))
    assert sum(r.fitted for r in rows) == 1
    held_out = [r for r in rows if not r.fitted and r.regime in cpu.CLAIMED_REGIMES]
    assert len(held_out) >= 11
    for figure in cpu.CLAIMED:
        missed = [
            (r.regime, r.mode, round(r.ratio(figure), 2)) for r in held_out if not r.within(figure)
        ]
        assert not missed, f"{figure} predicted outside 25 %: {missed}"
