"""One turn through P and D: claim a verified handle, prefill, decode, file D's new handle.

Why it exists: it is the I/O around the pure parts, in the order that keeps reuse correct.
`Router.handle` is that order:
1. Route: P then D, or one engine of a role alone when the other has none (`degraded.py`).
2. Take the conversation's handle (atomically: no concurrent turn can get it). What may happen
   to it from here is the turn's state machine (`turn.py`).
3. Verify it against the new prompt's token ids (`reuse.decide`): hit, partial or rejected.
4. Serve: prefill with D's params attached when verified (a handle P may have seen is spent;
   if P certainly never saw it, connection refused, the retry on another P still carries it),
   then decode, preferring the D that holds the conversation, and file D's retained params
   with the hashes of D's tokens under the conversation's key. A D failure before the client
   got a byte is retried on another D, after a fresh prefill when the failed D may have read
   P's blocks. When every engine of a role failed, the other role may serve alone.
5. Finish: a handle no P received goes back to the store; count the outcome and the path,
   log the turn.
In `adaptive` mode a verified turn takes its cheapest path first (`adaptive.py`): pull (4),
recompute (4 without the handle) or continue (the decoder holding the history serves it).
Retries (every engine call) are `failover.py`; engine calls and their failures `upstream.py`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar

from aiohttp import web

from boomerang.router import conversation as conv
from boomerang.router import degraded, protocol
from boomerang.router.adaptive import AdaptivePaths
from boomerang.router.capabilities import DecodeMode, decode_mode, observe_stream
from boomerang.router.config import RouterConfig
from boomerang.router.decode import DecodeResult, call_and_answer
from boomerang.router.endpoints import (
    Endpoint,
    Pool,
    Role,
    Strategy,
    compatible,
    pairable,
    partners,
    prefill_choices,
)
from boomerang.router.errors import ApiError
from boomerang.router.failover import Failover, Unavailable, unavailable
from boomerang.router.hooks import NoRetention, RetentionHooks
from boomerang.router.metrics import Metrics
from boomerang.router.paths import PathBook
from boomerang.router.reuse import REJECTED, Outcome, decide
from boomerang.router.settle import settle
from boomerang.router.store import ConversationStore
from boomerang.router.turn import Turn
from boomerang.router.upstream import EngineClient, UpstreamError, post_json, timeout
from boomerang.router.validation import ClientRequest

log = logging.getLogger("boomerang.router")
UNPAIRED = (
    "no prefill and decode engines of one engine revision and vLLM version (a rollout is under way)"
)
PATHS = {"chat": "/v1/chat/completions", "completion": "/v1/completions"}
T = TypeVar("T")
Call = Callable[[Endpoint], Awaitable[T]]
BeforeRetry = Callable[[UpstreamError], Awaitable[None]]


@dataclass
class Router(AdaptivePaths):
    """Everything a turn needs; one per app."""

    config: RouterConfig
    prefill: Pool
    decode: Pool
    strategy: Strategy
    store: ConversationStore
    metrics: Metrics
    engines: EngineClient
    retention: RetentionHooks = field(default_factory=NoRetention)
    failover: Failover = field(init=False)
    paths: PathBook = field(init=False)

    def __post_init__(self) -> None:
        self.failover = Failover(self.metrics)
        self.paths = PathBook(self.config, self.metrics)

    async def handle(self, request: web.Request, req: ClientRequest, tenant: str) -> Any:
        """Serve one chat or completion request; returns the response already sent."""
        turn = Turn(req, tenant)
        try:
            route, why = self._route()  # 1. P then D, or one engine alone
            await self._take(turn)  # 2. take the conversation's handle
            if route != "pd":
                return await self._alone(request, turn, route, why)
            await self._verify(turn)  # 3. verify it against the new prompt
            if self.paths.adaptive and turn.reuse is not None:  # 4. its cheapest path
                return await self._choose(request, turn)
            return await self._serve(request, turn)  # 4. prefill with it, decode, file D's
        finally:
            await self._finish(turn)  # 5. restore an unused handle, count, log

    # -- 1. route ---------------------------------------------------------------------------

    def _route(self) -> tuple[degraded.Route, str]:
        """The turn's path, and why it goes to one engine alone; 503 when no engine can."""
        p, d = degraded.supply(self.prefill), degraded.supply(self.decode)
        path = degraded.route(p, d, fallback=self.config.single_engine_fallback)
        if path is None:
            raise ApiError(503, degraded.no_engine_message(p, d), type_="service_unavailable")
        if path == "pd":
            if pairable(self.prefill.candidates(), self.decode.candidates()):
                return path, ""
            if not self.config.single_engine_fallback:
                raise ApiError(503, UNPAIRED, type_="service_unavailable")
            return "prefill", UNPAIRED
        return path, degraded.reason(degraded.other_role(path), d if path == "prefill" else p)

    # -- 2. take, 3. verify ------------------------------------------------------------------

    async def _take(self, turn: Turn) -> None:
        """Take the conversation's handle from the store: from here no concurrent turn can get
        it (a turn no P will serve holds it only to hand it back)."""
        if not (self.config.bidirectional and turn.req.single_choice):
            return
        turn.lookup_key = turn.find_key(self.config.fingerprint_conversations)
        if turn.lookup_key is None:
            return
        now = time.time()
        try:
            status, handle = await self.store.take(turn.lookup_key, now)
        except Exception as exc:
            self.metrics.store_errors.labels("take").inc()
            log.warning("Store take failed", extra={"error": repr(exc)})
            return
        self.retention.taken(turn.lookup_key, turn.tenant, now)
        turn.take(status, handle, handle is not None and self._still_held(handle))

    async def _verify(self, turn: Turn) -> None:
        """Decide on the new prompt's token ids what of a taken handle P may reuse."""
        if turn.handle is None:
            return
        ids = protocol.known_prompt_ids(turn.req)
        if ids is None:
            ids = await self._tokenize(turn)
        turn.prompt_ids = ids
        cfg = self.config
        if ids is None:
            reuse = None
        elif turn.handle.released and not self.paths.adaptive:
            reuse = REJECTED  # only the continue path (adaptive) may use it: never P
        else:
            reuse = decide(turn.handle, ids, cfg.recompute_threshold, partial=cfg.partial_reuse)
        handle = turn.handle
        turn.verify(reuse)
        if turn.handle is None:  # rejected: nothing D holds is of use to the conversation
            self._release(handle, "superseded")

    def _still_held(self, handle: conv.Handle) -> bool:
        """Whether the decoder named by `handle` may still hold its blocks: not when the pod
        is gone, down, or went down after D retained them (a restart loses them, and vLLM
        0.32's P hangs reading a restarted D)."""
        holder = self.decode.get(handle.decode_url)
        made_at = handle.expires_at - self.config.effective_handle_ttl_s
        return holder is not None and not holder.ejected and holder.lost_at < made_at

    async def _tokenize(self, turn: Turn) -> list[int] | None:
        """The new prompt's ids from a prefill engine; None when no P could say."""
        body = protocol.tokenize_request(turn.req)
        if body is None:
            return None
        t = self.config.timeouts
        limit = timeout(t.tokenize_s, t.connect_s)

        async def call(p_ep: Endpoint) -> list[int] | None:
            start = time.perf_counter()
            rid = turn.engine_request_id("t")
            data = await post_json(self.engines, p_ep.url + "/tokenize", body, limit, rid)
            self.metrics.tokenize_latency.observe(time.perf_counter() - start)
            tokens = data.get("tokens")  # a shape check: `decide` rejects non-token ids
            return tokens if isinstance(tokens, list) else None

        try:
            return await self._on_prefill(turn, call, first=turn.p_ep)
        except ApiError:  # refused, or no P left: verify nothing, compute the whole prompt
            return None

    # -- 4. serve: prefill, decode, file D's handle -----------------------------------------

    async def _serve(self, request: web.Request, turn: Turn) -> web.StreamResponse:
        """P then D; once every engine of a role failed for the turn, the other role alone
        serves it, if it may (`degraded.after_failure`)."""
        try:
            p_params = await self._prefill(turn, turn.p_ep)
            return await self._decode(request, turn, p_params)
        except Unavailable as exc:
            other = self.decode if exc.role == "prefill" else self.prefill
            fallback = self.config.single_engine_fallback
            alone = degraded.after_failure(exc.role, degraded.supply(other), fallback=fallback)
            if alone is None:
                raise
            return await self._alone(request, turn, alone, exc.message)

    async def _prefill(self, turn: Turn, first: Endpoint | None) -> dict[str, Any]:
        """P's params for D, from `first` or another prefill engine."""
        return await self._on_prefill(turn, partial(self._prefill_once, turn), first=first)

    async def _prefill_once(self, turn: Turn, p_ep: Endpoint) -> dict[str, Any]:
        holder = self.decode.get(turn.holder)
        if holder is not None and not compatible(p_ep, holder):
            turn.detach()  # P cannot pull from a decoder of another engine revision
        attached = turn.attach()
        body = protocol.prefill_request(turn.req.body, attached)
        t = self.config.timeouts
        start = time.perf_counter()
        try:
            with self.prefill.track(p_ep, self._work(turn)):
                data = await post_json(
                    self.engines,
                    p_ep.url + PATHS[turn.req.kind],
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
        self.metrics.prefill_latency.observe(seconds)
        self.prefill.succeeded(p_ep)
        params: dict[str, Any] | None = protocol.kv_params_of(data)
        if attached is not None:
            turn.spend(accepted=params is not None)
            self._check_prompt_ids(turn, data, p_ep)
        pulled = turn.reused_tokens if attached is not None else 0
        self.paths.observe_prefill(turn.prompt_ids, data, pulled, seconds)
        if params is None:
            raise UpstreamError("protocol", "prefill answered without kv_transfer_params")
        return params

    def _check_prompt_ids(self, turn: Turn, data: dict[str, Any], p_ep: Endpoint) -> None:
        """The safety net: P's own prompt ids should be the ones the handle was verified on."""
        p_ids = protocol.prompt_ids_of(data)
        if p_ids is not None and turn.prompt_ids is not None and p_ids != turn.prompt_ids:
            self.metrics.prompt_mismatch.inc()
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

        return await self._on_decode(turn, call, before_retry)

    async def _decode_once(
        self, request: web.Request, turn: Turn, p_params: dict[str, Any], d_ep: Endpoint
    ) -> web.StreamResponse:
        mode = decode_mode(turn.req.stream, d_ep, self.config, time.time())
        body = protocol.decode_request(turn.req.body, p_params, stream=mode == "stream")
        start = time.perf_counter()
        with self.decode.track(d_ep, 1.0):
            result = await self._answer(request, turn, d_ep, body, mode)
        self.metrics.decode_latency.observe(time.perf_counter() - start)
        self.decode.succeeded(d_ep)
        prompt_ids = turn.prompt_ids or result.prompt_ids
        if mode == "stream" and turn.first_at and prompt_ids is not None:
            self.paths.observe_decode_first(len(prompt_ids), turn.first_at - start)
        if mode == "stream" and result.finished:
            observe_stream(d_ep, result.params is not None, time.time())
        if result.finished:
            await settle(self._file(turn, result, d_ep))
        assert result.response is not None
        return result.response

    async def _answer(
        self,
        request: web.Request,
        turn: Turn,
        ep: Endpoint,
        body: dict[str, Any],
        mode: DecodeMode,
        stage: str = "d",
    ) -> DecodeResult:
        """Call `ep` (D; one engine alone: stage `s`; the holder continuing: `c`) and answer
        the client."""
        rid = turn.engine_request_id("s" if turn.alone else stage)
        call = (ep.url + PATHS[turn.req.kind], body, rid)
        t = self.config.timeouts
        return await call_and_answer(
            request, self.engines, call, turn.req, mode, t, lambda: self._on_first(turn)
        )

    def _on_first(self, turn: Turn) -> None:
        if not turn.first_sent:
            turn.first_sent = True
            turn.first_at = time.perf_counter()
            self.metrics.ttft.labels(turn.outcome).observe(time.perf_counter() - turn.started)

    async def _file(self, turn: Turn, result: DecodeResult, d_ep: Endpoint) -> bool:
        """Store D's retained params for the next turn, keyed by the conversation; whether
        a handle was filed."""
        if not (self.config.bidirectional and turn.req.single_choice):
            return False
        if not protocol.retained_by_decoder(result.params):
            self.metrics.handles_skipped.labels("no_params").inc()
            return False
        key = turn.file_key(self.config.fingerprint_conversations, result.reply)
        held = result.held_ids
        if key is None or held is None or result.params is None:
            self.metrics.handles_skipped.labels("no_key" if key is None else "no_ids").inc()
            return False
        size, why = conv.usable_block_size(result.params, d_ep.block_size)
        if why is not None:
            self.metrics.handles_without_blocks.labels(why).inc()
        expires = time.time() + self.config.effective_handle_ttl_s
        handle = conv.build_handle(result.params, held, d_ep.url, expires, size)
        if handle is None:
            self.metrics.handles_skipped.labels("short_ids").inc()
            return False
        try:
            replaced = await self.store.put(key, handle)
        except Exception as exc:
            self.metrics.store_errors.labels("put").inc()
            log.warning("Store put failed", extra={"error": repr(exc)})
            return False
        self.metrics.handles_stored.inc()
        self.retention.filed(key, handle, turn.tenant, time.time(), replaced=replaced)
        return True

    # -- one engine alone (the other role has none) -----------------------------------------

    async def _alone(
        self, request: web.Request, turn: Turn, role: Role, why: str
    ) -> web.StreamResponse:
        """Serve the turn on one engine of `role` as a plain request: no handle attached, none
        filed (the engine retains nothing), retried on the role's other engines like D is."""
        gone = degraded.other_role(role)
        self.metrics.degraded_turns.labels(gone).inc()
        log.warning(
            "Serving turn on one engine", extra={"role": role, "missing": gone, "reason": why}
        )
        turn.alone = role
        turn.detach()
        body = protocol.plain_request(turn.req.body)
        mode: DecodeMode = "stream" if turn.req.stream else "json"
        pool = self.prefill if role == "prefill" else self.decode

        async def call(ep: Endpoint) -> web.StreamResponse:
            with pool.track(ep, self._work(turn) if role == "prefill" else 1.0):
                result = await self._answer(request, turn, ep, body, mode)
            pool.succeeded(ep)
            assert result.response is not None
            return result.response

        if role == "prefill":
            return await self._on_prefill(turn, call)
        return await self._on_decode(turn, call)

    # -- engines of a role, and the end of a turn -------------------------------------------

    async def _on_prefill(self, turn: Turn, call: Call[T], first: Endpoint | None = None) -> T:
        """`call` on the turn's prefill engine, failing over to the others (`failover.py`)."""

        def pick(candidates: Sequence[Endpoint]) -> Endpoint:
            if not turn.alone:  # a P/D turn: P must have a decoder of its engine revision
                holder = self.decode.get(turn.holder)
                candidates = prefill_choices(candidates, self.decode.candidates(), holder)
            turn.p_ep = self.strategy.prefill(candidates)
            return turn.p_ep

        retries = self.config.prefill_retries
        return await self.failover.run(self.prefill, pick, call, retries=retries, first=first)

    async def _on_decode(
        self, turn: Turn, call: Call[T], before_retry: BeforeRetry | None = None
    ) -> T:
        """`call` on a decode engine, the conversation's holder first unless it is too busy
        (its prefix cache has the history), failing over to the others."""

        def pick(candidates: Sequence[Endpoint]) -> Endpoint:
            if not turn.alone and turn.p_ep is not None:
                candidates = partners(turn.p_ep, candidates)
                if not candidates:  # none of P's revision left: the flow may serve P alone
                    raise unavailable("decode", None)
            d_ep = self.strategy.decode(candidates, turn.holder)
            turn.decode_url = d_ep.url
            return d_ep

        retries = self.config.decode_retries
        return await self.failover.run(
            self.decode, pick, call, retries=retries, before_retry=before_retry
        )

    def _work(self, turn: Turn) -> float:
        """A prefill's expected work in tokens (estimated from the text before tokenizing)."""
        if turn.prompt_ids is not None:
            return float(len(turn.prompt_ids))
        return len(str(turn.req.body.get("messages") or turn.req.body.get("prompt"))) / 4

    async def _finish(self, turn: Turn) -> None:
        """Put back a handle no P received, count the turn's outcome and log it."""
        handle = turn.restore()
        if handle is not None and turn.lookup_key is not None:
            now = time.time()
            try:
                await settle(self.store.restore(turn.lookup_key, handle, now))
            except Exception:
                self.metrics.store_errors.labels("restore").inc()
            else:
                # Its lease ended when the turn took it; it starts again. `replaced=None`: a
                # restore never overwrites a newer handle, so no lease is released for it here.
                self.retention.filed(turn.lookup_key, handle, turn.tenant, now, replaced=None)
        m = self.metrics
        m.reuse.labels(turn.outcome).inc()
        self.paths.served(turn.path)
        if turn.reused_tokens:
            m.reused_tokens.labels(turn.outcome).inc(turn.reused_tokens)
        if turn.outcome is Outcome.PARTIAL and turn.prompt_ids:
            m.reused_fraction.observe(turn.reused_tokens / len(turn.prompt_ids))
        if log.isEnabledFor(logging.INFO):
            log.info("Served turn", extra=turn.summary())
