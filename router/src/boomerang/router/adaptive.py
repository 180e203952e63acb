"""The adaptive part of a verified turn: its cheapest path, and the continue path on the holder.

Why it exists apart from `flow.py`: the P/D flow is the same in both modes; this is what
`adaptive` mode adds in front of it (the `Router` mixes it in). A verified turn asks the cost
model (`paths.py`) for its path:
- pull: the P/D flow with the handle (as in `static` mode);
- recompute: the handle is declined (never offered again; retention may release D's blocks)
  and the P/D flow computes the whole prompt on P;
- continue: the turn goes straight to the decoder that holds (or, for a handle whose lease
  was released, held) the history, with empty
  KV-transfer intent (`apis.continue_request`), streamed as the client asked (the decode
  mode is chosen as for D after P). D answers with a fresh handle, filed as after any D leg;
  then the old one is superseded. If D fails before the client got a byte, the turn is served
  on P and D instead, with the handle still unused (P never saw it): pull when the holder
  answered (it is alive) and the model prefers it, else recompute.

A released handle (`Handle.released`: retention freed D's blocks, which stay in D's prefix
cache until D needs the room) is never pulled: only continue or recompute. Its continued turn
counts outcome `cached`, and its time is not learned (how much of the history D still had is
unknown); what D evicted it computes again, which costs time and never correctness.

Why continue is exact, also for a partial: vLLM's prefix cache keys each full block by a hash
chained from the block before it and the block's own token ids (plus the request's extra keys:
LoRA, multimodal inputs, cache salt), and a lookup walks the new prompt's blocks from the first
and stops at the first one not cached, never reaching the prompt's last token (vLLM 0.32,
`vllm.v1.core`: `hash_block_tokens`, `find_longest_cache_hit`). So D serves from its cache
exactly the leading whole blocks whose tokens equal the prompt's: for a hit all of its held
history but a trailing partial block, for a partial the blocks of the common prefix, and it
computes the rest. Nothing is read through the handle: it only tells the router that those
blocks are still pinned on that decoder (held for the decoder TTL, so not evicted), which is
what makes continue cheap, not what makes it correct.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any, Final

from aiohttp import web

from boomerang.connector.config import CONTINUE_CAPABILITY
from boomerang.router import apis
from boomerang.router import conversation as conv
from boomerang.router.apis import DecodeResult
from boomerang.router.capabilities import DecodeMode, decode_mode, observe_stream
from boomerang.router.config import RouterConfig
from boomerang.router.costmodel import Path
from boomerang.router.endpoints import Endpoint, Pool, Strategy
from boomerang.router.failover import Failover
from boomerang.router.hooks import RetentionHooks
from boomerang.router.metrics import Metrics
from boomerang.router.paths import PathBook
from boomerang.router.reuse import Outcome
from boomerang.router.settle import settle
from boomerang.router.turn import Turn
from boomerang.router.upstream import UpstreamError

log = logging.getLogger("boomerang.router")

ANSWERED: Final = frozenset({"status", "client", "protocol"})
"""Failure kinds of an engine that answered (it is alive): after a failed continue P may still
pull from it; after a refused connection or a timeout it may be gone, and P computes instead."""


class AdaptivePaths:
    """Path choice and the continue path, mixed into `flow.Router` (which has these fields)."""

    config: RouterConfig
    decode: Pool
    strategy: Strategy
    metrics: Metrics
    failover: Failover
    paths: PathBook
    retention: RetentionHooks

    def state(self) -> dict[str, Any]:
        """What is in force (`GET /boomerang/v1/state`): mode, break-even, paths taken, the
        cost model's coefficients, and retention's part."""
        return {**self.paths.state(), **self.retention.state()}

    async def _choose(self, request: web.Request, turn: Turn) -> web.StreamResponse:
        """Pull, recompute or continue for a verified turn; a continue whose decoder failed
        before the client got a byte is served on P and D instead (never dropped)."""
        assert turn.prompt_ids is not None and turn.reuse is not None
        prompt, reusable = len(turn.prompt_ids), turn.reuse.tokens
        assert turn.handle is not None
        pullable = not turn.handle.released  # released: only D's prefix cache has the blocks
        holder = self._continue_holder(turn)
        choice = self.paths.choose(prompt, reusable, holder is not None, pullable)
        turn.chosen = choice.path
        log.debug("Chose path", extra={"path": str(choice.path), "reason": choice.reason})
        if choice.path is Path.CONTINUE:
            assert holder is not None
            failure = await self._continue(request, turn, holder)
            if isinstance(failure, web.StreamResponse):
                return failure
            choice = self.paths.choose(prompt, reusable, False, pullable)
            if not self._may_pull_after(holder, failure):
                choice = dataclasses.replace(choice, path=Path.RECOMPUTE)
        if choice.path is Path.RECOMPUTE:
            self._release(turn.decline(), "recompute")
        return await self._serve(request, turn)

    def _continue_holder(self, turn: Turn) -> Endpoint | None:
        """The decoder holding the history, if it may serve the turn itself: listed, not
        ejected, running Boomerang's plugin with its `continue` change in force (without it
        vLLM 0.32 never frees a request D served alone: refused, not silently leaking), and
        not so much busier than the others that decode would avoid it. (No P is involved, so
        no revision pairing matters.)"""
        holder = self.decode.get(turn.holder)
        if holder is None or holder.ejected or CONTINUE_CAPABILITY not in holder.capabilities:
            return None
        if self.strategy.decode(self.decode.candidates(), holder.url) is not holder:
            return None
        return holder

    def _may_pull_after(self, holder: Endpoint, failure: UpstreamError) -> bool:
        """After a failed continue: whether P may still pull from the holder (it answered and
        is not ejected); one that refused or timed out may be gone (P could hang on it)."""
        return failure.kind in ANSWERED and not holder.ejected

    async def _continue(
        self, request: web.Request, turn: Turn, holder: Endpoint
    ) -> web.StreamResponse | UpstreamError:
        """The turn on the holder alone; its failure when it failed before the client got a
        byte (after that, a stream ends with an in-band error as any D's does)."""
        api = apis.of(turn.req.kind)
        mode = decode_mode(turn.req.stream, holder, self.config, time.time(), api.can_buffer)
        body = apis.continue_request(api, turn.req.body, stream=mode == "stream")
        turn.decode_url = holder.url
        start = time.perf_counter()
        try:
            with self.decode.track(holder, 1.0):
                result = await self._answer(request, turn, holder, body, mode, "c")
        except UpstreamError as exc:
            self.failover.failed(self.decode, holder, exc)
            turn.decode_url = None
            log.warning("Continue failed, serving on P and D", extra={"engine": holder.url})
            return exc
        turn.continued = True
        released = turn.handle is not None and turn.handle.released
        if released:
            turn.outcome = Outcome.CACHED
        self.metrics.decode_latency.observe(time.perf_counter() - start)
        self.decode.succeeded(holder)
        if mode == "stream":
            if turn.first_at and not released:  # released: what D computed is unknown
                assert turn.prompt_ids is not None and turn.reuse is not None
                computed = len(turn.prompt_ids) - turn.reuse.tokens
                self.paths.observe_continue(computed, turn.first_at - start)
            if result.finished and api.can_buffer:
                observe_stream(holder, result.params is not None, time.time())
        if result.finished and await settle(self._file(turn, result, holder)):
            self._release(turn.supersede(), "superseded")
        assert result.response is not None
        return result.response

    def _release(self, handle: conv.Handle | None, reason: str) -> None:
        """Tell retention a handle will never be offered again (it may free D's blocks; the
        turn does not wait for that)."""
        if handle is None:
            return
        try:
            self.retention.superseded(handle, reason)
        except Exception as exc:  # retention's own failures never fail a turn
            log.warning("Retention failed", extra={"error": repr(exc), "reason": reason})

    # -- what the flow provides -------------------------------------------------------------

    async def _serve(self, request: web.Request, turn: Turn) -> web.StreamResponse:
        raise NotImplementedError

    async def _answer(
        self,
        request: web.Request,
        turn: Turn,
        ep: Endpoint,
        body: dict[str, Any],
        mode: DecodeMode,
        stage: str = "d",
    ) -> DecodeResult:
        raise NotImplementedError

    async def _file(self, turn: Turn, result: DecodeResult, d_ep: Endpoint) -> bool:
        raise NotImplementedError
