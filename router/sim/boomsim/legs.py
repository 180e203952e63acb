"""One turn's legs on the engines, and what the router learns and files from them.

Why apart from the cluster: the cluster chooses (the router's decisions), a `Turn` carries out
the choice (the router's `legs.py` and `serving.py`): P then D, or the decoder alone, then D's
new handle filed and the conversation's placement kept. See `cluster.py` for the flow."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from boomsim.engine import Engine, Req
from boomsim.loop import Loop
from boomsim.metrics import Metrics
from boomsim.policies import Path, Planner, Settings
from boomsim.profiles import Profile
from boomsim.slo import Slo


@dataclass(slots=True)
class Handle:
    """D's params as the router keeps them: which D, which lease, how many tokens."""

    decode: Engine
    lease: str
    tokens: int
    expires: float


class Router(Protocol):
    """What a turn's legs read and file in the cluster's router (`cluster.Cluster`): named
    here so that the legs need not import the cluster, which imports them."""

    loop: Loop
    p: Profile
    s: Settings
    planner: Planner
    metrics: Metrics
    slo: Slo
    handles: dict[int, Handle]
    last_answer: dict[int, float]

    def track(self, e: Engine, work: float, sign: int) -> None: ...

    def placed(self, conv: int, p: Engine | None, d: Engine, prompt: int) -> None: ...


def _blocks(tokens: int, size: int) -> int:
    return -(-tokens // size)


class Turn:
    """One turn in flight (module docs)."""

    __slots__ = (
        "answer",
        "c",
        "conv",
        "d",
        "done",
        "index",
        "p",
        "p_at",
        "p_req",
        "path",
        "prompt",
        "pull",
        "t0",
        "work",
    )

    def __init__(
        self,
        c: Router,
        conv: int,
        index: int,
        prompt: int,
        answer: int,
        t0: float,
        done: Callable[[float], None],
    ) -> None:
        self.c, self.conv, self.index, self.prompt, self.answer = c, conv, index, prompt, answer
        self.t0, self.done = t0, done
        self.pull: Handle | None = None
        """The handle P pulls from (path pull)."""
        self.p: Engine | None = None
        self.d: Engine | None = None
        self.p_req: Req | None = None
        self.p_at = 0.0
        self.path = Path.RECOMPUTE
        self.work = 0
        """The prompt tokens the router counted on the first leg's engine (`Cluster.track`)."""

    def p_leg(self, p: Engine, d: Engine, path: Path) -> None:
        """P prefills (pulling from the handle's holder on path pull), then D decodes."""
        self.p, self.d, self.path = p, d, path
        h = self.pull
        remote = min(h.tokens, self.prompt - 1) if h is not None and path is Path.PULL else 0
        req = Req(
            self.conv,
            self.prompt,
            remote,
            0,
            _blocks(self.prompt, p.p.block_size),
            self._p_answered,
            on_loaded=self._p_loaded if remote else None,
            hold=True,
        )
        self.p_req = req
        self.work = self.prompt - p.cached_tokens(self.conv, self.prompt)
        self.c.track(p, self.work, 1)
        loop = self.c.loop
        loop.at(loop.now + self.c.p.request_overhead_s, p.submit, req)

    def _p_loaded(self, req: Req, now: float) -> None:
        """P read the history (or its cache made the read needless): D's lease ends."""
        assert self.pull is not None
        self.pull.decode.end_lease(self.pull.lease, "read" if req.load else "unread")

    def _p_answered(self, req: Req, now: float) -> None:
        assert self.p is not None and self.d is not None
        c = self.c
        c.track(self.p, self.work, -1)
        self.work = 0
        c.planner.model.observe_prefill(req.computed, req.load, now - self.t0)
        c.metrics.p_leg.append(now - self.t0)
        self.p_at = now
        c.track(self.d, 0, 1)
        d_req = Req(
            self.conv,
            self.prompt,
            self.prompt - 1,
            self.answer,
            _blocks(self.prompt + self.answer, self.d.p.block_size),
            self._first,
            self._finished,
            self._d_loaded,
        )
        self.d.submit(d_req)

    def _d_loaded(self, req: Req, now: float) -> None:
        assert self.p is not None and self.p_req is not None
        self.p.let_go(self.p_req)

    def continue_leg(self, d: Engine, handle: Handle | None) -> None:
        """The decoder serves the turn alone from its prefix cache."""
        del handle  # its lease is taken over by the request on admission (`Engine._admit`)
        self.d, self.path = d, Path.CONTINUE
        self.work = self.prompt - d.cached_tokens(self.conv, self.prompt)
        self.c.track(d, self.work, 1)
        req = Req(
            self.conv,
            self.prompt,
            0,
            self.answer,
            _blocks(self.prompt + self.answer, d.p.block_size),
            self._first,
            self._finished,
        )
        loop = self.c.loop
        loop.at(loop.now + self.c.p.request_overhead_s, d.submit, req)

    def _first(self, req: Req, now: float) -> None:
        c = self.c
        if self.path is Path.CONTINUE:
            c.planner.model.observe_continue(req.computed, now - self.t0)
        else:
            c.planner.model.observe_decode_first(self.prompt, now - self.p_at)
        c.metrics.first_token(self.index, now - self.t0, self.path.value)

    def _finished(self, req: Req, now: float) -> None:
        c, d = self.c, self.d
        assert d is not None
        c.track(d, self.work, -1)
        if c.s.bidirectional:
            lease = d.retain(req, now + c.planner.lease_s(now))
            tokens = self.prompt + self.answer - 1
            c.handles[self.conv] = Handle(d, lease, tokens, now + c.s.handle_ttl_s)
        c.placed(self.conv, self.p, d, self.prompt)
        c.last_answer[self.conv] = now
        tpot = (now - req.first_at) / (self.answer - 1) if self.answer > 1 else None
        met = c.slo.meets(self.prompt, self.answer, req.first_at - self.t0, tpot)
        c.metrics.finished(self.answer, req.first_at, now, met=met, gap=req.gap)
        self.done(now)
