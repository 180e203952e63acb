"""A P/D cluster: engines, the router's turn flow and its bookkeeping, in simulated time.

Why: this is the router's `flow.py` and `legs.py` with the I/O taken out. A turn finds its
conversation's handle and placement, the policy (`policies.py`) chooses the engines and the
path with the router's own functions, and the legs run on the engines (`engine.py`):

- P leg (pull or recompute): P loads what it pulls from the holder (a NIXL read; the holder's
  lease ends when the read completes), computes what neither its cache nor the pull covers,
  answers; the router then sends the turn to D, which reads from P what its own cache lacks
  (P keeps those blocks until then), computes the last token and decodes;
- continue: the decoder serves the turn alone from its cache (the holder with Boomerang, the
  chosen decoder with decode-first).
Each turn's first leg pays the profile's `request_overhead_s` before it reaches an engine. With
bidirectional transfer D pins a finished turn's blocks as a lease (`Engine.retain`) for the
router's lease time; the router's handle (tokens = prompt + answer - 1) lives for its handle
TTL. The router's cost model observes each leg as the router measures it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from boomerang.connector.plugin.retained import RetainedBook
from boomerang.router.engines.endpoints import Endpoint, LeastWorkAffinity
from boomerang.router.turn import decode_first
from boomerang.router.turn.affinity import Affinity, Placement
from boomerang.router.turn.plan import Facts, forgoes_handle
from boomsim.engine import Engine
from boomsim.kvcache import BlockPool, CpuTier
from boomsim.legs import Handle, Turn
from boomsim.loop import Loop
from boomsim.metrics import Metrics
from boomsim.policies import Path, Planner, Settings
from boomsim.profiles import Profile
from boomsim.slo import Slo


@dataclass(frozen=True)
class Topology:
    prefill: int
    decode: int
    p_blocks: int | None = None
    d_blocks: int | None = None
    p_caching: bool = True
    """P's prefix cache (the published setup turns it off)."""


class Cluster:
    """Engines and one router (module docs)."""

    def __init__(self, loop: Loop, profile: Profile, topo: Topology, settings: Settings) -> None:
        self.loop, self.p, self.s = loop, profile, settings
        self.planner = Planner(settings, profile)
        self.metrics = Metrics()
        self.slo = Slo(profile)
        bidir = settings.bidirectional
        self.prefill = [
            self._engine(f"p{i}", "prefill", topo.p_blocks, topo.p_caching)
            for i in range(topo.prefill)
        ]
        self.decode = [
            self._engine(f"d{i}", "decode", topo.d_blocks, True) for i in range(topo.decode)
        ]
        for d in self.decode:
            d.book = RetainedBook() if bidir else None
        for p in self.prefill:
            p.tier = CpuTier(profile.tier_tokens) if settings.cpu_tier else None
        self.eps = {e.name: Endpoint(e.name, e.role) for e in self.prefill + self.decode}  # type: ignore[arg-type]
        self.strategy = LeastWorkAffinity()
        self.affinity = Affinity(capacity=1_000_000, ttl_s=3600.0)
        self.handles: dict[int, Handle] = {}
        self.last_answer: dict[int, float] = {}

    def _engine(self, name: str, role: str, blocks: int | None, caching: bool) -> Engine:
        size = blocks if blocks is not None else self.p.kv_blocks
        pool = BlockPool(size, caching=caching, clock=lambda: self.loop.now)
        floor = self.s.recompute_threshold if role == "prefill" else 0
        return Engine(name, role, self.p, self.loop, pool, floor)

    # -- a turn ----------------------------------------------------------------------------
    def turn(
        self, conv: int, index: int, prompt: int, answer: int, done: Callable[[float], None]
    ) -> None:
        """Serve one turn; `done(t)` when its last token is out."""
        t0 = self.loop.now
        if conv in self.last_answer:
            self.planner.observe_gap(t0 - self.last_answer[conv], t0)
        t = Turn(self, conv, index, prompt, answer, t0, done)
        policy = self.s.policy
        if policy == "plain":
            p = self._least(self.prefill, work=True)
            t.p_leg(p, self._least(self.decode, work=False), Path.RECOMPUTE)
        elif policy in ("affinity", "cpu-tier"):
            p = self._pick_p(conv, prompt)
            t.p_leg(p, self._pick_d(conv, None), Path.RECOMPUTE)
        elif (rule := self.s.decode_first) is not None:
            engines = {e.name: e for e in self.decode}
            p = self._pick_p(conv, prompt)
            busy = rule.p_busy_tokens is not None and self.eps[p.name].work >= rule.p_busy_tokens
            choice = decode_first.choose(
                prompt,
                {e.name: e.cached_tokens(conv, prompt) for e in self.decode},
                {e.name: self.eps[e.name].inflight for e in self.decode},
                rule.tokens,
                self.s.decode_slack,
                ratio=rule.ratio,
                p_busy=busy,
            )
            d = engines[choice.url]
            if choice.alone:
                t.continue_leg(d, None)
            else:
                t.p_leg(p, d, Path.RECOMPUTE)
        else:
            self._boomerang(t)

    def _boomerang(self, t: Turn) -> None:
        conv, prompt, now = t.conv, t.prompt, self.loop.now
        handle = self.handles.pop(conv, None)
        if handle is not None and handle.expires < now:
            handle = None
        p = self._pick_p(conv, prompt)
        if handle is not None and not self.s.adaptive:
            placed = self.affinity.get(_key(conv), now)
            last_p = placed.prefill if placed is not None else None
            if forgoes_handle(last_p, p.name, p.cached_tokens(conv, prompt)):
                handle.decode.end_lease(handle.lease, "forgone")  # the router's `_forgo`
                handle = None
        holder = handle.decode if handle is not None else None
        d = self._pick_d(conv, holder)
        reusable = min(handle.tokens, prompt - 1) if handle is not None else 0
        pullable = handle is not None and handle.decode.claim(handle.lease)
        facts = Facts(
            prompt_tokens=prompt,
            reusable_tokens=reusable,
            pullable=pullable,
            holder_continues=holder is not None and self.s.adaptive,
            p_cached_tokens=p.cached_tokens(conv, prompt),
            d_held_tokens=holder.cached_tokens(conv, prompt) if holder is not None else None,
            d_streams=holder.load if holder is not None else 0,  # what a continue stalls
        )
        plan = self.planner.plan(facts)
        choice = plan.choice
        if handle is not None and (plan.declines or choice is Path.RECOMPUTE):
            handle.decode.end_lease(handle.lease, "declined")
        if choice is Path.CONTINUE and holder is not None:
            t.continue_leg(holder, handle)
        elif choice is Path.PULL and handle is not None:
            t.pull = handle
            t.p_leg(p, d, Path.PULL)
        else:
            t.p_leg(p, d, Path.RECOMPUTE)

    # -- engine choice (the router's strategy over its view of each engine) ------------------
    def _least(self, engines: list[Engine], *, work: bool) -> Engine:
        ep = self.strategy._least([self.eps[e.name] for e in engines], key_work=work)
        return self._by_name(engines, ep.url)

    def _by_cache(self, engines: list[Engine], conv: int, prompt: int) -> Engine:
        cached = {e.name: e.cached_tokens(conv, prompt) for e in engines}
        ep = self.strategy.prefill([self.eps[e.name] for e in engines], cached, float(prompt))
        return self._by_name(engines, ep.url)

    def _pick_p(self, conv: int, prompt: int) -> Engine:
        return self._by_cache(self.prefill, conv, prompt)

    def _pick_d(self, conv: int, holder: Engine | None) -> Engine:
        if holder is None:
            placed = self.affinity.get(_key(conv), self.loop.now)
            name = placed.decode if placed is not None else None
        else:
            name = holder.name
        ep = self.strategy.decode([self.eps[e.name] for e in self.decode], name)
        return self._by_name(self.decode, ep.url)

    @staticmethod
    def _by_name(engines: list[Engine], name: str) -> Engine:
        for e in engines:
            if e.name == name:
                return e
        raise KeyError(name)

    def track(self, e: Engine, work: float, sign: int) -> None:
        ep = self.eps[e.name]
        ep.inflight += sign
        ep.work += sign * work

    def placed(self, conv: int, p: Engine | None, d: Engine, prompt: int) -> None:
        self.affinity.put(
            _key(conv), Placement(p.name if p else None, d.name, prompt, self.loop.now)
        )


def _key(conv: int) -> bytes:
    return conv.to_bytes(8, "little")
