"""The sensitivity table (`boomsim/sensitivity.py`, issue 44 item 4): each variant moves the one
constant it names, the verdict comes from the seeds' bands (a table), and a small run gives a
row per case and variant with the default read against the best peer."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from boomsim import sensitivity
from boomsim.profiles import h200_qwen3_32b
from boomsim.sweep import Sizes


def test_each_variant_moves_only_the_constant_it_names() -> None:
    base = h200_qwen3_32b()
    for v in sensitivity.VARIANTS:
        moved = {
            f.name
            for f in dataclasses.fields(base)
            if getattr(v.profile(base), f.name) != getattr(base, f.name)
        }
        expected = {
            "as fitted": set(),
            "prefill efficiency 0.30": {"mfu"},
            "prefill efficiency 0.60": {"mfu"},
            "a pull's extra cost is P's compute": {"pull_on_compute"},
            "KV 64,000 blocks an engine": {"kv_blocks"},
            "bursty arrivals (gaps' CV 3)": set(),
        }[v.name]
        assert moved == expected, v.name
        assert (v.burst_cv != 1.0) == v.name.startswith("bursty")


def _row(policy: str, lo: float, hi: float) -> dict[str, Any]:
    return {"policy": policy, "goodput": (lo + hi) / 2, "band": {"goodput": [lo, hi]}}


@pytest.mark.parametrize(
    ("mine", "peer", "higher", "said"),
    [
        ((5.0, 6.0), (3.0, 4.0), True, "ahead"),
        ((3.0, 4.0), (5.0, 6.0), True, "behind"),
        ((3.0, 5.0), (4.0, 6.0), True, "inside the band"),
        ((3.0, 4.0), (5.0, 6.0), False, "ahead"),  # a latency: lower is better
        ((5.0, 6.0), (3.0, 4.0), False, "behind"),
    ],
)
def test_the_verdict_reads_the_bands(
    mine: tuple[float, float], peer: tuple[float, float], higher: bool, said: str
) -> None:
    assert (
        sensitivity.verdict(_row("adaptive", *mine), _row("dynamo", *peer), "goodput", higher)
        == said
    )


def test_a_small_run_reads_every_case_and_variant_against_the_best_peer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sensitivity, "POLICIES", ("affinity", "dynamo", "adaptive"))
    monkeypatch.setattr(sensitivity, "VARIANTS", sensitivity.VARIANTS[:2])
    sizes = Sizes(6, 0.25, (12,), (4_000,), (64,), 6, seeds=(0, 1))
    rows = sensitivity.over_seeds(sizes)
    assert {r["seeds"] for r in rows} == {2}
    assert len(rows) == 2 * 2 * 3  # cases x variants x policies
    table = sensitivity.markdown(rows)
    body = [line for line in table.splitlines() if line.startswith("| ") and "---" not in line]
    assert len(body) == 1 + 2 * 2  # the header, a line per case and variant
    assert all(("ahead" in line or "behind" in line or "inside" in line) for line in body[1:])
    assert all(("affinity" in line or "dynamo" in line) for line in body[1:])
