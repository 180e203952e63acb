"""The legs a turn may take to its answer, one class each, behind one small protocol.

Why it exists: the plan (`plan.py`) says which legs to try; each leg here is only what makes
its path different, on top of what all share (`serving.py`: failover, the answer, D's new
handle):
- `PrefillDecode`: P then D, with D's handle attached (pull) or not (recompute). A P that
  failed is retried on another P; the handle goes with the retry only when the failed P
  certainly never saw it. A D that failed before the client got a byte is retried on another D,
  after a fresh prefill when the failed D may have read P's blocks. Once every engine of a
  role failed, the other role serves alone if it may (`degraded.py`).
- `Continue`: the decoder that holds the history serves the turn from its own prefix cache,
  with empty KV-transfer intent, streamed as the client asked; D answers with a fresh handle,
  filed as after any D leg, which supersedes the old one. A failure before the client got a
  byte is a `LegFailed` (the turn takes the plan's next leg); after that, a stream ends with an
  in-band error as any D's does. Why continue is exact: vLLM's prefix cache keys each block by
  a hash chained over every token before it (and the request's extra keys), and a lookup walks
  the prompt's blocks from the first and stops at the first miss, so D serves exactly the
  leading whole blocks whose tokens equal the prompt's and computes the rest. The handle is
  not read: it only tells the router those blocks are pinned on that decoder.
- `Alone`: one engine of a role serves the turn as a plain vLLM request when the other role
  has none: no handle is attached to it, none is filed from it (it retains nothing).

A leg returns the response already sent to the client.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from functools import partial
from typing import Any, Final, Protocol

from aiohttp import web

from boomerang.router import apis
from boomerang.router.apis import protocol, usage
from boomerang.router.engines.capabilities import DecodeMode, decode_mode, observe_stream
from boomerang.router.engines.endpoints import Endpoint, Prefilling, Role, compatible
from boomerang.router.engines.failover import Unavailable
from boomerang.router.engines.upstream import UpstreamError, post_json, timeout
from boomerang.router.learning.costmodel import Path
from boomerang.router.turn import degraded
from boomerang.router.turn.serving import Serving
from boomerang.router.turn.settle import settle
from boomerang.router.turn.state import Turn

log = logging.getLogger("boomerang.router")
FALLBACK_BLOCK = 128
"""The slack of `usage.pull_failed` when D's block size is not known (vLLM's CPU default)."""
ANSWERED: Final = frozenset({"status", "client", "protocol"})
"""Failure kinds of an engine that answered (it is alive): after a failed continue P may still
pull from it; after a refused connection or a timeout it may be gone, and P computes instead."""


class LegFailed(Exception):
    """A leg failed before the client got a byte; the turn may take the plan's next leg."""

    def __init__(self, failure: UpstreamError, *, answered: bool) -> None:
        super().__init__(str(failure))
        self.failure = failure
        self.answered = answered
        """The engine answered (it is alive)."""


class Leg(Protocol):
    """One way to a turn's answer."""

    async def run(self, request: web.Request, turn: Turn) -> web.StreamResponse: ...


class PrefillDecode:
    """P then D (pull: D's handle attached; recompute: not)."""

    def __init__(self, serving: Serving) -> None:
        self.s = serving

    async def run(self, request: web.Request, turn: Turn) -> web.StreamResponse:
        try:
            p_params = await self._prefill(turn, turn.p_ep)
            return await self._decode(request, turn, p_params)
        except Unavailable as exc:
            other = self.s.decode if exc.role == "prefill" else self.s.prefill
            fallback = self.s.config.single_engine_fallback
            alone = degraded.after_failure(exc.role, degraded.supply(other), fallback=fallback)
            if alone is None:
                raise
            return await Alone(self.s, alone, exc.message).run(request, turn)

    async def _prefill(self, turn: Turn, first: Endpoint | None) -> dict[str, Any]:
        """P's params for D, from `first` or another prefill engine."""
        return await self.s.on_prefill(turn, partial(self._prefill_once, turn), first=first)

    async def _prefill_once(self, turn: Turn, p_ep: Endpoint) -> dict[str, Any]:
        s = self.s
        holder = s.decode.get(turn.holder)
        if holder is not None and not compatible(p_ep, holder):
            turn.detach()  # P cannot pull from a decoder of another engine revision
        attached = turn.attach()
        api = apis.of(turn.req.kind)
        body = api.prefill_request(turn.req.body, attached)
        t = s.config.timeouts
        ahead = p_ep.work  # what P was sent before this turn and has not answered
        work = s.prefill_work(turn, p_ep)
        if attached is not None:
            work = max(0.0, work - turn.reused_tokens)
        start = time.perf_counter()
        try:
            with s.prefill.track(p_ep, work, s.work(turn)):
                data = await post_json(
                    s.engines,
                    p_ep.url + api.path,
                    body,
                    timeout(t.prefill_s, t.connect_s),
                    turn.engine_request_id("p"),
                )
        except UpstreamError as exc:
            if attached is not None and exc.delivered:
                turn.spend(accepted=False)
            elif attached is not None:
                turn.unsent()  # the connection was refused: the next P may get the handle
            raise
        seconds = time.perf_counter() - start
        s.metrics.prefill_latency.observe(seconds)
        s.prefill.succeeded(p_ep)
        params: dict[str, Any] | None = protocol.kv_params_of(data)
        turn.p_cached = usage.answer_cached(turn.req.kind, data)
        p_ep.reports_cached |= usage.says_cached(turn.req.kind, data)
        failed = False
        if attached is not None:
            failed = params is not None and self._pull_failed(turn, p_ep)
            turn.spend(accepted=params is not None and not failed)  # failed: a fallback
            self._check_prompt_ids(turn, data, p_ep)
        pulled = turn.reused_tokens if attached is not None else 0
        if not failed:  # a failed read and a recompute teach neither path's cost
            s.paths.observe_prefill(
                turn.prompt_ids, data, pulled, seconds, queued=ahead, cached=turn.p_cached
            )
        if params is None:
            raise UpstreamError("protocol", "prefill answered without kv_transfer_params")
        return params

    def _pull_failed(self, turn: Turn, p_ep: Endpoint) -> bool:
        """P answered, but by its own count it did not take what it was sent to pull from D
        (`usage.pull_failed`): it recomputed (a failed NIXL read; vLLM's policy `recompute`).
        Counted and logged; the turn is then a fallback, not a hit."""
        if not p_ep.reports_cached:
            return False  # its count may be absent, not 0: nothing to tell
        holder = self.s.decode.get(turn.holder)
        block = (holder.block_size if holder is not None else None) or FALLBACK_BLOCK
        if not usage.pull_failed(turn.p_cached, turn.reused_tokens, block):
            return False
        self.s.metrics.failed_pulls.inc()
        log.warning(
            "P recomputed what it was sent to pull",
            extra={"engine": p_ep.url, "pulled": turn.reused_tokens, "cached": turn.p_cached},
        )
        return True

    def _check_prompt_ids(self, turn: Turn, data: dict[str, Any], p_ep: Endpoint) -> None:
        """The safety net: P's own prompt ids should be the ones the handle was verified on."""
        p_ids = protocol.prompt_ids_of(data)
        if p_ids is not None and turn.prompt_ids is not None and p_ids != turn.prompt_ids:
            self.s.metrics.prompt_mismatch.inc()
            log.error("Prompt ids differ from tokenize", extra={"engine": p_ep.url})

    async def _decode(
        self, request: web.Request, turn: Turn, p_params: dict[str, Any]
    ) -> web.StreamResponse:
        async def before_retry(failure: UpstreamError) -> None:
            nonlocal p_params
            if failure.delivered:  # D may have read (and so freed) P's blocks: prefill again
                p_params = await self._prefill(turn, None)

        async def call(d_ep: Endpoint) -> web.StreamResponse:
            return await self._decode_once(request, turn, p_params, d_ep)

        return await self.s.on_decode(turn, call, before_retry)

    async def _decode_once(
        self, request: web.Request, turn: Turn, p_params: dict[str, Any], d_ep: Endpoint
    ) -> web.StreamResponse:
        s, api = self.s, apis.of(turn.req.kind)
        mode = decode_mode(turn.req.stream, d_ep, s.config, time.time(), api.can_buffer)
        body = api.decode_request(turn.req.body, p_params, stream=mode == "stream")
        start = time.perf_counter()
        with s.decode.track(d_ep, 1.0):
            result = await s.answer(request, turn, d_ep, body, mode)
        s.metrics.decode_latency.observe(time.perf_counter() - start)
        s.settled(s.decode, d_ep, result)
        prompt_ids = turn.prompt_ids or result.prompt_ids
        if mode == "stream" and turn.first_at and prompt_ids is not None:
            s.paths.observe_decode_first(len(prompt_ids), turn.first_at - start)
        if mode == "stream" and result.finished and api.can_buffer:
            observe_stream(d_ep, result.params is not None, time.time())
        if result.finished:
            s.place(turn, result, d_ep)
            await settle(s.file(turn, result, d_ep))
        assert result.response is not None
        return result.response


class Continue:
    """The decoder holding the history serves the turn alone (see the module docstring)."""

    def __init__(self, serving: Serving, holder: Endpoint) -> None:
        self.s = serving
        self.holder = holder

    async def run(self, request: web.Request, turn: Turn) -> web.StreamResponse:
        s, holder, api = self.s, self.holder, apis.of(turn.req.kind)
        mode = decode_mode(turn.req.stream, holder, s.config, time.time(), api.can_buffer)
        body = apis.continue_request(api, turn.req.body, stream=mode == "stream")
        turn.decode_url = holder.url
        computed = len(turn.prompt_ids or ()) - turn.reused_tokens_verified
        start = time.perf_counter()
        try:
            with s.decode.track(holder, 1.0), Prefilling(holder, computed) as own:
                turn.on_first = own.done
                result = await s.answer(request, turn, holder, body, mode, "c")
        except UpstreamError as exc:
            s.failover.failed(s.decode, holder, exc)
            turn.decode_url = None
            log.warning("Continue failed, serving on P and D", extra={"engine": holder.url})
            raise LegFailed(exc, answered=exc.kind in ANSWERED and not holder.ejected) from None
        turn.continued_on_holder()
        s.metrics.decode_latency.observe(time.perf_counter() - start)
        s.settled(s.decode, holder, result)
        self._observe(turn, result.finished and api.can_buffer, result.params, mode, start)
        if result.finished:
            s.place(turn, result, holder)
        filed = result.finished and await settle(s.file(turn, result, holder))
        if filed and turn.handle is not None:  # a first turn served here had none
            s.release(turn.supersede(), "superseded")
        assert result.response is not None
        return result.response

    def _observe(
        self, turn: Turn, finished: bool, params: Any, mode: DecodeMode, start: float
    ) -> None:
        """D's time to first token on the continue path (streamed, pinned history only: for a
        released one what D computed is unknown)."""
        if mode != "stream":
            return
        released = turn.handle is not None and turn.handle.released
        if turn.first_at and not released and turn.prompt_ids is not None:
            computed = len(turn.prompt_ids) - turn.reused_tokens_verified
            self.s.paths.observe_continue(computed, turn.first_at - start)
        if finished:
            observe_stream(self.holder, params is not None, time.time())


class DecodeFirst:
    """Decode-first routing's short turn (`decode_first.py`): the decoder that caches most of
    the prompt serves it as a plain request, computing only what its prefix cache lacks. No
    handle exists (bidirectional is off): the turn counts as continued on that decoder, and
    its placement is remembered like any D's."""

    def __init__(self, serving: Serving, d_ep: Endpoint) -> None:
        self.s, self.d_ep = serving, d_ep

    async def run(self, request: web.Request, turn: Turn) -> web.StreamResponse:
        s, api = self.s, apis.of(turn.req.kind)
        body = api.plain_request(turn.req.body)
        mode: DecodeMode = "stream" if turn.req.stream else "json"
        turn.planned(Path.CONTINUE)

        async def call(d_ep: Endpoint) -> web.StreamResponse:
            turn.decode_url = d_ep.url
            with s.decode.track(d_ep, 1.0):
                result = await s.answer(request, turn, d_ep, body, mode, "c")
            s.settled(s.decode, d_ep, result)
            turn.continued_on_holder()
            if result.finished:
                s.place(turn, result, d_ep)
            assert result.response is not None
            return result.response

        def pick(candidates: Sequence[Endpoint]) -> Endpoint:  # after a failure: any D
            return s.strategy.decode(candidates, None)

        retries = s.config.decode_retries
        return await s.failover.run(s.decode, pick, call, retries=retries, first=self.d_ep)


class Alone:
    """One engine of `role` serves the turn as a plain request: no handle attached, none filed
    (the engine retains nothing), retried on the role's other engines like D is."""

    def __init__(self, serving: Serving, role: Role, why: str) -> None:
        self.s, self.role, self.why = serving, role, why

    async def run(self, request: web.Request, turn: Turn) -> web.StreamResponse:
        s, role = self.s, self.role
        gone = degraded.other_role(role)
        s.metrics.degraded_turns.labels(gone).inc()
        log.warning(
            "Serving turn on one engine", extra={"role": role, "missing": gone, "reason": self.why}
        )
        turn.serve_alone(role)
        body = apis.of(turn.req.kind).plain_request(turn.req.body)
        mode: DecodeMode = "stream" if turn.req.stream else "json"
        pool = s.pool_of(role)

        async def call(ep: Endpoint) -> web.StreamResponse:
            load = (s.prefill_work(turn, ep), s.work(turn)) if role == "prefill" else (1.0, 0.0)
            with pool.track(ep, *load):
                result = await s.answer(request, turn, ep, body, mode)
            s.settled(pool, ep, result)
            assert result.response is not None
            return result.response

        if role == "prefill":
            return await s.on_prefill(turn, call)
        return await s.on_decode(turn, call)


def leg_for(serving: Serving, path: Path, holder: Endpoint | None) -> Leg:
    """The leg that runs `path` (continue needs the holder)."""
    if path is Path.CONTINUE:
        assert holder is not None
        return Continue(serving, holder)
    return PrefillDecode(serving)
