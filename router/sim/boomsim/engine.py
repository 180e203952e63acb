"""One vLLM engine as a cost model: its queue, its steps, its KV blocks and retained leases.

Why: the router's decisions are judged by what they do to engines' queues and memory, so the
engine keeps vLLM's scheduling order and nothing else of vLLM. A request is admitted (FCFS, up
to `max_running`) when its blocks can be found, evicting cached blocks and, on a decoder with
retained leases, asking leases to yield by the connector's own rules
(`boomerang.connector.plugin.retained.RetainedBook.yielding`); it then loads remote KV (a NIXL read,
off the engine's compute) and joins the waiting queue. Each step serves the running requests
first (one decode token each), then the waiting ones in order within the token budget
(chunked prefill), and costs `Profile`'s step time. Steps in which nothing waits and nothing
joins are run as one event up to the next finishing request (the same per-step time; a
request that becomes ready meanwhile cuts the run at the step under way). Not modelled:
preemption (a request that cannot get blocks waits at admission instead), speculative decoding,
CUDA-graph batch padding.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from boomerang.connector.plugin.retained import RetainedBook
from boomsim.kvcache import PINNED, BlockPool, CpuTier
from boomsim.loop import Loop
from boomsim.profiles import Profile

Callback = Callable[["Req", float], None]


class Req:
    """One request on one engine. The engine fixes at admission, from its prefix cache, what it
    loads and computes (vLLM's rule): it takes its local hit first, loads what `remote` offers
    beyond it (skipped below the engine's recompute threshold), computes the rest; then it
    generates `decode` tokens (0 on P: it answers once its prefill is done)."""

    __slots__ = (
        "blocks",
        "compute",
        "computed",
        "conv",
        "ctx",
        "decode",
        "first_at",
        "gap",
        "hold",
        "load",
        "on_done",
        "on_first",
        "on_loaded",
        "owed_s",
        "prompt",
        "remote",
        "tier",
    )

    def __init__(
        self,
        conv: int,
        prompt: int,
        remote: int,
        decode: int,
        blocks: int,
        on_first: Callback,
        on_done: Callback | None = None,
        on_loaded: Callback | None = None,
        *,
        hold: bool = False,
    ) -> None:
        self.conv, self.prompt, self.remote, self.decode = conv, prompt, remote, decode
        self.blocks = blocks
        self.on_first, self.on_done, self.on_loaded = on_first, on_done, on_loaded
        self.hold = hold
        """Keep the blocks when done (P: until D has read them; `Engine.let_go`)."""
        self.load = self.compute = self.computed = self.ctx = 0
        self.tier = False
        """What it loads comes from P's CPU tier (PCIe), not a remote engine (NIXL)."""
        self.owed_s = 0.0
        """Engine time its load costs beyond the read, spent in its first step
        (`Profile.pull_on_compute`)."""
        self.first_at = 0.0
        self.gap = 0.0
        """The longest step while it was generating: its worst inter-token gap."""


class Engine:
    """One engine (module docs). `pool` is its KV; `book` its retained leases (a decoder with
    bidirectional transfer), else None."""

    def __init__(
        self,
        name: str,
        role: str,
        profile: Profile,
        loop: Loop,
        pool: BlockPool,
        recompute_threshold: int = 0,
    ) -> None:
        self.name, self.role, self.p, self.loop, self.pool = name, role, profile, loop, pool
        self.recompute_threshold = recompute_threshold
        """kv_recompute_threshold: a load of fewer tokens is computed instead."""
        self.book: RetainedBook | None = None
        self.tier: CpuTier | None = None
        """P's CPU memory tier (the `cpu-tier` policy), else None."""
        self.lease_conv: dict[str, int] = {}
        self.conv_lease: dict[int, str] = {}
        self.lease_ends: dict[str, int] = {}
        self.pending: deque[Req] = deque()
        self.waiting: list[Req] = []
        self.running: list[Req] = []
        self.loading = 0
        self.kv_tokens = 0
        self.busy = False
        self._gen = 0
        self._epoch: tuple[float, float, int] | None = None
        self._run_at = 0.0
        """When the step (or run of decode steps) under way started."""
        self.busy_s = 0.0
        self.computed = 0
        self.loaded = 0
        """Tokens read from other engines (NIXL)."""
        self.tier_loaded = 0
        """Tokens loaded from this engine's CPU tier."""
        self._serial = 0
        self._admitting = False

    # Admission
    def submit(self, req: Req) -> None:
        self.pending.append(req)
        self._admit()

    def cached_tokens(self, conv: int, prompt: int) -> int:
        """What a prompt of `prompt` tokens finds in this engine's prefix cache: whole blocks,
        at least one token left to compute."""
        b = self.p.block_size
        return min(self.pool.held(conv), (prompt - 1) // b) * b

    def _admit(self) -> None:
        if self._admitting:
            return
        self._admitting = True
        try:
            self._admit_head()
        finally:
            self._admitting = False

    def _admit_head(self) -> None:
        pending, p = self.pending, self.p
        while pending:
            req = pending[0]
            if len(self.running) + len(self.waiting) + self.loading >= p.max_running:
                return
            cached = self.cached_tokens(req.conv, req.prompt)  # before acquire grows the item
            item = self.pool.items.get(req.conv)
            if item is not None and item[1] == PINNED:
                self.end_lease(self.conv_lease[req.conv], "taken")  # shared from now on
            yielder = self._yield if self.book is not None else None
            if not self.pool.acquire(req.conv, req.blocks, yielder):
                return
            pending.popleft()
            load = max(0, req.remote - cached)
            if load < self.recompute_threshold:
                load = 0
            if not load and self.tier is not None:  # one source a request: NIXL first
                stored = min(
                    self.tier.get(req.conv), (req.prompt - 1) // p.block_size * p.block_size
                )
                load = max(0, stored - cached)
                req.tier = load > 0
            req.load, req.ctx = load, cached + load
            req.compute = req.computed = req.prompt - cached - load
            if req.load > 0:
                self.loading += 1
                if req.tier:
                    self.tier_loaded += req.load
                    xfer = p.tier_s(load)
                else:
                    self.loaded += req.load
                    xfer = p.pull_s(load) if self.role == "prefill" else p.transfer_s(load)
                    if self.role == "prefill" and p.pull_on_compute:
                        xfer = p.transfer_s(load)
                        req.owed_s = p.pull_s(load) - xfer
                self.loop.at(self.loop.now + xfer, self._loaded, req)
            else:
                if req.on_loaded is not None:
                    req.on_loaded(req, self.loop.now)
                self._ready(req)

    def _loaded(self, req: Req) -> None:
        self.loading -= 1
        if req.on_loaded is not None:
            req.on_loaded(req, self.loop.now)
        self._ready(req)

    def _ready(self, req: Req) -> None:
        self.waiting.append(req)
        if not self.busy:
            self.busy = True
            self.loop.at(self.loop.now, self._step)
        elif self._epoch is not None:
            self._cut_epoch()

    # Steps
    def _step(self, _: Any = None) -> None:
        running, waiting, p = self.running, self.waiting, self.p
        if not running and not waiting:
            self.busy = False
            return
        budget = p.token_budget - len(running)
        t = p.step_fixed_s + (p.decode_s(len(running), self.kv_tokens) if running else 0.0)
        chunks: list[tuple[Req, int]] = []
        for req in waiting:
            if budget <= 0:
                break
            n = min(req.compute, budget)
            chunks.append((req, n))
            t += p.prefill_s(n, req.ctx) + req.owed_s
            req.owed_s = 0.0
            budget -= n
        self._gen += 1
        now = self.loop.now
        self._run_at = now
        if chunks:
            self._epoch = None
            self.loop.at(now + t, self._end, (self._gen, 1, chunks))
            self.busy_s += t
            return
        k = min(r.decode for r in running)
        # Per-step time at the run's mean KV (it grows by one token a request a step).
        t = p.step_fixed_s + p.decode_s(len(running), self.kv_tokens + len(running) * k // 2)
        self._epoch = (now, t, k)
        self.loop.at(now + k * t, self._end, (self._gen, k, chunks))
        self.busy_s += k * t

    def _cut_epoch(self) -> None:
        """A request became ready during a run of decode steps: end the run at the step under
        way."""
        assert self._epoch is not None
        start, t, k = self._epoch
        done = int((self.loop.now - start) / t) + 1
        if done < k:
            self._gen += 1
            self.busy_s -= (k - done) * t
            self._epoch = None
            self.loop.at(start + done * t, self._end, (self._gen, done, []))

    def _end(self, arg: tuple[int, int, list[tuple[Req, int]]]) -> None:
        gen, k, chunks = arg
        if gen != self._gen:
            return  # cut short: a later event ends this run
        self._epoch = None
        now = self.loop.now
        finished: list[Req] = []
        if self.running:
            step_s = (now - self._run_at) / k
            for r in self.running:
                r.gap = max(r.gap, step_s)
                r.decode -= k
                r.ctx += k
                if r.decode <= 0:
                    finished.append(r)
            self.kv_tokens += k * len(self.running)
            if finished:
                self.running = [r for r in self.running if r.decode > 0]
        for req, n in chunks:
            req.compute -= n
            req.ctx += n
            self.computed += n
            if req.compute > 0:
                continue
            self.waiting.remove(req)
            req.first_at = now
            if self.tier is not None:  # the prompt just computed, offloaded in whole blocks
                self.tier.put(req.conv, req.prompt // self.p.block_size * self.p.block_size)
            req.on_first(req, now)
            if req.decode > 1:
                req.decode -= 1
                self.running.append(req)
                self.kv_tokens += req.ctx
            elif req.decode == 1:
                req.decode = 0
                self.kv_tokens += req.ctx
                finished.append(req)
            elif not req.hold:
                self._done(req, now)
        for r in finished:
            self.kv_tokens -= r.ctx
            self._done(r, now)
        self._step()
        if self.pending:
            self._admit()

    def _done(self, req: Req, now: float) -> None:
        if req.on_done is not None:
            req.on_done(req, now)  # may pin the blocks (`retain`) instead of the release below
        if req.conv in self.pool.items and self.pool.items[req.conv][1] != PINNED:
            self.pool.release(req.conv, req.ctx // self.p.block_size)
        if self.pending:
            self._admit()

    def let_go(self, req: Req) -> None:
        """P's blocks of a finished request once D has read them."""
        self.pool.release(req.conv, req.ctx // self.p.block_size)
        if self.pending:
            self._admit()

    # Retained leases (a decoder with bidirectional transfer)
    def retain(self, req: Req, deadline: float) -> str:
        """Pin `req`'s blocks (prompt and answer, whole blocks) until `deadline`; the lease's id."""
        assert self.book is not None
        self._serial += 1
        rid = f"{self.name}-{req.conv}-{self._serial}"
        self.pool.release(req.conv, req.ctx // self.p.block_size, pin=True)
        self.book.retained(rid, self.loop.now, deadline)
        self.lease_conv[rid], self.conv_lease[req.conv] = req.conv, rid
        self.loop.at(deadline, self._expire, rid)
        return rid

    def claim(self, rid: str) -> bool:
        """The router's claim before it offers the lease to P (`retained.RetainedBook.claim`)."""
        return self.book is not None and rid in self.book.claim([rid])["held"]

    def _expire(self, rid: str) -> None:
        self.end_lease(rid, "expired")

    def end_lease(self, rid: str, why: str) -> None:
        """A lease ends (read, released, expired, yielded, taken by a turn on this engine)."""
        if self.book is None or self.book.leases.pop(rid, None) is None:
            return
        conv = self.lease_conv.pop(rid)
        if self.conv_lease.get(conv) == rid:
            del self.conv_lease[conv]
        self.pool.unpin(conv)
        self.lease_ends[why] = self.lease_ends.get(why, 0) + 1
        if self.pending:
            self._admit()  # a no-op while admitting (a yield or a turn taking its lease)

    def _yield(self, shortfall: int) -> None:
        assert self.book is not None
        held = self.pool.held
        chosen = self.book.yielding(shortfall, lambda r: held(self.lease_conv[r]), self.loop.now)
        for rid in chosen:
            self.end_lease(rid, "yielded")

    @property
    def load(self) -> int:
        return len(self.pending) + len(self.waiting) + len(self.running) + self.loading
