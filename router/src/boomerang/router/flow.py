"""One turn through P and D: claim a verified handle, prefill, decode, file D's new handle.

The order of events is what keeps reuse correct:
1. Take (atomically) the conversation's handle, if any. From here no concurrent turn can get it.
2. Choose P, verify the handle against the new prompt's token ids (see `conversation.py` and
   `reuse.py`): attach it whole if the ids extend D's exact sequence (hit), narrowed to the
   whole blocks of the common prefix if those are enough (partial), else not at all.
3. Prefill. A handle P may have seen is spent (P's read, or its decision not to read, frees D's
   blocks): it is never given to another engine. If P certainly never saw it (connection
   refused), the retry on another P still carries it; otherwise the retry recomputes. A handle
   that was not used and never reached an engine goes back to the store.
4. Decode, preferring the D that holds the conversation. A D failure before the client got a
   byte is retried on another D; P's params are reused only if the failed D certainly never
   saw them, otherwise the turn is prefilled again (without a handle) for the new D.
5. File D's retained params with the hashes of D's tokens (whole and per block, at the block
   size D reported) under the conversation's key.

When a role has no engine (at the start, or once every one failed for the turn) the turn is
served by one engine of the other role as a plain request (`degraded.py`): a taken handle goes
back to the store unused and nothing is filed.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from boomerang.router import conversation as conv
from boomerang.router import degraded, protocol
from boomerang.router.capabilities import decode_mode, observe_stream
from boomerang.router.config import RouterConfig
from boomerang.router.decode import DecodeResult, call_and_answer
from boomerang.router.endpoints import Endpoint, Pool, Role, Strategy
from boomerang.router.engine_http import EngineClient
from boomerang.router.errors import ApiError
from boomerang.router.metrics import Metrics
from boomerang.router.reuse import decide
from boomerang.router.store import ConversationStore
from boomerang.router.turn import ATTACHED, Turn
from boomerang.router.upstream import (
    Unavailable,
    UpstreamError,
    client_error,
    post_json,
    timeout,
    unavailable,
)
from boomerang.router.validation import ClientRequest

log = logging.getLogger("boomerang.router")
PATHS = {"chat": "/v1/chat/completions", "completion": "/v1/completions"}


@dataclass
class Router:
    """Everything a turn needs; one per app."""

    config: RouterConfig
    prefill: Pool
    decode: Pool
    strategy: Strategy
    store: ConversationStore
    metrics: Metrics
    engines: EngineClient

    async def handle(self, request: web.Request, req: ClientRequest, tenant: str) -> Any:
        """Serve one chat or completion request; returns the response already sent."""
        turn = Turn(req, tenant)
        try:
            return await self._serve(request, turn)
        finally:
            await self._return_unused(turn)
            self._count(turn)
            if log.isEnabledFor(logging.INFO):
                log.info("Served turn", extra=turn.summary())

    async def _serve(self, request: web.Request, turn: Turn) -> web.StreamResponse:
        """P then D; one engine alone when a role has no engine (see `degraded.py`)."""
        fallback = self.config.single_engine_fallback
        p, d = degraded.supply(self.prefill), degraded.supply(self.decode)
        path = degraded.route(p, d, fallback=fallback)
        if path is None:
            raise ApiError(503, degraded.no_engine_message(p, d), type_="service_unavailable")
        if path == "prefill" or path == "decode":
            await self._claim(turn, verify=False)  # only to hand it back: no P will see it
            why = degraded.reason(degraded.other_role(path), d if path == "prefill" else p)
            return await self._alone(request, turn, path, why)
        try:
            turn.p_ep = self._pick_prefill(set())
            await self._claim(turn)
            p_params, turn.p_ep = await self._prefill(turn, turn.p_ep)
            return await self._decode(request, turn, p_params, turn.p_ep)
        except Unavailable as exc:  # every engine of a role failed for this turn
            other = self.decode if exc.role == "prefill" else self.prefill
            alone = degraded.after_failure(exc.role, degraded.supply(other), fallback=fallback)
            if alone is None:
                raise
            return await self._alone(request, turn, alone, exc.message)

    def _count(self, turn: Turn) -> None:
        m = self.metrics
        m.reuse.labels(turn.outcome).inc()
        if turn.outcome in ATTACHED:
            m.reused_tokens.labels(turn.outcome).inc(turn.reused_tokens)
        if turn.outcome == "partial" and turn.prompt_ids:
            m.reused_fraction.observe(turn.reused_tokens / len(turn.prompt_ids))

    # -- reuse ------------------------------------------------------------------------------

    async def _claim(self, turn: Turn, *, verify: bool = True) -> None:
        """Take the conversation's handle and attach it if it verifies (`verify`: false for a
        turn no P will serve: the handle is only held, and goes back to the store)."""
        if not (self.config.bidirectional and turn.req.single_choice):
            return
        turn.lookup_key = turn.find_key(self.config.fingerprint_conversations)
        if turn.lookup_key is None:
            return
        try:
            status, handle = await self.store.take(turn.lookup_key, time.time())
        except Exception as exc:
            self.metrics.store_errors.labels("take").inc()
            log.warning("Store take failed", extra={"error": repr(exc)})
            return
        turn.outcome = "expired" if status == "expired" else "miss"
        if handle is None:
            return
        turn.holder = handle.decode_url
        holder = self.decode.get(handle.decode_url)
        made_at = handle.expires_at - self.config.effective_handle_ttl_s
        if holder is None or holder.ejected or holder.lost_at >= made_at:
            # The pod is gone, down, or went down after D retained these blocks (a restart
            # loses them, and vLLM 0.32's P hangs reading a restarted D): recompute.
            turn.outcome = "fallback"
            return
        turn.taken = handle
        if verify:
            await self._verify(turn, handle)
        else:
            turn.outcome = "fallback"

    async def _verify(self, turn: Turn, handle: conv.Handle) -> None:
        ids = protocol.known_prompt_ids(turn.req)
        if ids is None:
            ids = await self._tokenize(turn)
        if ids is None:
            turn.outcome = "fallback"
            return
        turn.prompt_ids = ids
        cfg = self.config
        reuse = decide(handle, ids, cfg.recompute_threshold, partial=cfg.partial_reuse)
        turn.outcome = reuse.outcome
        if reuse.params is None:
            turn.taken = None  # rejected: D's blocks hold nothing this conversation can use
            return
        turn.attached, turn.attached_params = handle, reuse.params
        turn.reused_tokens = reuse.tokens

    async def _tokenize(self, turn: Turn) -> list[int] | None:
        """The new prompt's ids from a prefill engine; a failing engine is replaced for the turn."""
        body = protocol.tokenize_request(turn.req)
        if body is None:
            return None
        t = self.config.timeouts
        tried: set[str] = set()
        for _ in range(1 + self.config.prefill_retries):
            p_ep = turn.p_ep
            tried.add(p_ep.url)
            start = time.perf_counter()
            try:
                data = await post_json(
                    self.engines,
                    p_ep.url + "/tokenize",
                    body,
                    timeout(t.tokenize_s, t.connect_s),
                    turn.engine_request_id("t"),
                )
            except UpstreamError as exc:
                self._failed(self.prefill, p_ep, exc)
                candidates = self.prefill.candidates(tried)
                if not exc.retryable or not candidates:
                    return None
                turn.p_ep = self.strategy.prefill(candidates)
                continue
            self.metrics.tokenize_latency.observe(time.perf_counter() - start)
            return _token_list(data.get("tokens"))
        return None

    async def _return_unused(self, turn: Turn) -> None:
        """A handle taken but never sent to an engine goes back to the store."""
        if turn.taken is None or turn.lookup_key is None:
            return
        if turn.outcome in ATTACHED:  # attached, but no P ever received it
            turn.outcome = "fallback"
        try:
            await self.store.restore(turn.lookup_key, turn.taken, time.time())
        except Exception:
            self.metrics.store_errors.labels("restore").inc()

    async def _file(self, turn: Turn, result: DecodeResult, d_ep: Endpoint) -> None:
        """Store D's retained params for the next turn, keyed by the conversation."""
        if not (self.config.bidirectional and turn.req.single_choice):
            return
        if not protocol.retained_by_decoder(result.params):
            self.metrics.handles_skipped.labels("no_params").inc()
            return
        key = turn.file_key(self.config.fingerprint_conversations, result.reply)
        held = result.held_ids
        if key is None or held is None or result.params is None:
            self.metrics.handles_skipped.labels("no_key" if key is None else "no_ids").inc()
            return
        size, why = conv.usable_block_size(result.params, d_ep.block_size)
        if why is not None:
            self.metrics.handles_without_blocks.labels(why).inc()
        expires = time.time() + self.config.effective_handle_ttl_s
        handle = conv.build_handle(result.params, held, d_ep.url, expires, size)
        if handle is None:
            self.metrics.handles_skipped.labels("short_ids").inc()
            return
        try:
            await self.store.put(key, handle)
        except Exception as exc:
            self.metrics.store_errors.labels("put").inc()
            log.warning("Store put failed", extra={"error": repr(exc)})
            return
        self.metrics.handles_stored.inc()

    # -- prefill ----------------------------------------------------------------------------

    def _pick_prefill(self, tried: set[str]) -> Endpoint:
        candidates = self.prefill.candidates(tried)
        if not candidates:
            raise Unavailable(
                "prefill", 503, "no prefill engine is available", type_="service_unavailable"
            )
        return self.strategy.prefill(candidates)

    def _work(self, turn: Turn) -> float:
        if turn.prompt_ids is not None:
            return float(len(turn.prompt_ids))
        return len(str(turn.req.body.get("messages") or turn.req.body.get("prompt"))) / 4

    async def _prefill(self, turn: Turn, p_ep: Endpoint) -> tuple[dict[str, Any], Endpoint]:
        """Run P with retries; returns P's params and the engine that holds them."""
        tried: set[str] = set()
        last: UpstreamError | None = None
        for attempt in range(1 + self.config.prefill_retries):
            if attempt:
                self.metrics.retries.labels("prefill").inc()
                try:
                    p_ep = self._pick_prefill(tried)
                except Unavailable:
                    break
            tried.add(p_ep.url)
            try:
                return await self._prefill_once(turn, p_ep), p_ep
            except UpstreamError as exc:
                last = exc
                self._failed(self.prefill, p_ep, exc)
                if exc.delivered:
                    turn.spend_handle()
                if not exc.retryable:
                    raise client_error(exc) from None
        raise unavailable("prefill", last)

    async def _prefill_once(self, turn: Turn, p_ep: Endpoint) -> dict[str, Any]:
        handle = turn.attached
        body = protocol.prefill_request(turn.req.body, turn.attached_params if handle else None)
        t = self.config.timeouts
        start = time.perf_counter()
        with self.prefill.track(p_ep, self._work(turn)):
            data = await post_json(
                self.engines,
                p_ep.url + PATHS[turn.req.kind],
                body,
                timeout(t.prefill_s, t.connect_s),
                turn.engine_request_id("p"),
            )
        self.metrics.prefill_latency.observe(time.perf_counter() - start)
        self.prefill.succeeded(p_ep)
        if handle is not None:
            turn.taken = turn.attached = None  # consumed: P accepted it (outcome kept)
            p_ids = protocol.prompt_ids_of(data)
            if p_ids is not None and turn.prompt_ids is not None and p_ids != turn.prompt_ids:
                self.metrics.prompt_mismatch.inc()
                log.error("Prompt ids differ from tokenize", extra={"engine": p_ep.url})
        params: dict[str, Any] | None = protocol.kv_params_of(data)
        if params is None:
            raise UpstreamError("protocol", "prefill answered without kv_transfer_params")
        return params

    # -- decode -----------------------------------------------------------------------------

    async def _decode(
        self, request: web.Request, turn: Turn, p_params: dict[str, Any], p_ep: Endpoint
    ) -> web.StreamResponse:
        tried: set[str] = set()
        last: UpstreamError | None = None
        for attempt in range(1 + self.config.decode_retries):
            candidates = self.decode.candidates(tried)
            if not candidates:
                break
            d_ep = self.strategy.decode(candidates, turn.holder)
            tried.add(d_ep.url)
            if attempt:
                self.metrics.retries.labels("decode").inc()
            try:
                return await self._decode_once(request, turn, p_params, d_ep)
            except UpstreamError as exc:
                last = exc
                self._failed(self.decode, d_ep, exc)
                if not exc.retryable:
                    raise client_error(exc) from None
                if exc.delivered:
                    # D may have read (and so freed) P's blocks: prefill again for the next D.
                    turn.spend_handle()
                    p_params, _ = await self._prefill(turn, self._pick_prefill(set()))
        raise unavailable("decode", last)

    async def _decode_once(
        self, request: web.Request, turn: Turn, p_params: dict[str, Any], d_ep: Endpoint
    ) -> web.StreamResponse:
        turn.decode_url = d_ep.url
        mode = decode_mode(turn.req.stream, d_ep, self.config, time.time())
        body = protocol.decode_request(turn.req.body, p_params, stream=mode == "stream")
        start = time.perf_counter()
        with self.decode.track(d_ep, 1.0):
            result = await self._answer(request, turn, d_ep, body, mode)
        self.metrics.decode_latency.observe(time.perf_counter() - start)
        self.decode.succeeded(d_ep)
        if mode == "stream" and result.finished:
            observe_stream(d_ep, result.params is not None, time.time())
        if result.finished:
            await self._file(turn, result, d_ep)
        response: web.StreamResponse | None = result.response
        assert response is not None
        return response

    async def _answer(
        self, request: web.Request, turn: Turn, ep: Endpoint, body: dict[str, Any], mode: str
    ) -> DecodeResult:
        """Call `ep` (D, or one engine alone: stage `s`) and answer the client."""
        rid = turn.engine_request_id("s" if turn.alone else "d")
        call = (ep.url + PATHS[turn.req.kind], body, rid)
        t = self.config.timeouts
        return await call_and_answer(
            request, self.engines, call, turn.req, mode, t, lambda: self._on_first(turn)
        )

    def _on_first(self, turn: Turn) -> None:
        if not turn.first_sent:
            turn.first_sent = True
            self.metrics.ttft.labels(turn.outcome).observe(time.perf_counter() - turn.started)

    # -- one engine alone (the other role has none) -----------------------------------------

    async def _alone(
        self, request: web.Request, turn: Turn, role: Role, why: str
    ) -> web.StreamResponse:
        """Serve the turn on one engine of `role` as a plain request: no handle attached, none
        filed (the engine retains nothing), retried on the role's other engines like D is."""
        self._go_alone(turn, role, why)
        is_p = role == "prefill"
        pool = self.prefill if is_p else self.decode
        body, mode = protocol.plain_request(turn.req.body), "stream" if turn.req.stream else "json"
        tried: set[str] = set()
        last: UpstreamError | None = None
        retries = self.config.prefill_retries if is_p else self.config.decode_retries
        for attempt in range(1 + retries):
            candidates = pool.candidates(tried)
            if not candidates:
                break
            if is_p:
                ep = turn.p_ep = self.strategy.prefill(candidates)
            else:
                ep = self.strategy.decode(candidates, turn.holder)  # its prefix cache helps
                turn.decode_url = ep.url
            tried.add(ep.url)
            if attempt:
                self.metrics.retries.labels(role).inc()
            try:
                with pool.track(ep, self._work(turn) if is_p else 1.0):
                    result = await self._answer(request, turn, ep, body, mode)
            except UpstreamError as exc:
                last = exc
                self._failed(pool, ep, exc)
                if not exc.retryable:
                    raise client_error(exc) from None
                continue
            pool.succeeded(ep)
            response: web.StreamResponse | None = result.response
            assert response is not None
            return response
        raise unavailable(role, last)

    def _go_alone(self, turn: Turn, role: Role, why: str) -> None:
        """Count and log the degraded turn; drop any attached handle (a taken one goes back)."""
        gone = degraded.other_role(role)
        self.metrics.degraded_turns.labels(gone).inc()
        extra = {"role": role, "missing": gone, "reason": why}
        log.warning("Serving turn on one engine", extra=extra)
        turn.alone, turn.attached, turn.attached_params = role, None, None
        turn.reused_tokens = 0
        if turn.outcome in ATTACHED:
            turn.outcome = "fallback"

    def _failed(self, pool: Pool, ep: Endpoint, exc: UpstreamError) -> None:
        if exc.retryable:
            self.metrics.upstream_failures.labels(pool.role, exc.kind).inc()
            if pool.failed(ep):
                self.metrics.ejections.labels(pool.role).inc()
                log.warning("Ejected engine", extra={"role": pool.role, "engine": ep.url})
        log.warning(
            "Engine call failed",
            extra={"role": pool.role, "engine": ep.url, "kind": exc.kind, "error": str(exc)},
        )


def _token_list(value: Any) -> list[int] | None:
    """Shape check only: `reuse.decide` rejects anything that is not token ids."""
    return value if isinstance(value, list) else None
