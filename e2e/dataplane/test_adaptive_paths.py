"""Adaptive mode through a real router process on the real engines (vLLM CPU 0.32, NIXL).

What must hold: a conversation's next turn with a short suffix goes straight to the decoder
that holds the history (the continue path: D's `prompt_tokens_by_source{source=
"local_cache_hit"}` covers the history, the router counts `path_total{path="continue"}`), its
answer equals one engine computing the same prompt alone (float32, greedy), and the turn after
it still finds a verified handle (D's continued answer filed a fresh one). A turn whose suffix
is over the continue bound goes through P (pull or recompute) and matches as well. A streamed
turn whose client hangs up at `[DONE]` still frees its old handle on D.
"""

from __future__ import annotations

import math
import random

import pytest
from dataplane.leasing import eventually, held_after_a_step
from dataplane.turns import counted, moved, reference, reuse, router_completion, same, words

from boomerang.local import calibrate, pdclient
from boomerang.local.engine_client import scrape, tokens_by_source, totals

pytestmark = [pytest.mark.engine, pytest.mark.timeout(900)]

SHORT, LONG = 30, 200
TUNING = {
    "mode": "adaptive",
    # D computes the suffix and the history's last partial block (blocks of 128): SHORT
    # continues (at most 30 + 127), LONG does not (at least 200).
    "continue_max_suffix_tokens": 192,
    "itl_budget_s": 10.0,  # the hard bound decides here, not the learned ITL cost
}


def paths(router: str) -> dict[str, float]:
    return totals(pdclient.scrape(router), "boomerang_router_path_total", "path")


def served(url: str, before: dict[str, float]) -> dict[str, float]:
    after = tokens_by_source(scrape(url))
    return {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}


def turn(plane, router: str, prompt: list[int], *, stream: bool = False):
    """One turn through the router: its tokens and logprobs, the reuse outcome and path it
    counted, and the prompt tokens D served from its cache and computed meanwhile."""
    before = (reuse(router), paths(router), tokens_by_source(scrape(plane.d_url)))
    tokens, logprobs, _ = router_completion(router, plane.model, prompt, "adaptive", stream=stream)
    outcome, path = counted(router, before[0]), moved(before[1], paths(router))
    assert same((tokens, logprobs), reference(plane, prompt)), (outcome, path)
    return tokens, outcome, path, served(plane.d_url, before[2])


def test_short_suffixes_continue_on_the_holder_long_ones_go_through_p(dataplane):
    router = dataplane.router("router-adaptive", tuning=TUNING)
    rng = random.Random(1212)
    # A history long enough that pulling it costs more, by the router's priors (D's prefill
    # 5x P's), than D computing the suffix and the history's last partial block.
    prompt = words(rng, 3000)
    tokens, outcome, path, _ = turn(dataplane, router, prompt)
    assert outcome == {"miss": 1.0} and path == {"recompute": 1.0}

    history = prompt + tokens
    prompt = history + words(rng, SHORT)
    pinned = held_after_a_step(dataplane)
    tokens, outcome, path, d = turn(dataplane, router, prompt, stream=True)
    assert path == {"continue": 1.0}, (outcome, path)
    assert outcome == {"hit": 1.0}
    assert d.get("local_cache_hit", 0.0) >= len(history) - 128  # whole blocks of it
    assert d.get("local_compute", 0.0) <= SHORT + 128
    # The client closed its stream at the end of the answer, while the router was still
    # filing and releasing: the old handle is freed all the same, so D pins no more than
    # before (the new handle in place of the old; other tests' handles may only expire).
    assert eventually(lambda: held_after_a_step(dataplane) <= pinned, within_s=5.0), pinned

    history = prompt + tokens
    prompt = history + words(rng, SHORT)
    tokens, outcome, path, _ = turn(dataplane, router, prompt, stream=True)
    assert outcome == {"hit": 1.0}, (outcome, path)  # the continued turn's handle verified
    assert set(path) <= {"pull", "continue"} and sum(path.values()) == 1.0

    prompt = prompt + tokens + words(rng, LONG)
    _, outcome, path, _ = turn(dataplane, router, prompt)
    assert set(path) <= {"pull", "recompute"} and sum(path.values()) == 1.0, (outcome, path)

    state = pdclient.get_json(f"{router}/boomerang/v1/state")
    assert state["mode"] == "adaptive" and state["paths"]["continue"] >= 1
    assert state["coefficients"]["p_compute_s_per_token"] > 0


def test_the_continue_budget_derives_from_the_decoders_measured_streams(dataplane):
    """With the API's defaults (no ITL budget set) the router measures how long D's streams
    decode and allows a continue only within a tenth of that (`costmodel.itl_budget`) beyond
    what a handover from P costs D's streams: what `/boomerang/v1/state` shows for D is that
    stream time, that budget, and the longest suffix the learned costs fit in it."""
    tuning = {"mode": "adaptive", "slo_aware": False}  # the per-continue rule
    router = dataplane.router("router-derived", tuning=tuning)
    rng = random.Random(1213)
    prompt = words(rng, 2000)
    limits = pdclient.get_json(f"{router}/boomerang/v1/state")["continue_limits"]
    assert [v["stream_s"] for v in limits.values()] == [0.0]  # nothing measured: the fallback
    assert [v["itl_budget_s"] for v in limits.values()] == [0.05]
    for _ in range(3):
        tokens, _outcome, path, _ = turn(dataplane, router, prompt, stream=True)
        assert sum(path.values()) == 1.0
        prompt = prompt + tokens + words(rng, SHORT)
    state = pdclient.get_json(f"{router}/boomerang/v1/state")
    (limit,) = state["continue_limits"].values()
    assert limit["stream_s"] > 0
    assert limit["itl_budget_s"] == pytest.approx(0.1 * limit["stream_s"])
    c = state["coefficients"]
    # what a handover from P costs D's streams anyway, learned from these streams, widens it
    left = limit["itl_budget_s"] + c["stream_handoff_stall_s"] - c["d_fixed_s"]
    per_token = c["d_compute_s_per_token"]
    bound = 8192  # continue_max_suffix_tokens' default
    fits = 0 if left < 0 else bound if per_token <= 0 else min(bound, math.floor(left / per_token))
    assert limit["tokens"] == fits  # one read: the same coefficients


def test_a_first_turn_p_would_make_late_runs_on_the_decoder_alone(dataplane):
    """SLO-aware adaptive (issue 48): with a TTFT bound no P can meet, a first turn runs on the
    decoder alone once the router has measured P's rate (at the priors D computes 5x slower,
    and the first turn of all goes through P). D computes the whole prompt, answers exactly as
    one engine alone, and files a handle: the conversation's next turn verifies it there."""
    router = dataplane.router("router-first-on-d", tuning={"mode": "adaptive", "ttft_slo_s": 1e-3})
    rng = random.Random(1214)
    _, outcome, path, _ = turn(dataplane, router, words(rng, 600), stream=True)
    assert outcome == {"miss": 1.0} and path == {"recompute": 1.0}  # P's rate, measured

    prompt = words(rng, 900)
    tokens, outcome, path, d = turn(dataplane, router, prompt, stream=True)
    # no usable history: none found, or the last conversation's handle rejected on the ids
    assert path == {"continue": 1.0} and set(outcome) <= {"miss", "rejected"}, (outcome, path)
    assert d.get("local_compute", 0.0) >= len(prompt) - 128  # D computed it, no P, no pull
    state = pdclient.get_json(f"{router}/boomerang/v1/state")
    assert state["slo"]["ttft_s"]["1000"] == pytest.approx(1e-3)

    prompt = prompt + tokens + words(rng, SHORT)
    _, outcome, path, _ = turn(dataplane, router, prompt, stream=True)
    assert outcome == {"hit": 1.0}, (outcome, path)  # the handle D filed for its first turn


def test_a_fresh_router_probes_the_idle_decoder_for_its_tpot_bound(dataplane):
    """The SLO-aware choice's TPOT bound is a multiple of an idle decoder's time per token.
    A router started beside busy traffic never sees an idle stream, so it asks the decoder
    once (`idle_probe.py`), reading the decoder's own clock (vLLM's per-request TPOT
    histogram): the time it learns agrees with the benchmark's own measure of the same idle
    decoder, timed by a client (`calibrate.measure_tpot`), and the bound is that times the
    scale."""
    router = dataplane.router("router-probe", tuning={"mode": "adaptive"})

    def probed() -> float:
        state = pdclient.get_json(f"{router}/boomerang/v1/state")
        return float(state["coefficients"]["idle_tpot_s"])

    assert eventually(lambda: probed() > 0, within_s=60.0), "the router never probed D"
    idle = calibrate.measure_tpot(dataplane.d_url, dataplane.model)
    assert 0.7 * idle <= probed() <= 1.3 * idle, (probed(), idle)
    slo = pdclient.get_json(f"{router}/boomerang/v1/state")["slo"]
    assert slo["tpot_s"] == pytest.approx(slo["scale"] * probed())
