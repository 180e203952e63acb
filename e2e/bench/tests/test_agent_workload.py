"""The agent workload's plan has the distributions it claims, and the report's arithmetic holds.

Pure tests (no engines, no clock): the plan is seeded and reproducible, think times are
log-normal with the configured median and sigma, suffixes follow the mix (tool results in the
thousands), exactly the configured share is abandoned; the report buckets, percentiles and
integrates D's KV samples as documented, and reads the router's per-turn log lines; a replay
against a fake router chains every prompt as a client would (no engines: the real replay is
`make bench-agents`).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import statistics
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from bench.agents import report as agent_report
from bench.agents import run as bench_agents
from bench.agents import workload as aw

BIG = aw.WorkloadConfig(conversations=2000, max_context=10**9)
"""Enough conversations for distribution checks, and no context cap to cut turns short."""


@pytest.fixture(scope="module")
def big() -> aw.Plan:
    return aw.make_plan(BIG)


def test_the_same_seed_gives_the_same_plan_and_another_seed_another() -> None:
    a, b = aw.make_plan(aw.WorkloadConfig()), aw.make_plan(aw.WorkloadConfig())
    assert a == b and a.fingerprint() == b.fingerprint()
    other = aw.make_plan(aw.WorkloadConfig(seed=7))
    assert other.fingerprint() != a.fingerprint()
    assert json.dumps(a.to_dict())  # the plan is stored with the results


def test_a_turn_rebuilds_the_same_ordinary_token_ids() -> None:
    plan = aw.make_plan(aw.QUICK)
    _conv, turn = next(plan.turns())
    ids = turn.ids()
    assert ids == turn.ids() and len(ids) == turn.new_tokens
    assert all(aw.VOCAB[0] <= i < aw.VOCAB[1] for i in ids)


def test_think_times_are_log_normal_with_the_configured_median_and_sigma(big: aw.Plan) -> None:
    thinks = [t.think_s for _c, t in big.turns() if t.index > 1]
    logs = [math.log(t) for t in thinks]
    assert len(thinks) > 5000
    assert statistics.median(thinks) == pytest.approx(BIG.think_median_s, rel=0.05)
    assert statistics.stdev(logs) == pytest.approx(BIG.think_sigma, rel=0.05)
    # Heavy tail: some gaps outlive D's default 480 s TTL, the mean sits well above the median.
    assert max(thinks) > 480 and statistics.mean(thinks) > 2 * statistics.median(thinks)
    assert all(t.think_s == 0.0 for _c, t in big.turns() if t.index == 1)


def test_suffixes_follow_the_mix_from_a_few_tokens_to_thousands(big: aw.Plan) -> None:
    follow = [t for _c, t in big.turns() if t.index > 1]
    kinds = {k.name: k for k in BIG.suffix_mix}
    for name, kind in kinds.items():
        these = [t.new_tokens for t in follow if t.kind == name]
        assert len(these) / len(follow) == pytest.approx(kind.weight, abs=0.02)
        assert all(kind.low <= n <= kind.high for n in these)
        # Log-uniform: the median is the geometric mean of the bounds.
        assert statistics.median(these) == pytest.approx(math.sqrt(kind.low * kind.high), rel=0.1)
    sizes = [t.new_tokens for t in follow]
    assert min(sizes) < 8 and max(sizes) > 3000
    assert sum(n >= 2000 for n in sizes) / len(sizes) > 0.03  # tool results in the thousands


def test_exactly_the_configured_share_is_abandoned_before_its_planned_end(big: aw.Plan) -> None:
    abandoned = [c for c in big.conversations if c.abandoned]
    assert len(abandoned) == round(BIG.abandon_share * BIG.conversations)
    assert all(len(c.turns) < c.planned_turns for c in abandoned)
    assert all(len(c.turns) == c.planned_turns for c in big.conversations if not c.abandoned)
    quick = aw.make_plan(aw.QUICK)
    assert sum(c.abandoned for c in quick.conversations) == 2  # 25% of 8, not a coin's luck


def test_conversations_vary_in_length_within_bounds(big: aw.Plan) -> None:
    planned = [c.planned_turns for c in big.conversations]
    assert min(planned) == 2 and max(planned) == BIG.turns_max
    assert statistics.median(planned) == pytest.approx(BIG.turns_median, abs=1)
    assert len(set(planned)) >= 8


def test_no_conversation_grows_past_the_context_cap() -> None:
    cfg = aw.WorkloadConfig(conversations=200, max_context=4096)
    plan = aw.make_plan(cfg)
    assert all(c.context_tokens() <= cfg.max_context for c in plan.conversations)
    assert all(len(c.turns) >= 1 for c in plan.conversations)


def test_conversations_arrive_as_a_poisson_process(big: aw.Plan) -> None:
    starts = [c.start_s for c in big.conversations]
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    assert starts[0] == 0.0 and all(g >= 0 for g in gaps)
    assert statistics.mean(gaps) == pytest.approx(BIG.arrival_mean_s, rel=0.06)
    # Exponential gaps: the standard deviation equals the mean.
    assert statistics.stdev(gaps) == pytest.approx(BIG.arrival_mean_s, rel=0.1)


def test_the_quick_plan_is_a_fraction_of_the_default() -> None:
    full, quick = aw.make_plan(aw.WorkloadConfig()), aw.make_plan(aw.QUICK)
    assert aw.span_s(quick) < aw.span_s(full) / 4
    assert len(list(quick.turns())) < len(list(full.turns())) / 3


def test_prefill_work_with_reuse_counts_only_the_new_tokens() -> None:
    plan = aw.make_plan(aw.QUICK)
    reused, recomputed = aw.prefill_work_s(plan, lambda n: 0.001 * n)
    new = sum(t.new_tokens for _c, t in plan.turns())
    assert reused == pytest.approx(0.001 * new)
    assert recomputed > 2 * reused


@pytest.mark.parametrize(
    ("turn", "new", "row"),
    [
        (1, 5000, "turn 1"),
        (2, 64, "<=64"),
        (2, 65, "<=256"),
        (3, 1024, "<=1024"),
        (4, 1025, ">1024"),
    ],
)
def test_turns_are_bucketed_by_their_new_suffix(turn: int, new: int, row: str) -> None:
    assert agent_report.bucket({"turn": turn, "new_tokens": new}) == row


def test_percentiles_are_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert agent_report.percentile(values, 50) == 50.0
    assert agent_report.percentile(values, 99) == 99.0
    assert agent_report.percentile([3.0, 1.0, 2.0], 99) == 3.0


def test_block_seconds_integrate_used_blocks_with_a_bound_on_the_sampling_error() -> None:
    assert agent_report.block_seconds([(0.0, 10.0), (2.0, 10.0), (5.0, 10.0)]) == (50.0, 0.0)
    # A jump of 10 blocks somewhere inside a 1 s interval: true area between 0 and 10.
    area, bound = agent_report.block_seconds([(0.0, 0.0), (1.0, 10.0), (3.0, 10.0)])
    assert area == 25.0 and bound == 5.0


def record(turn: int, new: int, outcome: str, ttft: float | None) -> dict[str, object]:
    return {"turn": turn, "new_tokens": new, "outcome": outcome, "ttft_s": ttft}


def test_the_summary_counts_paths_and_the_hit_rate_of_follow_up_turns() -> None:
    records = [
        record(1, 900, "miss", 2.0),
        record(2, 10, "hit", 0.2),
        record(3, 2000, "expired", 9.0),
        record(4, 30, "error", None),
    ]
    summary = agent_report.summarize(records)
    assert summary["shares"]["miss"] == 0.25 and summary["shares"]["error"] == 0.25
    assert summary["hit_rate"] == pytest.approx(1 / 3)
    rows = {r["bucket"]: r for r in summary["rows"]}
    assert rows["<=64"]["turns"] == 2 and rows["<=64"]["p99_s"] == 0.2  # the error has no TTFT
    assert rows["all"]["p50_s"] == 2.0 and rows["<=1024"]["p50_s"] is None


def test_a_verified_turn_the_router_chose_to_recompute_still_found_its_history() -> None:
    records = [
        {**record(1, 900, "miss", 2.0), "path": "recompute"},
        {**record(2, 10, "hit", 0.1), "path": "continue", "chosen": "continue"},
        {**record(3, 40, "fallback", 0.5), "path": "recompute", "chosen": "recompute"},
        {**record(4, 40, "fallback", 0.5), "path": "recompute"},  # no verified handle
        {**record(5, 900, "hit", 0.6), "path": "pull", "chosen": "pull"},
    ]
    summary = agent_report.summarize(records)
    assert summary["hit_rate"] == pytest.approx(3 / 4)
    assert summary["path_shares"] == {"continue": 0.2, "pull": 0.2, "recompute": 0.6}
    table = agent_report.format_table([{**fake_result("a"), "summary": summary}])
    assert "| share path continue | 20% |" in table


def fake_result(label: str) -> dict[str, object]:
    records = [record(1, 900, "miss", 2.0), record(2, 10, "hit", 0.2)]
    kv = {"block_s": 1200.0, "error_block_s": 30.0, "peak_blocks": 40.0}
    return {
        "label": label,
        "summary": agent_report.summarize(records),
        "kv": kv,
        "p_tokens": {"pulled": 900.0, "computed": 920.0},
    }


def test_runs_are_tabulated_and_drawn_side_by_side(tmp_path: Path) -> None:
    table = agent_report.format_table([fake_result("static"), fake_result("adaptive")])
    assert "static p50 / p99 (ms)" in table and "adaptive p50 / p99 (ms)" in table
    assert "| hit rate (turns 2+) | 100% | 100% |" in table
    assert "1200 ± 30" in table
    agent_report.draw([fake_result("static"), fake_result("adaptive")], tmp_path / "c.png")
    assert (tmp_path / "c.png").stat().st_size > 0


def test_outcomes_come_from_the_routers_served_turn_lines(tmp_path: Path) -> None:
    log = tmp_path / "static.log"
    served = {"msg": "Served turn", "request_id": "static-c000-t2", "reuse": "hit"}
    log.write_text(
        "a warning that is not JSON\n"
        + json.dumps({"msg": "Started", "request_id": "-"})
        + "\n"
        + json.dumps({**served, "reused_tokens": 1024})
        + "\n"
    )
    records = [
        {"request_id": "static-c000-t2"},
        {"request_id": "static-c000-t3"},
        {"request_id": "static-c001-t1", "outcome": "error"},
    ]
    bench_agents.attach_outcomes(records, bench_agents.served_turns(log))
    assert [r["outcome"] for r in records] == ["hit", "unknown", "error"]
    assert records[0]["reused_tokens"] == 1024


METRICS = """\
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="128",engine="0",num_cpu_blocks="None",num_gpu_blocks="2048"} 1.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="boomerang-tiny"} 0.25
"""


def test_ds_used_blocks_come_from_its_usage_and_block_count() -> None:
    total = bench_agents.kv_blocks(METRICS)
    assert total == 2048
    assert bench_agents.used_blocks(METRICS, total) == pytest.approx(0.25 * 2047)


class FakeEngines(BaseHTTPRequestHandler):
    """One server for the router, P and D of a replay: its `/metrics` say D has nothing in use;
    subclasses answer the turns."""

    def log_message(self, *_args: object) -> None:
        pass

    def do_GET(self) -> None:
        self.reply(METRICS.replace("} 0.25", "} 0.0").encode(), "text/plain")

    def reply(self, data: bytes, kind: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def replayed(handler: type[FakeEngines], **ctx: Any) -> tuple[aw.Plan, dict[str, Any]]:
    """A quick plan of two conversations replayed against `handler`, with `ctx` added to the
    replay's context; the plan and the run."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}"
    plan = aw.make_plan(dataclasses.replace(aw.QUICK, conversations=2))
    base = {"router": url, "p": url, "d": url, "model": "m", "timeout": 10.0, "label": "t"}
    try:
        run = bench_agents.replay(
            {**base, "ttl_s": 30.0, **ctx}, plan, 0.0, bench_agents.KvSampler(url, 0.05)
        )
    finally:
        server.shutdown()
    return plan, run


class FakeStack(FakeEngines):
    """A router streaming `max_tokens` ids per turn; it keeps the prompts and request ids it
    was sent."""

    seen: list[tuple[str, list[int]]] = []

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.seen.append((self.headers["X-Request-Id"], body["prompt"]))
        chunks = [
            {"choices": [{"token_ids": [100 + i], "text": "x"}]} for i in range(body["max_tokens"])
        ]
        events = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
        self.reply(events.encode(), "text/event-stream")


def test_a_replay_chains_each_prompt_from_the_last_prompt_its_output_and_the_new_suffix() -> None:
    plan, run = replayed(FakeStack)
    sent = dict(FakeStack.seen)
    for conv in plan.conversations:
        expected: list[int] = []
        for turn in conv.turns:
            expected = expected + turn.ids()
            assert sent[f"t-{conv.id}-t{turn.index}"] == expected
            expected = expected + [100 + i for i in range(turn.max_tokens)]
    assert len(run["records"]) == len(list(plan.turns()))
    assert all(r["ttft_s"] is not None for r in run["records"])


def test_an_adaptive_routers_retention_floor_is_scaled_like_ds_ttl() -> None:
    adaptive = bench_agents.scaled(bench_agents.MODES["adaptive"], 0.1)
    assert adaptive["tuning"]["retention_min_s"] == 1.0
    assert adaptive["tuning"]["mode"] == "adaptive"
    assert (
        bench_agents.scaled(bench_agents.MODES["adaptive"], 0.5)["tuning"]["retention_min_s"] == 5.0
    )
    assert bench_agents.scaled(bench_agents.MODES["static"], 0.1) == {}
