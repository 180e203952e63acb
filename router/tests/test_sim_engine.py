"""One simulated engine against closed-form answers."""

from __future__ import annotations

import dataclasses

import pytest
from boomsim.engine import Engine, Req
from boomsim.kvcache import BlockPool
from boomsim.loop import Loop
from boomsim.profiles import Profile, h200_qwen3_32b

# KV reads cost nothing in a decode step here, so a step's time is exact in closed form.
P = dataclasses.replace(h200_qwen3_32b(), kv_bytes_per_token=0.0, attn_flops=0.0)
STEP = P.step_fixed_s


def _engine(profile: Profile = P, blocks: int = 100_000) -> tuple[Loop, Engine]:
    loop = Loop()
    return loop, Engine("e", "decode", profile, loop, BlockPool(blocks))


def _req(conv: int, prompt: int, decode: int, seen: dict[str, list[float]], remote: int = 0) -> Req:
    def first(r: Req, t: float) -> None:
        seen.setdefault("first", []).append(t)

    def done(r: Req, t: float) -> None:
        seen.setdefault("done", []).append(t)

    return Req(conv, prompt, remote, decode, -(-(prompt + decode) // 16), first, done)


def test_one_requests_ttft_is_its_prefill_cost() -> None:
    loop, e = _engine()
    seen: dict[str, list[float]] = {}
    e.submit(_req(1, 2000, 1, seen))
    loop.run()
    assert seen["first"] == [pytest.approx(STEP + P.prefill_s(2000, 0))]


def test_a_long_prompt_is_prefilled_in_chunks_of_the_token_budget() -> None:
    prof = dataclasses.replace(h200_qwen3_32b(), token_budget=1000)
    loop, e = _engine(prof)
    seen: dict[str, list[float]] = {}
    e.submit(_req(1, 2500, 1, seen))
    loop.run()
    chunks = [(1000, 0), (1000, 1000), (500, 2000)]
    expected = sum(STEP + prof.prefill_s(n, ctx) for n, ctx in chunks)
    assert seen["first"] == [pytest.approx(expected)]


def test_a_queue_of_identical_requests_finishes_one_step_apart() -> None:
    prof = dataclasses.replace(P, token_budget=1000)
    loop, e = _engine(prof)
    seen: dict[str, list[float]] = {}
    for conv in range(5):
        e.submit(_req(conv, 1000, 1, seen))
    loop.run()
    step = STEP + prof.prefill_s(1000, 0)
    assert seen["first"] == [pytest.approx(step * (i + 1)) for i in range(5)]


def test_decoding_alone_takes_one_step_a_token() -> None:
    loop, e = _engine()
    seen: dict[str, list[float]] = {}
    e.submit(_req(1, 100, 50, seen))
    loop.run()
    step = STEP + P.decode_s(1, 0)
    assert seen["done"][0] - seen["first"][0] == pytest.approx(49 * step)


def test_a_request_arriving_mid_run_joins_at_the_next_step() -> None:
    loop, e = _engine()
    seen: dict[str, list[float]] = {}
    e.submit(_req(1, 100, 100, seen))
    first = STEP + P.prefill_s(100, 0)
    decode = STEP + P.decode_s(1, 0)
    at = first + 10.5 * decode
    loop.at(at, lambda _: e.submit(_req(2, 100, 2, seen)))
    loop.run()
    joined = first + 11 * decode  # the step under way ends, then the newcomer's prefill step
    assert seen["first"][1] == pytest.approx(joined + STEP + P.decode_s(1, 0) + P.prefill_s(100, 0))
    # The first request lost exactly that one longer step.
    assert seen["done"][-1] == pytest.approx(
        first + 99 * decode + P.prefill_s(100, 0) + (P.decode_s(2, 0) - P.decode_s(1, 0))
    )


def test_a_streams_worst_gap_is_the_step_a_prefill_joined() -> None:
    """Decoding alone, a stream's tokens come one decode step apart; a 4,000-token prompt that
    joins mid-stream lengthens one step by its prefill, and that step is the stream's worst
    inter-token gap (the figure TPOT averages away)."""
    loop, e = _engine()
    seen: dict[str, list[float]] = {}
    stream = _req(1, 100, 100, seen)
    quiet = _req(3, 100, 100, {})
    e.submit(stream)
    first = STEP + P.prefill_s(100, 0)
    decode = STEP + P.decode_s(1, 0)
    loop.at(first + 10.5 * decode, lambda _: e.submit(_req(2, 4000, 2, seen)))
    loop.run()
    assert stream.gap == pytest.approx(STEP + P.decode_s(1, 0) + P.prefill_s(4000, 0))
    e.submit(quiet)
    loop.run()
    assert quiet.gap == pytest.approx(decode)


def test_a_remote_load_is_read_before_the_request_computes() -> None:
    loop, e = _engine()
    seen: dict[str, list[float]] = {}
    e.submit(_req(1, 4001, 1, seen, remote=4000))
    loop.run()
    assert seen["first"] == [pytest.approx(P.transfer_s(4000) + STEP + P.prefill_s(1, 4000))]
    assert e.loaded == 4000 and e.computed == 1


def test_a_prefill_engine_recomputes_a_load_below_its_threshold() -> None:
    loop = Loop()
    e = Engine("p", "prefill", P, loop, BlockPool(1000), recompute_threshold=64)
    seen: dict[str, list[float]] = {}
    e.submit(_req(1, 100, 1, seen, remote=63))
    loop.run()
    assert e.loaded == 0 and e.computed == 100


@pytest.mark.parametrize("on_compute", [False, True])
def test_a_pulls_extra_cost_is_the_requests_wait_or_ps_step(on_compute: bool) -> None:
    """P pulls 4,000 tokens for one request; another arrives while the pull's cost beyond the
    read runs. That cost either delays the puller alone while P computes the other (the fit's
    reading), or is spent in P's step, which the other then waits out, and counts in P's busy
    time (`Profile.pull_on_compute`)."""
    profile = dataclasses.replace(P, pull_on_compute=on_compute)
    loop = Loop()
    e = Engine("p", "prefill", profile, loop, BlockPool(100_000))
    puller: dict[str, list[float]] = {}
    other: dict[str, list[float]] = {}
    e.submit(_req(1, 4001, 1, puller, remote=4000))
    read, extra = profile.transfer_s(4000), profile.pull_s(4000) - profile.transfer_s(4000)
    loop.at(read + extra / 2, lambda _: e.submit(_req(2, 2000, 1, other)))
    loop.run()
    mine, alone = STEP + P.prefill_s(1, 4000), STEP + P.prefill_s(2000, 0)
    assert alone > extra / 2  # so the puller, ready after the extra, waits for the other's step
    if on_compute:
        assert puller["first"] == [pytest.approx(read + mine + extra)]
        assert other["first"] == [pytest.approx(read + mine + extra + alone)]
        assert e.busy_s == pytest.approx(mine + extra + alone)
    else:
        assert other["first"] == [pytest.approx(read + extra / 2 + alone)]
        assert puller["first"] == [pytest.approx(read + extra / 2 + alone + mine)]
        assert e.busy_s == pytest.approx(mine + alone)
