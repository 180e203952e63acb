"""Engine endpoints, their health and load, and the (replaceable) selection strategy.

An endpoint is one engine pod's base URL. Its state is what the router observed: in-flight
requests and outstanding work (estimated prompt tokens), consecutive failures (ejected after
`eject_after_failures`, brought back by the health prober), and capabilities (vLLM version,
whether streamed responses carry kv_transfer_params, the KV block size). Discovery replaces the
URL set; state of surviving URLs is kept.

Pairing comes before selection: P and D of a turn must share one engine revision (`pairable`,
`partners`), which each engine publishes on its `/metrics`, and one vLLM version (its
`/version`).

Selection is a small strategy object so it can be replaced: the default sends prefill to the
least outstanding work and keeps a conversation on the decode pod that holds its history (its
prefix cache shrinks the P->D transfer) unless that pod is `slack` requests busier than the
least loaded one.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, NamedTuple, Protocol

Role = Literal["prefill", "decode"]


MAX_DEPARTED = 4096
"""Departed URLs remembered per pool: far more pods than a pool churns through in a TTL."""
STREAM_WEIGHT = 0.1
"""Weight of the newest stream in `Endpoint.stream_s`: about the last ten streams, so it
follows a change of load within seconds of traffic and one long answer moves it by a tenth."""
MAX_STREAM_S = 3600.0
"""A longer stream is a stall or a clock jump, not a decode time: ignored."""


class Mark(NamedTuple):
    """Where a stream on a decoder started: the joined counts and the load integral then."""

    continued: int
    handed_over: int
    load_s: float
    at: float


class Joined(NamedTuple):
    """What a stream on a decoder saw: the turns that joined its batch, and the others in it."""

    continued: int
    handed_over: int
    others: float
    """The other requests in flight on the decoder, on average over the stream."""


@dataclass(eq=False)
class Endpoint:
    """One engine as the router sees it."""

    url: str
    role: Role
    inflight: int = 0
    work: float = 0.0
    """Prefill: the tokens it computes of the turns sent to it and not yet answered (what
    its cache lacks of each): the queue a new turn waits behind."""
    kv_tokens: float = 0.0
    """Prefill: the whole prompts of those turns: KV they hold while they run, which the
    blocks of older conversations make room for (`forgetting.py`)."""
    prefilling: float = 0.0
    """Decode: the tokens it computes itself for turns sent straight to it (continued on the
    holder) that have not had their first token: prefill work its other streams wait behind."""
    stream_s: float = 0.0
    """Decode: how long its streams decode, first token to last (a moving mean of the
    router's measures, `streamed`; 0 until one is measured): the continue path's ITL budget
    is a share of it (`costmodel.itl_budget`)."""
    stream_tokens: float = 0.0
    """Decode: how many tokens its streams decode (a moving mean like `stream_s`; 0: none
    measured): what a stream's TPOT slack is spread over (`costmodel.stall_budget`)."""
    stream_tpot: float = 0.0
    """Decode: how fast its streams decoded per token (a moving mean like `stream_s`; 0: none
    measured): the SLO-aware gate's measured brake (`costmodel.BRAKE`)."""
    stalled_s: float = 0.0
    """Decode: the stalls charged to its streams so far, summed (`stall`): each turn that
    joins it (a prefill of its own, or a handover from P) stalls every stream it decodes."""
    live: dict[int, float] = field(default_factory=dict)
    """Decode: the streams it decodes now, each with `stalled_s` when it got its first token
    (`begin`, `end`): what each has absorbed since is the difference."""
    joined: tuple[int, int] = (0, 0)
    """Decode: the requests that got their first token here so far, (continued, handed
    over): turns continued on it (or served by it alone) and turns handed over from P. A
    stream's difference from its start to its end is what joined its batch meanwhile
    (`costmodel.CostModel.observe_stream`)."""
    load_s: float = 0.0
    """Its in-flight requests integrated over time (request-seconds) up to `load_at`: over a
    stream, the difference is the batch it decoded in (`Mark`)."""
    load_at: float = field(default_factory=time.perf_counter)
    failures: int = 0
    ejected: bool = False
    lost_at: float = 0.0
    """Wall clock of the last ejection, or of its URL leaving discovery. An engine that went
    away may have restarted and lost its KV: handles made before this naming it are void (see
    `Router._claim`)."""
    probed_ok: bool = False
    successes_since_eject: int = 0
    version: str | None = None
    block_size: int | None = None
    """KV block size in tokens from the engine's `vllm:cache_config_info` gauge (decode pool):
    None until learned, 0 when the engine does not say (then its handles allow full hits only).
    Forgotten on ejection: an engine that went away may come back configured differently."""
    kv_blocks: int | None = None
    """D's KV cache size in blocks (`num_gpu_blocks` of `vllm:cache_config_info`), read with the
    block size; None or 0 when not known (then no decode-memory budget applies to it)."""
    stream_params: bool | None = None
    """Whether D's streamed final chunk carries kv_transfer_params (None: not known yet)."""
    stream_params_at: float = 0.0
    revision: str | None = None
    """The engine revision it publishes on `/metrics` (build and connector settings): P and D
    hand KV over only within one revision. None: it does not say, and pairs with any."""
    identified: bool = False
    """Its `/metrics` page was read (revision learned, or known not to be published)."""
    reports_cached: bool = False
    """Prefill: an answer of it stated its cached prompt tokens (`usage.says_cached`): from
    then on a count short of a pull says the pull failed (`legs.PrefillDecode._pull_failed`);
    before, the engine may not report them at all (no `--enable-prompt-tokens-details`)."""
    capabilities: frozenset[str] = frozenset()
    """What Boomerang's plugin says is in force on it (`/metrics`): `continue` lets the router
    send a turn straight to it as the decoder holding the history."""

    @property
    def ready(self) -> bool:
        """Answered a health probe and is not ejected."""
        return self.probed_ok and not self.ejected

    def count(self, delta: int, now: float | None = None) -> None:
        """A request in flight more (1) or less (-1), the load integral brought up to now."""
        now = time.perf_counter() if now is None else now
        self.load_s += self.inflight * max(0.0, now - self.load_at)
        self.load_at, self.inflight = now, self.inflight + delta

    def join(self, handed_over: bool, now: float | None = None) -> Mark:
        """Count a request that got its first token here; the mark its own stream is measured
        from (what joined after it, and the load from now)."""
        continued, over = self.joined
        self.joined = (continued, over + 1) if handed_over else (continued + 1, over)
        self.count(0, now)
        return Mark(*self.joined, self.load_s, self.load_at)

    def since(self, mark: Mark, now: float | None = None) -> Joined:
        """What joined the batch since `mark`, and how many other requests were in flight on
        average meanwhile (the stream's own excluded)."""
        self.count(0, now)
        span = self.load_at - mark.at
        batch = (self.load_s - mark.load_s) / span if span > 0 else float(self.inflight)
        return Joined(
            self.joined[0] - mark.continued, self.joined[1] - mark.handed_over, max(0.0, batch - 1)
        )

    def streamed(self, seconds: float, tokens: int = 0) -> None:
        """One stream's decode time (first token to last) into `stream_s`, and its output
        tokens into `stream_tokens`."""
        if math.isfinite(seconds) and 0 < seconds < MAX_STREAM_S:
            self.stream_s = _moving(self.stream_s, seconds)
            if tokens > 1:
                self.stream_tokens = _moving(self.stream_tokens, float(tokens))
                self.stream_tpot = _moving(self.stream_tpot, seconds / (tokens - 1))

    def stall(self, seconds: float) -> None:
        """Charge a stall to every stream it decodes now (a turn joining its batch)."""
        if math.isfinite(seconds) and seconds > 0:
            self.stalled_s += seconds

    def begin(self) -> int:
        """A stream got its first token here: its ledger entry (`end` it)."""
        key = next(_STREAM_KEYS)
        self.live[key] = self.stalled_s
        return key

    def end(self, key: int) -> None:
        self.live.pop(key, None)

    def absorbed(self) -> float:
        """The most stall any live stream has absorbed since its first token."""
        return self.stalled_s - min(self.live.values()) if self.live else 0.0


def _moving(old: float, new: float) -> float:
    """A moving mean weighing the newest value `STREAM_WEIGHT` (the first one alone)."""
    return new if old <= 0 else old + STREAM_WEIGHT * (new - old)


_STREAM_KEYS = itertools.count()


@dataclass
class Pool:
    """The endpoints of one role."""

    role: Role
    eject_after: int = 3
    readmit_after: int = 1
    endpoints: dict[str, Endpoint] = field(default_factory=dict)
    departed: dict[str, float] = field(default_factory=dict)
    """URL -> wall clock when discovery last dropped it (the most recent MAX_DEPARTED)."""

    def set_urls(self, urls: Sequence[str]) -> None:
        """Replace the URL set (from discovery), keeping the state of URLs that remain.

        A URL that left and comes back is a new endpoint, but it may be the same pod restarted
        without its KV (a pod leaves the ready EndpointSlice while it restarts and keeps its
        IP): it comes back with `lost_at` set to when it left, which voids older handles.
        """
        wanted = list(dict.fromkeys(u.rstrip("/") for u in urls))
        now = time.time()
        for url in self.endpoints.keys() - set(wanted):
            self.departed[url] = now  # never there already: a URL's arrival pops it
        while len(self.departed) > MAX_DEPARTED:
            del self.departed[next(iter(self.departed))]
        self.endpoints = {u: self.endpoints.get(u) or self._arrived(u) for u in wanted}

    def _arrived(self, url: str) -> Endpoint:
        return Endpoint(url, self.role, lost_at=self.departed.pop(url, 0.0))

    def get(self, url: str | None) -> Endpoint | None:
        """The endpoint with this URL, if it is still known."""
        return self.endpoints.get(url) if url else None

    def candidates(self, exclude: set[str] | None = None) -> list[Endpoint]:
        """Usable endpoints; when all are ejected, the ejected ones (better than failing)."""
        exclude = exclude or set()
        pool = [e for e in self.endpoints.values() if e.url not in exclude]
        healthy = [e for e in pool if not e.ejected]
        return healthy or pool

    def ready_count(self) -> int:
        """Endpoints that passed a probe and are not ejected."""
        return sum(1 for e in self.endpoints.values() if e.ready)

    def failed(self, ep: Endpoint) -> bool:
        """Record a failure; returns True when this ejected the endpoint."""
        ep.failures += 1
        ep.successes_since_eject = 0
        if not ep.ejected and ep.failures >= self.eject_after:
            ep.ejected = True
            ep.lost_at = time.time()
            ep.block_size = None
            ep.identified = False
            ep.version = None  # it may come back as another build
            return True
        return False

    def succeeded(self, ep: Endpoint, *, probe: bool = False) -> None:
        """Record a success; a probe success readmits an ejected endpoint."""
        ep.failures = 0
        if probe:
            ep.probed_ok = True
            if ep.ejected:
                ep.successes_since_eject += 1
                if ep.successes_since_eject >= self.readmit_after:
                    ep.ejected = False
                    ep.successes_since_eject = 0

    def track(self, ep: Endpoint, work: float, kv_tokens: float = 0.0) -> Tracked:
        """Count a request against the endpoint's load while it runs (`with`)."""
        return Tracked(ep, work, kv_tokens)


class Tracked:
    """A request counted against its endpoint's load for the `with` block: a class, not a
    generator context manager, because every engine call of every turn enters one."""

    __slots__ = ("_ep", "_kv", "_work")

    def __init__(self, ep: Endpoint, work: float, kv_tokens: float = 0.0) -> None:
        self._ep, self._work, self._kv = ep, work, kv_tokens

    def __enter__(self) -> None:
        self._ep.count(1)
        self._ep.work += self._work
        self._ep.kv_tokens += self._kv

    def __exit__(self, *exc: object) -> None:
        self._ep.count(-1)
        self._ep.work -= self._work
        self._ep.kv_tokens -= self._kv


def compatible(a: Endpoint, b: Endpoint) -> bool:
    """Whether two engines may hand KV to each other: the same revision and the same vLLM
    version, each where both say.

    vLLM's NIXL handshake hashes its own version and connector version (14 in 0.32, 15 in 0.33,
    16 in 0.34), so P and D of two vLLM releases never complete one: this holds even between
    engines that publish no revision, or one revision over two images (a role's pod template
    overriding the engine image)."""
    same_revision = a.revision is None or b.revision is None or a.revision == b.revision
    same_vllm = a.version is None or b.version is None or a.version == b.version
    return same_revision and same_vllm


def pairable(prefill: Sequence[Endpoint], decode: Sequence[Endpoint]) -> list[Endpoint]:
    """The prefill candidates that have a compatible decode candidate.

    During a rollout the operator moves prefill to the new engine revision first and holds
    decode on the old one; a P of one revision and a D of the other never share a turn. Empty
    when no pair exists (then the turn is served by one engine alone, or fails clearly).
    """
    return [p for p in prefill if any(compatible(p, d) for d in decode)]


def partners(p: Endpoint, decode: Sequence[Endpoint]) -> list[Endpoint]:
    """The decode candidates that may take over P's KV."""
    return [d for d in decode if compatible(p, d)]


def prefill_choices(
    candidates: Sequence[Endpoint], decoders: Sequence[Endpoint], holder: Endpoint | None
) -> list[Endpoint]:
    """The prefill engines a P/D turn may use: those with a decode partner, and of those the
    ones that may pull the history from the conversation's holder, when there are such; all
    candidates when none has a partner (the decode pick then finds none and says so)."""
    paired = pairable(candidates, decoders) or list(candidates)
    if holder is None:
        return paired
    return [p for p in paired if compatible(p, holder)] or paired


class Strategy(Protocol):
    """Chooses engines; must be cheap and must not do I/O."""

    def prefill(
        self,
        candidates: Sequence[Endpoint],
        cached: Mapping[str, int] | None = None,
        prompt_tokens: float = 0.0,
    ) -> Endpoint:
        """The prefill engine for a turn (candidates is never empty); `cached` is what each
        engine (by URL) probably holds of the prompt in its prefix cache."""
        ...

    def decode(self, candidates: Sequence[Endpoint], holder: str | None) -> Endpoint:
        """The decode engine; `holder` is the URL of the D holding the conversation, if any."""
        ...


class LeastWorkAffinity:
    """P: the least work left, counting what each P must compute of the prompt (its prefix
    cache may hold the history); D: affinity to the holder with an overload escape."""

    def __init__(self, slack: int = 4) -> None:
        self.slack = slack
        self._ticks = {"prefill": itertools.count(), "decode": itertools.count()}

    def _least(self, candidates: Sequence[Endpoint], key_work: bool) -> Endpoint:
        # Rotate the starting point so ties spread evenly instead of piling on the first.
        start = next(self._ticks[candidates[0].role]) % len(candidates)
        ordered = list(candidates[start:]) + list(candidates[:start])
        if key_work:
            return min(ordered, key=lambda e: (e.work, e.inflight))
        return min(ordered, key=lambda e: (e.inflight, e.work))

    def prefill(
        self,
        candidates: Sequence[Endpoint],
        cached: Mapping[str, int] | None = None,
        prompt_tokens: float = 0.0,
    ) -> Endpoint:
        if not cached:
            return self._least(candidates, key_work=True)
        start = next(self._ticks["prefill"]) % len(candidates)
        ordered = list(candidates[start:]) + list(candidates[:start])

        def left(ep: Endpoint) -> tuple[float, int]:
            to_compute = max(0.0, prompt_tokens - cached.get(ep.url, 0))
            return ep.work + to_compute, ep.inflight

        return min(ordered, key=left)

    def decode(self, candidates: Sequence[Endpoint], holder: str | None) -> Endpoint:
        least = self._least(candidates, key_work=False)
        for ep in candidates:
            if ep.url == holder and ep.inflight <= least.inflight + self.slack:
                return ep
        return least


class Prefilling:
    """A decoder's own prefill of a turn sent straight to it, counted in `prefilling` from
    the call until `done` (its first token) or the end of the `with` block, whichever first."""

    __slots__ = ("_counted", "_ep", "_tokens")

    def __init__(self, ep: Endpoint, tokens: float) -> None:
        self._ep, self._tokens, self._counted = ep, max(0.0, tokens), False

    def __enter__(self) -> Prefilling:
        self._ep.prefilling += self._tokens
        self._counted = True
        return self

    def done(self) -> None:
        if self._counted:
            self._counted = False
            self._ep.prefilling -= self._tokens

    def __exit__(self, *exc: object) -> None:
        self.done()
