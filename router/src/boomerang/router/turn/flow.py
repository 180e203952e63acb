"""One turn, in the order that keeps reuse correct: find, verify, plan, run the legs, finish.

Why it exists: it is the I/O around the pure parts. `Router.handle` is that order:
1. Route: P and D, or one engine of a role alone when the other has none (`degraded.py`).
2. Find the conversation: where its last turn ran (`affinity.py`) and its handle, taken from
   the store atomically (no concurrent turn can get it; what may happen to it from here is the
   turn's state machine, `state.py`). Choose P: the work it has left, counting its cache.
3. Verify the handle against the new prompt's token ids (`reuse.decide`: hit, partial or
   rejected) while D claims its lease (`claims.py`): only a lease D confirmed may go to P.
4. Plan (`plan.py`): static pulls what P's own cache lacks when that reaches the engine's
   threshold, else recomputes; adaptive takes the cheapest leg by the learned cost model
   (continue on the decoder holding the history included). A handle the plan does not use is
   declined (D's blocks can go now).
5. Run the plan's legs (`legs.py`) until one answers; a leg that failed before the client got
   a byte gives way to the next (`plan.after_failure`).
6. Finish: a handle no P received goes back to the store; count the outcome and the path, log
   the turn.
"""

from __future__ import annotations

import asyncio
import logging
import time
from asyncio import Task
from dataclasses import asdict, dataclass
from typing import Any

from aiohttp import web

from boomerang.facts.engine import CONTINUE_CAPABILITY
from boomerang.router import apis
from boomerang.router import conversation as conv
from boomerang.router.apis.validation import ClientRequest
from boomerang.router.engines.endpoints import Endpoint, pairable
from boomerang.router.engines.upstream import post_json, timeout
from boomerang.router.errors import ApiError
from boomerang.router.learning.costmodel import Path
from boomerang.router.retention.claims import Claim, may_offer
from boomerang.router.store import TakeStatus
from boomerang.router.turn import decode_first, degraded
from boomerang.router.turn.cache_salt import salt_request
from boomerang.router.turn.decode import ClientGone
from boomerang.router.turn.legs import Alone, DecodeFirst, LegFailed, PrefillDecode, leg_for
from boomerang.router.turn.plan import (
    Facts,
    Plan,
    adaptive_plan,
    after_failure,
    forgoes_handle,
    static_plan,
)
from boomerang.router.turn.reuse import REJECTED, Outcome, decide
from boomerang.router.turn.serving import Serving
from boomerang.router.turn.settle import settle
from boomerang.router.turn.state import Turn

log = logging.getLogger("boomerang.router")
UNPAIRED = (
    "no prefill and decode engines of one engine revision and vLLM version (a rollout is under way)"
)


@dataclass
class Router(Serving):
    """A turn's order on top of what every leg shares (`serving.py`); one per app."""

    async def handle(self, request: web.Request, req: ClientRequest, tenant: str) -> Any:
        """Serve one request (any API, `apis/`); returns the response already sent."""
        if self.config.tenant_cache_salt:  # before any engine call: every leg sends it
            salt_request(req.body, tenant)
        turn = Turn(req, tenant)
        claim: Task[Claim] | None = None
        try:
            route, why = self._route()  # 1. P then D, or one engine alone
            await self._take(turn)  # 2. the conversation: its placement and handle
            if route != "pd":
                return await Alone(self, route, why).run(request, turn)
            if self.config.decode_first_tokens is not None:  # the peers' policy, no handles
                return await self._decode_first(request, turn)
            self._forgo(turn)  # static: P already holds the history
            claim = self._claim(turn)  # D confirms the handle's lease, meanwhile
            await self._identify(turn)  # the prompt's ids where they help
            if not self.indexed():  # no events to say what D holds: its claim says it
                await self._claimed(turn, claim)
            self._choose_prefill(turn)
            self._verify(turn)  # 3. the handle against the new prompt
            plan = self._plan(turn)  # 4. the legs to try
            return await self._run(request, turn, plan, claim)  # 5. until one answers
        except ApiError as exc:
            turn.failure = f"{exc.status}: {exc.message}"
            raise
        except (ClientGone, asyncio.CancelledError):
            turn.failure = CANCELLED
            raise
        except BaseException as exc:  # a bug
            turn.failure = type(exc).__name__
            raise
        finally:
            await self._finish(turn, claim)  # 6. restore an unused handle, count, log

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

    # -- 2. find, 3. verify -------------------------------------------------------------------

    async def _take(self, turn: Turn) -> None:
        """Find the conversation (where its last turn ran) and take its handle from the store:
        from here no concurrent turn can get it (a turn no P will serve holds it only to hand
        it back)."""
        cfg = self.config
        if not ((cfg.bidirectional or cfg.affinity) and turn.req.single_choice):
            return
        keys = turn.find_keys(cfg.fingerprint_conversations)
        turn.lookup_key = keys[0] if keys else None
        if cfg.affinity:
            now = time.time()
            wide = turn.session_wide_key()
            places = [*keys, wide] if wide is not None else keys
            turn.placement = next(
                (p for key in places if (p := self.affinity.get(key, now)) is not None), None
            )
        if not keys or not cfg.bidirectional:
            return
        status, handle = await self._take_first(turn, keys)
        turn.take(status, handle, handle is not None and self.still_held(handle))

    async def _take_first(
        self, turn: Turn, keys: list[bytes]
    ) -> tuple[TakeStatus, conv.Handle | None]:
        """The handle under the first key that has one (a session's, then its fingerprint's);
        the turn keeps that key, so an unused handle goes back where it was (with none, the
        first key: where its next turn looks first)."""
        status: TakeStatus = "missing"
        for key in keys:
            now = time.time()
            try:
                status, handle = await self.store.take(key, now)
            except Exception as exc:
                self.metrics.store_errors.labels("take").inc()
                log.warning("Store take failed", extra={"error": repr(exc)})
                return "missing", None
            self.retention.taken(key, turn.tenant, now)  # every key looked at: as one turn
            if handle is not None or status == "expired":
                turn.lookup_key = key
                return status, handle
        return status, None

    def _forgo(self, turn: Turn) -> None:
        """Static mode: when the P that computed the conversation's last prompt serves this turn
        too, its prefix cache holds the history, and D's handle could only bring back D's last
        answer: a verify call, a claim and a read of a block or two, for what P computes in a
        few milliseconds (plain P/D computes it every turn). So the handle is let go unverified
        and D's blocks are released at once. The turn is then plain P/D."""
        placed = turn.placement
        if self.paths.adaptive or turn.handle is None or turn.handle.released or placed is None:
            return
        cached = self.cached(turn)
        candidates = self.prefill.candidates()
        held = cached.get(placed.prefill or "", 0)
        if not held or not candidates:
            return  # P holds no whole block of it: the handle may be worth verifying
        choice = self.strategy.prefill(candidates, cached, self.work(turn))
        if forgoes_handle(placed.prefill, choice.url, held):
            turn.p_ep = choice
            self.release(turn.forgo(), "recompute")

    def _choose_prefill(self, turn: Turn) -> None:
        """The P the turn will use first, chosen before the plan so that the plan knows what
        P's own cache holds (the KV index, else the conversation's placement)."""
        if turn.p_ep is not None and turn.handle is None and turn.prompt_ids is None:
            return  # chosen already (`_forgo`), and nothing since to choose better with
        candidates = self.prefill.candidates()
        if candidates:
            self.pick_prefill(turn, candidates)

    async def _identify(self, turn: Turn) -> None:
        """The prompt's token ids, when they can verify a handle or tell which P holds the
        prompt (the KV index, with more than one P)."""
        steer = self.indexed() and len(self.prefill.candidates()) > 1
        if turn.handle is None and not steer and self._first_decoder(turn) is None:
            return
        turn.prompt_ids = await self._prompt_ids(turn)

    def _verify(self, turn: Turn) -> None:
        """Decide on the new prompt's token ids what of a taken handle P may reuse."""
        if turn.handle is None:
            return
        ids, cfg = turn.prompt_ids, self.config
        if ids is None:
            reuse = None
        elif turn.handle.released and not self.paths.adaptive:
            reuse = REJECTED  # only the continue path (adaptive) may use it: never P
        else:
            reuse = decide(turn.handle, ids, cfg.recompute_threshold, partial=cfg.partial_reuse)
        handle = turn.handle
        turn.verify(reuse)
        if turn.handle is None:  # rejected: nothing D holds is of use to the conversation
            self.release(handle, "superseded")

    async def _prompt_ids(self, turn: Turn) -> list[int] | None:
        ids = apis.of(turn.req.kind).known_prompt_ids(turn.req)
        return ids if ids is not None else await self._tokenize(turn)

    def _claim(self, turn: Turn) -> Task[Claim] | None:
        """Start claiming the taken handle's lease on its decoder (`claims.py`). Only a pull
        waits for D's answer (`_claimed`): a turn that continues on D or recomputes on P does
        not read the lease, and does not wait for D's next engine step."""
        if turn.handle is None or turn.handle.released or self.claims is None:
            return None
        holder = self.decode.get(turn.handle.decode_url)
        return asyncio.ensure_future(self.claims.claim(holder, turn.handle))

    async def _claimed(self, turn: Turn, claim: Task[Claim] | None) -> None:
        """D's answer to the claim: one D did not confirm is treated as released (never
        offered to P)."""
        if claim is None or turn.claim is not None:
            return
        turn.claim = await claim
        if not may_offer(turn.claim):
            turn.lease_gone()

    async def _tokenize(self, turn: Turn) -> list[int] | None:
        """The new prompt's ids from a prefill engine (`/tokenize`, or the API's render
        endpoint); None when no P could say."""
        api = apis.of(turn.req.kind)
        if (render := api.prompt_ids_request(turn.req)) is None:
            return None
        path, body = render
        t = self.config.timeouts
        limit = timeout(t.tokenize_s, t.connect_s)

        async def call(p_ep: Endpoint) -> list[int] | None:
            start = time.perf_counter()
            rid = turn.engine_request_id("t")
            data = await post_json(self.engines, p_ep.url + path, body, limit, rid)
            self.metrics.tokenize_latency.observe(time.perf_counter() - start)
            return api.prompt_ids_from(data)  # a shape check: `decide` rejects non-token ids

        candidates = self.prefill.candidates()
        first = turn.p_ep or min(candidates, key=lambda e: (e.work, e.inflight), default=None)
        try:  # any P tokenizes alike: the least busy, with no turn at the selection's rotation
            return await self.on_prefill(turn, call, first=first)
        except ApiError:  # refused, or no P left: verify nothing, compute the whole prompt
            return None

    async def _decode_first(self, request: web.Request, turn: Turn) -> web.StreamResponse:
        """Decode-first routing (`decode_first.py`): the decoder caching most of the prompt
        serves a short remainder alone, else P prefills and that decoder decodes. What each
        decoder caches comes from the KV index over the prompt's ids; without them (no index,
        or no P could tokenize) the turn is plain P/D."""
        candidates = self.decode.candidates()
        if self.indexed() and candidates:
            turn.prompt_ids = await self._prompt_ids(turn)
        hashes = self._hashes(turn)
        if turn.prompt_ids is not None and hashes is not None and self.kv is not None:
            inflight = {ep.url: ep.inflight for ep in candidates}
            cached = self.kv.cached_tokens(hashes, inflight)
            cfg = self.config
            assert cfg.decode_first_tokens is not None
            choice = decode_first.choose(
                len(turn.prompt_ids), cached, inflight, cfg.decode_first_tokens,
                cfg.decode_affinity_slack, ratio=cfg.decode_first_ratio,
                p_busy=self._prefill_busy(turn, cfg.decode_first_p_busy_tokens),
            )  # fmt: skip
            turn.holder = choice.url  # decode prefers it on either path
            d_ep = self.decode.get(choice.url)
            if choice.alone and d_ep is not None:
                return await DecodeFirst(self, d_ep).run(request, turn)
        self._choose_prefill(turn)
        return await PrefillDecode(self).run(request, turn)

    def _prefill_busy(self, turn: Turn, tokens: int | None) -> bool:
        """Whether the P the turn would use has `tokens` or more queued (None: not asked)."""
        if tokens is None:
            return False
        self._choose_prefill(turn)
        return turn.p_ep is not None and turn.p_ep.work >= tokens

    # -- 4. plan, 5. run ----------------------------------------------------------------------

    def _plan(self, turn: Turn) -> Plan | None:
        """The legs for a verified turn, or for a first one that a decoder may serve alone
        (None: nothing to choose, the turn is plain P/D)."""
        if turn.handle is None and turn.prompt_ids is not None:
            return self._first_plan(turn)
        if turn.reuse is None or turn.handle is None or turn.prompt_ids is None:
            return None
        prompt = len(turn.prompt_ids)
        p_cached = self.cached(turn).get(turn.p_ep.url, 0) if turn.p_ep is not None else 0
        reusable = min(turn.reuse.tokens, prompt)
        d_held = self._held_on_holder(turn, reusable)
        holder = self._continue_holder(turn)
        facts = Facts(
            prompt_tokens=prompt,
            reusable_tokens=reusable,
            pullable=not turn.handle.released,
            holder_continues=bool(d_held) and holder is not None,
            p_cached_tokens=min(p_cached, prompt),
            d_held_tokens=min(d_held, prompt),
            p_queue_tokens=max(0.0, turn.p_ep.work) if turn.p_ep is not None else 0.0,
            **_decoder_facts(holder),
        )
        if self.paths.adaptive:
            plan = adaptive_plan(facts, self.paths.model, self.paths.bounds())
        else:
            plan = static_plan(facts, self.config.recompute_threshold)
        turn.planned(plan.choice)
        if log.isEnabledFor(logging.DEBUG):
            legs = [str(p) for p in plan.legs]
            coefficients = self.paths.model.coefficients().as_metrics()
            extra = {"legs": legs, "why": plan.reason, "coefficients": coefficients}
            log.debug("Planned turn", extra={**extra, **asdict(facts)})
        if plan.declines:
            self.release(turn.decline(), "recompute")
        return plan

    def _first_decoder(self, turn: Turn) -> Endpoint | None:
        """The decoder that may serve a turn with no usable history alone (SLO-aware adaptive
        only, `costmodel._slo_allows`): the one decode would pick, if it runs the continue
        change (which frees a request D served alone)."""
        if self.paths.slo() is None or not self.config.tuning.continue_on_decode:
            return None
        candidates = self.decode.candidates()
        if not candidates:
            return None
        d_ep = self.strategy.decode(candidates, turn.holder)
        return None if d_ep.ejected or CONTINUE_CAPABILITY not in d_ep.capabilities else d_ep

    def _first_plan(self, turn: Turn) -> Plan | None:
        """A turn with no usable history: on P, or on a decoder alone when P would make it
        miss its TTFT bound and the decoder's streams have the slack (None: plain P/D)."""
        d_ep = self._first_decoder(turn)
        if d_ep is None or turn.prompt_ids is None:
            return None
        prompt = len(turn.prompt_ids)
        p_cached = self.cached(turn).get(turn.p_ep.url, 0) if turn.p_ep is not None else 0
        facts = Facts(
            prompt_tokens=prompt,
            reusable_tokens=0,
            pullable=False,
            holder_continues=True,
            p_cached_tokens=min(p_cached, prompt),
            d_held_tokens=min(self.held_by(turn, d_ep.url) or 0, prompt),
            p_queue_tokens=max(0.0, turn.p_ep.work) if turn.p_ep is not None else 0.0,
            first_turn=True,
            **_decoder_facts(d_ep),
        )
        plan = adaptive_plan(facts, self.paths.model, self.paths.bounds())
        if plan.choice is not Path.CONTINUE:
            return None
        turn.holder = d_ep.url  # the continue leg serves it there
        turn.planned(plan.choice)
        log.debug("Planned first turn", extra={"why": plan.reason, **asdict(facts)})
        return plan

    def _held_on_holder(self, turn: Turn, reusable: int) -> int:
        """What the holder still has of the prompt: what its KV events say it caches (pinned
        blocks are cached and never evicted, so they are in it); without the index, the pinned
        blocks of a lease D confirmed, and nothing of a released one (D may have evicted it)."""
        assert turn.handle is not None
        indexed = self.held_by(turn, turn.handle.decode_url)
        if indexed is not None:
            return indexed
        return 0 if turn.handle.released else reusable

    def _continue_holder(self, turn: Turn) -> Endpoint | None:
        """The decoder holding the history, if it may serve the turn itself: listed, not
        ejected, running Boomerang's plugin with its `continue` change in force (without it
        vLLM 0.32 never frees a request D served alone: refused, not silently leaking), and
        not so much busier than the others that decode would avoid it."""
        holder = self.decode.get(turn.holder)
        if holder is None or holder.ejected or CONTINUE_CAPABILITY not in holder.capabilities:
            return None
        if self.strategy.decode(self.decode.candidates(), holder.url) is not holder:
            return None
        return holder

    async def _run(
        self, request: web.Request, turn: Turn, plan: Plan | None, claim: Task[Claim] | None
    ) -> web.StreamResponse:
        """The plan's legs in order until one answers (no plan: P then D as it comes); before
        a pull, D's claim of the lease (a lease D did not confirm: plan again without it)."""
        legs = plan.legs if plan is not None else (Path.RECOMPUTE,)
        while True:
            path, legs = legs[0], legs[1:]
            if path is Path.PULL and turn.claim is None and claim is not None:
                await self._claimed(turn, claim)
                if turn.handle is not None and turn.handle.released:
                    plan = self._plan(turn)
                    legs = plan.legs if plan is not None else (Path.RECOMPUTE,)
                    continue
            if path is Path.RECOMPUTE and turn.handle is not None and turn.reuse is not None:
                self.release(turn.decline(), "recompute")  # a fallback that computes on P
            holder = self._continue_holder(turn) if path is Path.CONTINUE else None
            if path is Path.CONTINUE and holder is None:
                continue  # the holder went away since the plan: the next leg
            if holder is not None:  # its prefill stalls the streams the holder decodes
                computed = len(turn.prompt_ids or ()) - turn.reused_tokens_verified
                holder.stall(self.paths.continue_stall(computed))
            try:
                return await leg_for(self, path, holder).run(request, turn)
            except LegFailed as failed:
                assert plan is not None
                legs = after_failure(plan, path, failed.answered)
                if not legs:
                    raise ApiError(502, "no engine could serve the request") from None

    # -- 6. finish ----------------------------------------------------------------------------

    async def _finish(self, turn: Turn, claim: Task[Claim] | None) -> None:
        """Put back a handle no P received, count the turn's outcome and log it."""
        maybe_held = False
        if claim is not None and turn.claim is None:
            if claim.done() and not claim.cancelled():
                await self._claimed(turn, claim)  # the store gets what D said of the lease
            else:
                claim.cancel()  # not needed; but D may have claimed it already
                maybe_held = True
        handle = turn.restore()
        held = turn.claim == "held" or maybe_held
        if handle is not None and held and self.claims is not None:
            self.claims.unclaim(handle)  # not offered to P after all: it may yield again
        if handle is not None and turn.lookup_key is not None:
            now = time.time()
            try:
                await settle(self.store.restore(turn.lookup_key, handle, now))
            except Exception:
                self.metrics.store_errors.labels("restore").inc()
            else:
                # Its lease ended when the turn took it; it starts again. `replaced=None`: a
                # restore never overwrites a newer handle, so no lease is released for it here.
                hint = turn.req.retention.applied_s if turn.req.retention is not None else None
                self.retention.filed(
                    turn.lookup_key, handle, turn.tenant, now, replaced=None, hint_s=hint
                )
        self._count(turn)

    def _count(self, turn: Turn) -> None:
        """Count and log the turn by what the client got: `Served turn` (its path counted)
        only for a whole answer; a turn that failed, broke off mid-stream or lost its client
        gets its own line and outcome (`boomerang_router_turns_total{outcome}`)."""
        m = self.metrics
        m.reuse.labels(turn.outcome).inc()
        outcome = turn_outcome(turn)
        m.turns.labels(outcome).inc()
        if outcome == "served":
            self.paths.served(turn.path)
        if turn.reused_tokens:
            m.reused_tokens.labels(turn.outcome).inc(turn.reused_tokens)
        if turn.outcome is Outcome.PARTIAL and turn.prompt_ids:
            m.reused_fraction.observe(turn.reused_tokens / len(turn.prompt_ids))
        if outcome == "served":
            if log.isEnabledFor(logging.INFO):
                log.info("Served turn", extra=turn.summary())
        elif outcome == CANCELLED:
            log.info("Cancelled turn", extra=turn.summary())
        else:
            log.warning("Failed turn", extra={**turn.summary(), "outcome": outcome})


def _decoder_facts(d_ep: Endpoint | None) -> dict[str, Any]:
    """What the plan knows of the decoder that would serve a turn alone (`Facts`' `d_*`):
    its queue, its streams and their ledger; nothing without one."""
    if d_ep is None:
        return {}
    return {
        "d_queue_tokens": max(0.0, d_ep.prefilling),
        "d_stream_s": d_ep.stream_s,
        "d_streams": max(0, d_ep.inflight),
        "d_absorbed_s": d_ep.absorbed(),
        "d_stream_tokens": d_ep.stream_tokens,
        "d_tpot_s": d_ep.stream_tpot,
    }


def turn_outcome(turn: Turn) -> str:
    """What the client got: `served` (a whole answer), `cancelled` (it left first), `broken`
    (a stream that ended with an in-band error after the first byte), `failed` (an error)."""
    if turn.served:
        return "served"
    if turn.failure == CANCELLED:
        return CANCELLED
    if turn.failure is None and turn.first_sent:
        return "broken"
    return "failed"


CANCELLED = "cancelled"
"""A turn's failure and outcome when its client left (the request was cancelled)."""
