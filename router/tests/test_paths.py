"""Adaptive mode through the router and the fake engines: each verified turn takes the path the
cost model chose (pull, recompute, or continue on the decoder holding the history), a failed
continue falls back to P and D, retention hears about every handle let go, and static mode
keeps today's flow while counting its paths."""

from __future__ import annotations

import asyncio
import dataclasses
import math
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from router_testing import chat, filed, post, stream

from boomerang.router import conversation as conv
from boomerang.router.apis.protocol import CONTINUE_PARAMS
from boomerang.router.app import ROUTER
from boomerang.router.auth import ANONYMOUS
from boomerang.router.learning.costmodel import DEFAULT_PRIORS, CostModel
from boomerang.router.turn.cache_salt import engine_salt
from boomerang.router.turn.flow import Router

ADAPTIVE = {"tuning": {"mode": "adaptive", "itl_budget_s": 0.05}}
"""The budget pinned: the fakes stream in milliseconds, and a budget derived from that
refuses every continue (`test_the_itl_budget_derives_from_the_decoders_streams`)."""
PULL_ONLY = {"tuning": {"mode": "adaptive", "continue_on_decode": False}, "recompute_threshold": 0}
"""The fake conversations are short: below the default threshold P would recompute anyway."""
RECOMPUTE_ONLY = {
    "tuning": {"mode": "adaptive", "continue_on_decode": False, "break_even_min_tokens": 10**6}
}
SLOW_P = dataclasses.replace(DEFAULT_PRIORS, p_fixed_s=5.0)
"""Priors under which P is so slow that every allowed continue wins."""


class Frozen(CostModel):
    """The real model at its priors: it learns nothing from the fake engines' timings (which
    would make its choices depend on this machine's load)."""

    def observe_prefill(
        self, computed_tokens: int, pulled_tokens: int, seconds: float, queued: float = 0.0
    ) -> None:
        return None

    def observe_decode_first(self, prompt_tokens: int, seconds: float) -> None:
        return None

    def observe_continue(self, computed_tokens: int, seconds: float) -> None:
        return None

    def observe_stream(
        self, output_tokens: int, continued: int, handed_over: int, others: float, seconds: float
    ) -> None:
        return None


class Recorder:
    """Retention that records what the flow tells it."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any, ...]] = []
        self.probes: list[int | None] = []

    def filed(
        self,
        key: bytes,
        handle: conv.Handle,
        tenant: str,
        now: float,
        *,
        replaced: Any = None,
        hint_s: float | None = None,
        p_probe: int | None = None,
    ) -> None:
        self.calls.append(("filed", key, handle, replaced))
        self.probes.append(p_probe)

    def taken(self, key: bytes, tenant: str, now: float) -> None:
        self.calls.append(("taken", key))

    def learned_s(self, tenant: str, now: float) -> float | None:
        return None

    def superseded(self, handle: conv.Handle, reason: str) -> None:
        self.calls.append(("superseded", handle, reason))

    async def run(self) -> None:
        return None

    def state(self) -> dict[str, Any]:
        return {"retained_blocks": 7}

    def released(self) -> list[tuple[conv.Handle, str]]:
        return [(c[1], c[2]) for c in self.calls if c[0] == "superseded"]

    def filed_handles(self) -> list[conv.Handle]:
        return [c[2] for c in self.calls if c[0] == "filed"]


def router_of(
    w: Any, priors: Any = DEFAULT_PRIORS, *, learn: bool = False
) -> tuple[Router, Recorder]:
    router = w.client.server.app[ROUTER]
    router.retention = retention = Recorder()
    router.paths.model = CostModel(priors) if learn else Frozen(priors)
    return router, retention


async def until(check: Callable[[], Awaitable[bool]]) -> None:
    """The turn is counted just after its answer went out."""
    for _ in range(200):
        if await check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("never")


async def paths(w: Any) -> dict[str, float]:
    return {p: await w.metric("boomerang_router_path_total", path=p) for p in PATHS}


PATHS = ("pull", "recompute", "continue")


async def conversation(w: Any, turns: int, **extra: Any) -> list[dict[str, Any]]:
    """`turns` turns of one conversation (short suffixes); the messages of the last."""
    messages = [{"role": "user", "content": "hello there"}]
    for i in range(turns):
        status, body = await post(w, chat(messages, conversation_id="c", **extra))
        assert status == 200, body
        await filed(w, i + 1)
        messages = [*messages, body["choices"][0]["message"], {"role": "user", "content": "go"}]
    return messages


async def test_a_short_suffix_continues_on_the_holder_and_leaves_a_verified_handle(
    world: Any,
) -> None:
    w = await world(**ADAPTIVE)
    router, retention = router_of(w, SLOW_P)
    await conversation(w, 3)
    d_calls, p_calls = w.decode[0].calls, w.prefill[0].calls
    assert len(p_calls) == 1  # only the first turn went through P
    assert [c["kv_transfer_params"] for c in d_calls[1:]] == [CONTINUE_PARAMS] * 2
    assert d_calls[1]["return_token_ids"] is True
    await until(lambda: _equals(w, "continue", 2))
    assert await paths(w) == {"pull": 0, "recompute": 1, "continue": 2}
    assert await w.reuse("hit") == 2  # the third turn verified the handle the second filed
    filed_handles = retention.filed_handles()
    assert retention.released() == [(h, "superseded") for h in filed_handles[:2]]
    assert w.fabric.violations == []
    state = router.state()
    assert state["mode"] == "adaptive"
    assert state["paths"] == {"pull": 0, "recompute": 1, "continue": 2}
    assert state["retained_blocks"] == 7
    assert set(state["coefficients"]) >= {"p_compute_s_per_token", "d_compute_s_per_token"}
    assert w.decode[0].request_ids[1].rsplit("-", 1)[1].startswith("c")


async def _equals(w: Any, path: str, n: float) -> bool:
    return await w.metric("boomerang_router_path_total", path=path) == n


async def test_a_streamed_continue_relays_d_and_teaches_the_model(world: Any) -> None:
    w = await world(
        prefill_spec={"version": "0.33.0"},
        decode_spec={"stream_params": True, "version": "0.33.0"},
        **ADAPTIVE,
    )
    router, retention = router_of(w, SLOW_P, learn=True)
    messages = [{"role": "user", "content": "hello there"}]
    for i in range(2):
        events = await stream(w, chat(messages, conversation_id="s"))
        text = "".join(c["choices"][0]["delta"].get("content", "") for c in events if c["choices"])
        assert text and all("kv_transfer_params" not in e for e in events)
        await filed(w, i + 1)
        messages += [{"role": "assistant", "content": text}, {"role": "user", "content": "go"}]
    assert w.decode[0].calls[1]["stream"] is True
    assert w.decode[0].calls[1]["kv_transfer_params"] == CONTINUE_PARAMS
    observed = router.paths.model.coefficients().observations
    assert observed["continue"] == 1 and observed["decode_first"] == 1
    assert observed["prefill"] == 1
    assert observed["stream"] == 2  # both streams on D, what joined D's batch during each
    (d,) = router.decode.endpoints.values()
    assert d.joined == (1, 1)  # the first turn handed over from P, the second continued
    await until(lambda: _equals(w, "continue", 1))
    filed_handles = retention.filed_handles()
    assert retention.released() == [(filed_handles[0], "superseded")]  # the turn-1 handle


async def test_pull_in_adaptive_mode_is_todays_flow(world: Any) -> None:
    w = await world(**PULL_ONLY)
    _, retention = router_of(w)
    await conversation(w, 2)
    assert w.prefill[0].calls[1]["kv_transfer_params"]["remote_block_ids"]
    assert [who for who, _ in w.fabric.pulls] == ["decode", "prefill", "decode"]
    await until(lambda: _equals(w, "pull", 1))
    assert await paths(w) == {"pull": 1, "recompute": 1, "continue": 0}
    assert retention.released() == []
    assert w.fabric.violations == []


async def test_recompute_declines_the_handle_and_releases_its_blocks(world: Any) -> None:
    w = await world(**RECOMPUTE_ONLY)
    _, retention = router_of(w)
    await conversation(w, 2)
    assert w.prefill[0].calls[1]["kv_transfer_params"]["remote_block_ids"] is None
    assert [who for who, _ in w.fabric.pulls] == ["decode", "decode"]  # P pulled nothing
    await until(lambda: _equals(w, "recompute", 2))
    assert await w.reuse("fallback") == 1
    assert retention.released() == [(retention.filed_handles()[0], "recompute")]
    assert w.fabric.violations == []


async def test_a_continue_that_fails_before_a_byte_falls_back_to_pull(world: Any) -> None:
    w = await world(n_decode=2, recompute_threshold=0, **ADAPTIVE)
    _, retention = router_of(w, SLOW_P)
    messages = await conversation(w, 1)
    (holder,) = [d for d in w.decode if d.calls]
    other = next(d for d in w.decode if d is not holder)
    holder.fail_status = 500
    status, body = await post(w, chat(messages, conversation_id="c"))
    assert status == 200, body
    assert holder.calls[-2]["kv_transfer_params"] == CONTINUE_PARAMS  # the continue, failed
    # Pull: P got the unused handle; D's leg failed on the holder again, so P computed once
    # more (the holder may have read P's blocks) and the other decoder answered.
    first_try, again = w.prefill[0].calls[1:]
    assert first_try["kv_transfer_params"]["remote_engine_id"] == holder.engine_id
    assert again["kv_transfer_params"]["remote_block_ids"] is None
    assert len(other.calls) == 1
    assert ("prefill", retention.filed_handles()[0].num_tokens) in w.fabric.pulls
    await until(lambda: _equals(w, "pull", 1))
    assert await paths(w) == {"pull": 1, "recompute": 1, "continue": 0}
    assert retention.released() == []
    assert w.fabric.violations == []


async def test_no_continue_on_a_decoder_without_the_plugin_s_change(world: Any) -> None:
    """Without Boomerang's plugin, vLLM 0.32's D never frees a request it served alone: the
    router must not send it one (the path is refused: P and D serve the turn, exactly)."""
    w = await world(decode_spec={"capabilities": ()}, recompute_threshold=0, **ADAPTIVE)
    router_of(w, SLOW_P)
    await conversation(w, 2)
    assert all(c["kv_transfer_params"] != CONTINUE_PARAMS for c in w.decode[0].calls)
    assert len(w.prefill[0].calls) == 2  # both turns went through P
    await until(lambda: _equals(w, "pull", 1))
    assert await paths(w) == {"pull": 1, "recompute": 1, "continue": 0}
    assert w.fabric.violations == []


async def test_no_continue_when_the_holder_is_gone(world: Any) -> None:
    w = await world(**ADAPTIVE)
    router, _ = router_of(w, SLOW_P)
    messages = await conversation(w, 1)
    router.decode.candidates()[0].ejected = True  # its turn still goes to it: the only D
    await post(w, chat(messages, conversation_id="c"))
    assert all(c["kv_transfer_params"] != CONTINUE_PARAMS for c in w.decode[0].calls)


async def test_static_mode_counts_pull_and_recompute(world: Any) -> None:
    w = await world()
    router, retention = router_of(w, SLOW_P)  # would continue, were it adaptive
    await conversation(w, 2)
    await until(lambda: _equals(w, "pull", 1))
    assert await paths(w) == {"pull": 1, "recompute": 1, "continue": 0}
    assert all(c["kv_transfer_params"] != CONTINUE_PARAMS for c in w.decode[0].calls)
    assert router.state()["mode"] == "static"
    assert await w.metric("boomerang_router_break_even_tokens") == 0  # the priors: the floor
    text = await (await w.client.get("/metrics")).text()
    assert 'boomerang_router_cost_coefficient{name="p_fixed_s"}' in text
    assert retention.released() == []


async def test_a_partial_continues_too(world: Any) -> None:
    """The template drops the reasoning D generated: D's cache serves the blocks before it
    (vLLM's prefix cache matches whole blocks by their chained token hashes), the router
    counts the partial it verified."""
    w = await world(decode_spec={"reasoning": True}, tuning={"mode": "adaptive", "itl_budget_s": 1})
    _, retention = router_of(w, SLOW_P)
    messages = [{"role": "user", "content": OPENING}]
    status, first = await post(w, chat(messages, conversation_id="p"))
    assert status == 200
    await filed(w, 1)
    reply = first["choices"][0]["message"]
    messages += [
        {"role": "assistant", "content": reply["content"]},
        {"role": "user", "content": "ok"},
    ]
    status, _ = await post(w, chat(messages, conversation_id="p"))
    assert status == 200
    assert w.decode[0].calls[-1]["kv_transfer_params"] == CONTINUE_PARAMS
    await until(lambda: _equals(w, "continue", 1))
    assert await w.reuse("partial") == 1
    assert [c[0] for c in retention.calls] == ["taken", "filed", "taken", "filed", "superseded"]
    assert w.fabric.violations == []


OPENING = "tell me how the printing press changed the way news travelled across europe, " * 2


# -- the ITL budget, derived from how long D's streams decode (issue 36) ------------------------


async def test_the_itl_budget_derives_from_the_decoders_streams(world: Any) -> None:
    """Unpinned, the budget is a tenth of the holder's measured stream time: a fake D that
    streams in milliseconds leaves no room for D's fixed cost (20 ms at the priors), so on a
    D serving many streams the follow-up goes through P; one that takes about a second per
    stream allows a continue within the budget."""
    tuning = {"mode": "adaptive", "slo_aware": False}  # the per-continue rule
    specs = {"prefill_spec": {"version": "0.33.0"}, "tuning": tuning}
    fast = await world(decode_spec={"stream_params": True, "version": "0.33.0"}, **specs)
    router, _ = router_of(fast, SLOW_P)
    unmeasured = {"stream_s": 0.0, "itl_budget_s": 0.05, "tokens": 30}
    assert list(router.state()["continue_limits"].values()) == [unmeasured]
    # nothing measured yet: the fallback, (50 - 20) ms / 1 ms per token at the priors
    busy(router)
    await streamed_conversation(fast, 2)
    await until(lambda: _equals(fast, "recompute", 1))
    assert (await paths(fast))["continue"] == 0
    (limit,) = router.state()["continue_limits"].values()
    assert 0 < limit["stream_s"] < 0.2
    assert limit["itl_budget_s"] == pytest.approx(0.1 * limit["stream_s"])
    assert limit["tokens"] == 0

    slow_d = {"stream_params": True, "version": "0.33.0", "chunk_delay_s": 0.25}
    slow = await world(decode_spec=slow_d, **specs)
    router, _ = router_of(slow, SLOW_P)
    busy(router)
    await streamed_conversation(slow, 2)
    await until(lambda: _equals(slow, "continue", 1))
    (limit,) = router.state()["continue_limits"].values()
    assert limit["stream_s"] >= 0.75  # 4 words and the end, 0.25 s apart
    assert limit["tokens"] == math.floor((0.1 * limit["stream_s"] - 0.02) / 1e-3)


def busy(router: Router) -> None:
    """Every decoder serves a thousand other streams, as the router counts them: over the
    ITL budget no continue pays (`costmodel._overrun_pays`)."""
    for ep in router.decode.endpoints.values():
        ep.inflight += 1000


async def test_over_the_budget_an_idle_holder_still_takes_the_turn(world: Any) -> None:
    """The same fast D (its budget below D's fixed cost) serving nothing else: a continue
    stalls no stream and saves P's hop, so the follow-up continues all the same."""
    fast = await world(
        decode_spec={"stream_params": True, "version": "0.33.0"},
        prefill_spec={"version": "0.33.0"},
        tuning={"mode": "adaptive"},
    )
    router, _ = router_of(fast, SLOW_P)
    await streamed_conversation(fast, 2)
    await until(lambda: _equals(fast, "continue", 1))
    (limit,) = router.state()["continue_limits"].values()
    assert limit["tokens"] == 0  # within the budget alone it would have gone through P


async def streamed_conversation(w: Any, turns: int) -> None:
    """`turns` streamed turns of one conversation (the router measures D's streams)."""
    messages = [{"role": "user", "content": "hello there"}]
    for i in range(turns):
        events = await stream(w, chat(messages, conversation_id="s"))
        text = "".join(c["choices"][0]["delta"].get("content", "") for c in events if c["choices"])
        await filed(w, i + 1)
        messages += [{"role": "assistant", "content": text}, {"role": "user", "content": "go"}]


async def test_a_filed_lease_names_the_last_block_of_the_prompt_p_computed(world: Any) -> None:
    """Retention releases first, under D's budget, the leases whose history P still holds; it
    asks the KV index about the last whole block of each turn's prompt, which the flow names
    when it files the handle (unverified first turn and verified follow-up alike)."""
    from fake_tokenizer import render_chat

    from boomerang.router.engines import blockhash

    w = await world(**ADAPTIVE)
    router, retention = router_of(w)
    assert router.kv is not None
    router.kv.block_size = 16  # as the engines' KV events say
    messages = [{"role": "user", "content": "hello there " * 20}]
    prompts = []
    for i in range(2):
        prompts.append(render_chat(messages))
        status, body = await post(w, chat(messages, conversation_id="k"))
        assert status == 200, body
        await filed(w, i + 1)
        messages = [*messages, body["choices"][0]["message"], {"role": "user", "content": "go"}]
    salt = engine_salt(ANONYMOUS)  # the router salts every tenant's requests
    assert retention.probes == [blockhash.prompt_hashes(ids, 16, salt=salt)[-1] for ids in prompts]
