"""What every leg of a turn shares: the engines of a role in turn, the answer, D's new handle.

Why it exists: a turn reaches its answer by one of a few legs (`legs.py`: P then D with or
without D's handle, the decoder holding the history alone, one engine alone), and all of them
call engines the same way: a role's engines tried in turn (`failover.py`), P paired with a D
of its engine revision, D's answer relayed to the client (`decode.py`), the time to first
token counted, and after D's answer the conversation's new handle filed and its placement
remembered (`affinity.py`). Written once here, so a leg is only what makes it different.

`Serving` holds what a router holds for every turn (one per app); `flow.Router` extends it
with the order of a turn.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from aiohttp import web

from boomerang.facts import state as router_state
from boomerang.router import apis
from boomerang.router import conversation as conv
from boomerang.router.apis import DecodeResult, protocol
from boomerang.router.apis.usage import Cached
from boomerang.router.config import RouterConfig
from boomerang.router.engines.capabilities import DecodeMode
from boomerang.router.engines.endpoints import (
    Endpoint,
    Mark,
    Pool,
    Strategy,
    partners,
    prefill_choices,
)
from boomerang.router.engines.failover import Failover, unavailable
from boomerang.router.engines.kvevents import Index
from boomerang.router.engines.upstream import EngineClient, UpstreamError, open_stream, timeout
from boomerang.router.learning import forgetting
from boomerang.router.learning.paths import PathBook
from boomerang.router.metrics import Metrics
from boomerang.router.retention.claims import Claims
from boomerang.router.retention.hooks import NoRetention, RetentionHooks
from boomerang.router.store import ConversationStore
from boomerang.router.turn import migration
from boomerang.router.turn.affinity import Affinity, Placement, cached_tokens
from boomerang.router.turn.decode import Carried, Carry, call_and_answer
from boomerang.router.turn.state import Turn

log = logging.getLogger("boomerang.router")
T = TypeVar("T")
Call = Callable[[Endpoint], Awaitable[T]]
BeforeRetry = Callable[[UpstreamError], Awaitable[None]]


@dataclass
class Serving:
    """Everything a turn needs; one per app."""

    config: RouterConfig
    prefill: Pool
    decode: Pool
    strategy: Strategy
    store: ConversationStore
    metrics: Metrics
    engines: EngineClient
    retention: RetentionHooks = field(default_factory=NoRetention)
    claims: Claims | None = None
    """Claims of D's leases before P may pull them (None: never claim, as in unit tests)."""
    kv: Index | None = None
    """What every engine holds, from their KV events (`kvevents.py`; None: no index)."""
    affinity: Affinity = field(init=False)
    failover: Failover = field(init=False)
    paths: PathBook = field(init=False)

    def __post_init__(self) -> None:
        self.failover = Failover(self.metrics)
        self.paths = PathBook(self.config, self.metrics)
        self.affinity = Affinity(self.config.store.max_conversations, self.config.affinity_ttl_s)

    def state(self) -> dict[str, Any]:
        """What is in force (`GET /boomerang/v1/state`): mode, break-even, paths taken, the
        cost model's coefficients, and retention's part."""
        kv = {router_state.KV_INDEX: self.kv.summary()} if self.kv is not None else {}
        streams = {url: ep.stream_s for url, ep in self.decode.endpoints.items()}
        return {**self.paths.state(streams), **self.retention.state(), **kv}

    # -- the engines of a role -----------------------------------------------------------------

    def indexed(self) -> bool:
        """Whether the KV index can say what engines hold."""
        return self.kv is not None and self.kv.ready

    def cached(self, turn: Turn) -> Mapping[str, int]:
        """What each prefill engine holds of the turn's prompt in its prefix cache: from the KV
        index when the prompt's ids are known, else what the conversation's last turn left on
        its P (in whole blocks of the deployment's block size, which its decoders report).
        Nothing when P runs without a prefix cache."""
        if not self.config.prefill_prefix_caching:
            return {}
        sizes = [ep.block_size for ep in self.decode.endpoints.values() if ep.block_size]
        block = sizes[0] if sizes else None
        found: Mapping[str, int] = {}
        if self.kv is not None and self.kv.usable:
            found = self.kv.cached_tokens(self._hashes(turn), self.prefill.endpoints)
        if not found:
            found = cached_tokens(turn.placement, block)
        return {url: self._kept(url, tokens, block) for url, tokens in found.items()}

    def _kept(self, url: str, tokens: int, block: int | None) -> int:
        """What P will still hold of `tokens` once the turns sent to it before ran
        (`forgetting.py`: their whole prompts' KV comes first)."""
        ep = self.prefill.get(url)
        if ep is None:
            return tokens
        return forgetting.kept_tokens(tokens, ep.kv_tokens, ep.kv_blocks, ep.block_size or block)

    def prefill_work(self, turn: Turn, p_ep: Endpoint) -> float:
        """The tokens P will compute of the turn's prompt (what its cache lacks): what the
        turn adds to P's queue (`Endpoint.work`), which later turns wait behind."""
        return max(0.0, self.work(turn) - self.cached(turn).get(p_ep.url, 0))

    def held_by(self, turn: Turn, url: str) -> int | None:
        """How many leading tokens of the prompt decoder `url` holds (None: unknown)."""
        if self.kv is None or not self.kv.usable:
            return None
        return self.kv.cached_tokens(self._hashes(turn), [url]).get(url)

    def _hashes(self, turn: Turn) -> list[int] | None:
        """The prompt's block hashes, named once per turn (they cost ~4 us a block)."""
        if turn.prompt_ids is None or self.kv is None:
            return None
        if turn.block_hashes is None:
            turn.block_hashes = self.kv.hashes(turn.prompt_ids, turn.cache_salt)
        return turn.block_hashes

    def pick_prefill(self, turn: Turn, candidates: Sequence[Endpoint]) -> Endpoint:
        """The prefill engine for the turn: one with a decoder of its revision (and one that
        may pull from the holder), by the work it has left counting its cache."""
        if not turn.alone:
            holder = self.decode.get(turn.holder)
            candidates = prefill_choices(candidates, self.decode.candidates(), holder)
        turn.p_ep = self.strategy.prefill(candidates, self.cached(turn), self.work(turn))
        return turn.p_ep

    async def on_prefill(self, turn: Turn, call: Call[T], first: Endpoint | None = None) -> T:
        """`call` on the turn's prefill engine, failing over to the others (`failover.py`)."""
        retries = self.config.prefill_retries
        pick = lambda candidates: self.pick_prefill(turn, candidates)  # noqa: E731
        return await self.failover.run(self.prefill, pick, call, retries=retries, first=first)

    async def on_decode(
        self, turn: Turn, call: Call[T], before_retry: BeforeRetry | None = None
    ) -> T:
        """`call` on a decode engine, the conversation's holder first unless it is too busy
        (its prefix cache has the history), failing over to the others."""

        def pick(candidates: Sequence[Endpoint]) -> Endpoint:
            if not turn.alone and turn.p_ep is not None:
                candidates = partners(turn.p_ep, candidates)
                if not candidates:  # none of P's revision left: the flow may serve P alone
                    raise unavailable("decode", None)
            d_ep = self.strategy.decode(candidates, turn.holder or self._placed_decode(turn))
            turn.decode_url = d_ep.url
            return d_ep

        retries = self.config.decode_retries
        return await self.failover.run(
            self.decode, pick, call, retries=retries, before_retry=before_retry
        )

    def _placed_decode(self, turn: Turn) -> str | None:
        return turn.placement.decode if turn.placement is not None else None

    def work(self, turn: Turn) -> float:
        """A prefill's expected work in tokens (estimated from the text before tokenizing)."""
        if turn.prompt_ids is not None:
            return float(len(turn.prompt_ids))
        body = turn.req.body
        return len(str(body.get("messages") or body.get("prompt") or body.get("input"))) / 4

    def still_held(self, handle: conv.Handle) -> bool:
        """Whether the decoder named by `handle` may still hold its blocks: not when the pod
        is gone, down, or went down after D retained them (a restart loses them, and vLLM
        0.32's P hangs reading a restarted D)."""
        holder = self.decode.get(handle.decode_url)
        made_at = handle.expires_at - self.config.effective_handle_ttl_s
        return holder is not None and not holder.ejected and holder.lost_at < made_at

    # -- the answer ------------------------------------------------------------------------------

    async def answer(
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
        call = (ep.url + apis.of(turn.req.kind).path, body, rid)
        t = self.config.timeouts
        handed_over = stage == "d" and not turn.alone  # from P; else continued or alone
        # After P, what P did not compute; else (continue, alone) the engine's own count.
        cached: Cached = "own"
        if handed_over:
            cached = "unknown" if turn.p_cached is None else turn.p_cached
        mark: Mark | None = None
        live: int | None = None

        def on_first() -> None:
            nonlocal mark, live
            if mark is None and ep.role == "decode":
                mark = ep.join(handed_over)
                if handed_over:  # D took P's blocks and its first step: its streams waited
                    ep.stall(self.paths.model.coefficients().stream_handoff_stall_s)
                live = ep.begin()  # what joins from now on stalls this stream too
            self._on_first(turn)

        carry = self._carry(turn, ep) if mode == "stream" else None
        try:
            result = await call_and_answer(
                request, self.engines, call, turn.req, mode, t, on_first, cached, carry
            )
        finally:
            if live is not None:
                ep.end(live)
        turn.answered(result)
        if mode == "stream" and result.finished and turn.first_at and not result.carried_over:
            seconds = time.perf_counter() - turn.first_at
            ep.streamed(seconds, len(result.output_ids or ()))  # D's decode (costmodel)
            if mark is not None and result.output_ids:
                self.paths.observe_stream(len(result.output_ids), ep.since(mark), seconds)
        return result

    def settled(self, pool: Pool, ep: Endpoint, result: DecodeResult) -> None:
        """After an engine's answer went to the client: a whole answer is a success (it
        resets the engine's failure count); one that broke off after the first byte (an
        in-band error, a lost connection) is a failure, counted towards ejecting it (when
        the stream was carried over, at the time it broke, `_carry`)."""
        if result.carried_over:
            return
        if result.finished:
            pool.succeeded(ep)
        else:
            broken = UpstreamError("protocol", "the answer broke off after the first byte")
            self.failover.failed(pool, ep, broken)

    def pool_of(self, role: str) -> Pool:
        """The pool of engines of `role` (prefill or decode)."""
        return self.prefill if role == "prefill" else self.decode

    def _carry(self, turn: Turn, ep: Endpoint) -> Carry | None:
        """How a stream of `ep`'s goes on elsewhere if `ep` dies mid-stream (`migration.py`):
        on the least busy other decoder, else on P; None where it cannot be carried."""
        if not self.config.migrate_streams or migration.refusal(turn.req) is not None:
            return None

        current, dead = ep, set[str]()  # the engine streaming now, those that died under it

        async def carry(result: DecodeResult, exc: Exception) -> Carried | None:
            nonlocal current
            pool = self.pool_of(current.role)
            broken = exc if isinstance(exc, UpstreamError) else UpstreamError("protocol", str(exc))
            self.failover.failed(pool, current, broken)
            dead.add(current.url)
            body = migration.continuation(turn.req, result.prompt_ids or [], result.output_ids)
            for target in self._carry_targets(dead) if body is not None else ():
                if (carried := await self._carry_to(turn, target, body or {})) is not None:
                    self.metrics.carried_over.labels("carried").inc()
                    moved = {"from": current.url, "to": target.url}
                    log.warning(
                        "Carried a stream over", extra={**moved, "streamed": len(result.output_ids)}
                    )
                    current = target
                    return carried
            self.metrics.carried_over.labels("failed").inc()
            return None

        return carry

    def _carry_targets(self, dead: set[str]) -> list[Endpoint]:
        """Where a stream may go on: the other decoders by load, then the prefill engines
        (none that died under this answer)."""
        decoders = [e for e in self.decode.endpoints.values() if e.ready and e.url not in dead]
        prefills = [e for e in self.prefill.endpoints.values() if e.ready and e.url not in dead]
        return [
            *sorted(decoders, key=lambda e: (e.inflight, e.url)),
            *sorted(prefills, key=lambda e: (e.work, e.inflight, e.url)),
        ]

    async def _carry_to(self, turn: Turn, target: Endpoint, body: dict[str, Any]) -> Carried | None:
        """Open the rest of the answer on `target` (None: it failed before answering)."""
        t = self.config.timeouts
        pool = self.pool_of(target.role)
        limit = timeout(t.decode_total_s, t.connect_s)
        rid = turn.engine_request_id("m")
        try:
            stream = await open_stream(
                self.engines,
                target.url + "/v1/completions",
                body,
                limit,
                t.decode_first_byte_s,
                rid,
            )
        except UpstreamError as exc:
            self.failover.failed(pool, target, exc)
            return None
        target.count(1)
        turn.decode_url = target.url
        return Carried(stream, lambda: target.count(-1))

    def _on_first(self, turn: Turn) -> None:
        if not turn.first_sent:
            turn.first_sent = True
            turn.first_at = time.perf_counter()
            if turn.on_first is not None:
                turn.on_first()
            self.metrics.ttft.labels(turn.outcome).observe(time.perf_counter() - turn.started)

    # -- after D answered: the next turn's handle and placement ---------------------------------

    async def file(self, turn: Turn, result: DecodeResult, d_ep: Endpoint) -> bool:
        """Store D's retained params for the next turn, keyed by the conversation; whether
        a handle was filed."""
        if not (self.config.bidirectional and turn.req.single_choice):
            return False
        if not protocol.retained_by_decoder(result.params):
            self.metrics.handles_skipped.labels("no_params").inc()
            return False
        key = self._file_key(turn, result)
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
        now = time.time()
        hint = turn.req.retention.applied_s if turn.req.retention is not None else None
        probe = self._p_probe(turn, result)
        self.retention.filed(
            key, handle, turn.tenant, now, replaced=replaced, hint_s=hint, p_probe=probe
        )
        turn.retention_learned_s = self.retention.learned_s(turn.tenant, now)
        return True

    def _file_key(self, turn: Turn, result: DecodeResult) -> bytes | None:
        """Where the next turn looks first (`Turn.file_key`), worked out once a turn: the
        placement and the handle are filed under it, and the turn's log line names it."""
        if not turn.key_filed:
            turn.filed_key = turn.file_key(self.config.fingerprint_conversations, result.reply)
            turn.key_filed = True
        return turn.filed_key

    def _p_probe(self, turn: Turn, result: DecodeResult) -> int | None:
        """The index's name of the prompt's last whole block (`Lease.p_probe`): while a prefill
        engine holds it, P holds this history. None without the index or the prompt's ids, and
        outside adaptive mode, where no lease is kept (not hashed for nothing after each turn)."""
        if self.kv is None or not self.paths.adaptive:
            return None
        if turn.prompt_ids is not None:
            hashes = self._hashes(turn)
        else:
            ids = result.prompt_ids
            hashes = self.kv.hashes(ids, turn.cache_salt) if ids else None
        return hashes[-1] if hashes else None

    def place(self, turn: Turn, result: DecodeResult, d_ep: Endpoint) -> None:
        """Remember where this turn ran, under the key its next turn will look up."""
        if not self.config.affinity or not turn.req.single_choice:
            return
        key = self._file_key(turn, result)
        if key is None:
            return
        if turn.continued or turn.p_ep is None or turn.alone:  # P computed nothing new
            old = turn.placement
            prefill, tokens = (old.prefill, old.prompt_tokens) if old else (None, 0)
        else:
            ids = turn.prompt_ids or result.prompt_ids
            prefill, tokens = turn.p_ep.url, len(ids) if ids else int(self.work(turn))
        placement = Placement(prefill, d_ep.url, tokens, time.time())
        self.affinity.put(key, placement)
        if (wide := turn.session_wide_key()) is not None:
            self.affinity.put(wide, placement)

    def release(self, handle: conv.Handle | None, reason: str) -> None:
        """Tell retention a handle will never be offered again (it may free D's blocks; the
        turn does not wait for that)."""
        if handle is None:
            return
        try:
            self.retention.superseded(handle, reason)
        except Exception as exc:  # retention's own failures never fail a turn
            log.warning("Retention failed", extra={"error": repr(exc), "reason": reason})
