"""Which path a turn takes: pull, recompute or continue on D, from learned costs (pure).

Kept apart from the flow because the choice must be cheap, explainable and table-tested alone.
Each path's time to first token is a small linear model of the turn's shape (suffix = prompt -
reusable tokens):

- pull      = p_fixed + p_compute * (p_queue + suffix) + p_pull_fixed + p_pull * reusable
              + d_first(prompt)
- recompute = p_fixed + p_compute * (p_queue + prompt) + d_first(prompt)
- continue  = d_fixed + d_compute * (d_queue + suffix)
- d_first(n) = d_first_fixed + d_first * n  (D reads P's blocks and takes its first step)

The queues make the plans load-aware: `p_queue` is the work (tokens to compute) the router has
sent to the chosen P and not had answered, `d_queue` the prefill work of turns continued on the
holder that have not had their first token (`Endpoint.work`, `Endpoint.prefilling`: the
router's own accounting). A turn waits behind them, so each is in its own path's estimate. What
a continue costs D's other streams is its own prefill, `d_fixed + d_compute * suffix`, not the
queue's: the queued prefills stall those streams whichever path this turn takes, and a stream's
time per output token grows by the sum of the prefills it sees, however they are batched. So
the continue path is allowed while its own prefill stays within the ITL budget, and the queue
decides only through the turn's own wait (a deep queue makes P the cheaper path). Measured why
(2p1d and pressure, 2026-12-06): gating on `d_queue + suffix` sent 4-9 of a run's 36
follow-ups to P, where they took 296-311 ms (median) against 145 ms continued, and made the
follow-up p99; decode-first-512, which continued them all, had the same TPOT (23 against 24 ms).
P's observations carry the queue they waited behind in their computed tokens, so `p_compute` is
P's throughput, not a time that grows with the load.

The ITL budget is derived, not set for one machine (`itl_budget`): a continued prefill stalls
each stream D is decoding once, by about its own cost on D; spread over that stream's decode
time S (first token to last, the router's measure of the holder's recent streams) it adds
cost / S to the stream's time per output token, so the budget is `tpot_tolerance * S` (10 %:
one continue seen by a stream costs it at most a tenth of its TPOT). Until D has a measured
stream (only non-streamed answers so far) the budget is `FALLBACK_ITL_BUDGET_S`; an operator
may still pin one (`itl_budget_s`). Successive continues a long stream sees each add
their share (measured by the production benchmark's TPOT, not bounded here).

Over the budget a continue is still allowed where it pays in everyone's waiting
(`_overrun_pays`): the turn saves `best other path - continue`, and each of the holder's
streams (its requests in flight, the router's count) waits `own prefill - budget` more than
the budget allows. Measured why (spare, 2026-12-05): the first follow-ups of eight conversations
arrive together, each continue queues behind the others on D and overruns the budget, and the
refused ones waited 0.5-1.4 s on P behind the first turns' prefills: the follow-up p99.

A refused continue is not free for D's streams either: the turn comes back to D from P, and D
takes its blocks and its first step while they wait. So what the budget bounds is the
difference, `own prefill - stream_handoff_stall`, and the handover's stall is learned from the
streams themselves (`observe_stream`): each stream's decode time, first token to last, is fitted
on its output tokens, on those times the other requests in D's batch (a step grows with the
batch), and on how many turns joined D meanwhile, continued and handed over
(`stream_s_per_token`, `stream_s_per_token_per_other`, `stream_continue_stall_s`,
`stream_handoff_stall_s`). Its prior is 0, the model before it: a handover free for D. Measured
why (2p1d, 2026-12-06, offline from the client's records and the router's log, 660 streams
over three policies): a stream on D lost 74 ms per continued turn and 65 ms per handed-over one
(10 ms per token, 2 ms more per other request in the batch; R² 0.95), so continuing a 250-400
token suffix cost D's streams about 10 ms more than sending it to P, not its whole prefill.
The rule without it sent 23 of a set's 180 follow-ups to P, where they took 237-330 ms (median
by path) against 156 ms continued and made the follow-up p99, for no TPOT (27 ms against
decode-first-512's 26 ms). Its prior weighs as much as 20 streams, as every leg's does: a
benchmark run's fresh router, 44 streams, kept it at 0; fed those runs' streams one after
another, it reached 16-30 ms after 220. On an accelerator, where D reads P's blocks by RDMA
beside its steps, a handover should cost D's streams little (not measured here): the learned
stall then stays near 0 and the rule near the old one.

With the turns' bounds known (`Bounds.slo`, the default through the router's `slo_aware`),
the ITL budget and its overrun give way to `_slo_allows`: a budget per stream rather than per
continue. Each turn that joins a decoder stalls the streams it decodes; the router sums what
each live stream absorbed (`Shape.d_absorbed_s`, the most of any), and a continue is allowed
while that stays within `SLACK_SHARE` of the stream's TPOT slack (`stall_budget`). Why
(agentic, equal engines, 2026-12-06): the per-continue budget, a tenth of a stream's time,
let 4 of 51 tool results continue while D's TPOT sat at 14 ms against a 37 ms bound, and the
rest queued on P behind first turns: goodput 1.17x the best peer's where 1.5x was the target.
A first turn (`Shape.first_turn`) may run on a decoder alone too, only when P's estimate
misses its TTFT bound (`ttft_slo`).

Pull minus recompute is `p_pull_fixed - (p_compute - p_pull) * reusable`, so the break-even is
one history length and does not depend on the suffix. The engine's `kv_recompute_threshold` is a
floor: P would recompute below it whatever the router sends, so pull is never allowed there.

The coefficients are learned online: one weighted least-squares fit per leg (the P leg on
[1, computed, pulled > 0, pulled], D's first token on [1, prompt], the continue path on
[1, computed]), token features in thousands to keep the 4x4 normal equations well conditioned
(`wls.py`: relative-error weights, forgetting with a half-life counted in observations so the
model follows the load, coefficients kept >= 0). The priors enter as pseudo-observations spread
over typical shapes, worth `prior_weight` observations at first and fading like real ones down
to `prior_floor`: a handful of noisy points cannot flip a decision, and a fit fed one shape only
(say, every pull of the same size) stays well posed. Non-finite, negative or hour-long
observations are ignored.

`DEFAULT_PRIORS` are conservative on purpose. `p_pull_fixed_s = 0` and `p_pull_s_per_token <
p_compute_s_per_token` make pull never dearer than recompute: until the router has measured a
fixed cost per pull it pulls whenever the engine would (reusable >= floor), exactly as `static`.
The continue leg's cost is learned only from continued turns, which its own prior would never
allow (D's prefill rate, guessed, decides whether a first one runs): until the continue leg has
its own observations, D computes a token as fast as P was measured to (one model, one kind of
accelerator in both roles), so the first continues are allowed by what the engines showed, not
by a number set for one machine; the first continue observed starts the continue fit from that
rate (from the static prior, one observation left D at 5x P's rate again: measured, every
continue after the first was refused). What D's other streams may wait is the ITL budget (above).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Final

from boomerang.router.learning.wls import ForgettingFit


class Path(StrEnum):
    """A turn's path: the values of `boomerang_router_path_total{path}`."""

    PULL = "pull"
    RECOMPUTE = "recompute"
    CONTINUE = "continue"


_PREFERENCE: Final = (Path.PULL, Path.RECOMPUTE, Path.CONTINUE)
"""Tie order: today's behaviour (static) first."""
_TIE_S: Final = 1e-9
"""Costs closer than this (seconds) are a tie."""
_MAX_OBSERVED_S: Final = 3600.0
"""Longer is no latency but a stall or a clock jump: ignored."""
_K: Final = 1000.0
"""Token features are in thousands of tokens (conditioning)."""
_SCALE: Final = (1.0, 1 / _K, 1.0, 1 / _K, 1.0, 1 / _K, 1.0, 1 / _K, 1 / _K, 1 / _K, 1.0, 1.0)
"""Fitted value -> `Coefficients` field, in field order."""
_LEGS: Final = ("prefill", "decode_first", "continue", "stream")
_MEASURED: Final = ("idle_tpot_s", "observations")
"""`Coefficients` fields that are measured or counted, not fitted (no prior)."""
IDLE_WINDOW: Final = 256
"""Streams the idle TPOT is the fastest of until a probe measured it: enough to hold a quiet
moment of the traffic (its start, a gap between bursts), few enough to follow a change of
model or hardware."""
IDLE_PROBES: Final = 16
"""Probes of an idle decoder the idle TPOT is the fastest of: a probe runs only while the
router sends a decoder nothing, so under steady load the last quiet one is kept."""
IDLE_MIN_TOKENS: Final = 8
"""Shorter streams say little of a time per token (their first step dominates)."""


@dataclass(frozen=True, slots=True)
class Shape:
    """What the router knows of a turn before choosing."""

    prompt_tokens: int
    reusable_tokens: int
    """Verified tokens of D's that P may pull (0: none)."""
    holder: bool
    """A decoder holds the verified history (continue possible)."""
    pullable: bool = True
    """D still pins the blocks, so P may pull them. False for a handle whose lease was released
    (its blocks are only in D's prefix cache, which P cannot read): pull is not offered."""
    p_cached_tokens: int = 0
    """What P probably holds of the prompt already (its prefix cache): P computes only the
    rest, and a pull brings only the reusable tokens beyond it."""
    d_held_tokens: int | None = None
    """What the holder has of the prompt in its cache (None: the verified reusable tokens):
    a continued turn computes the rest."""
    p_queue_tokens: float = 0.0
    """Work queued on P before this turn (tokens it computes first)."""
    d_queue_tokens: float = 0.0
    """Prefill work of continued turns on the holder before this one's (tokens)."""
    d_stream_s: float = 0.0
    """How long the holder's streams decode, first token to last (recent mean; 0: not
    measured): what the ITL budget is derived from (`itl_budget`)."""
    d_streams: int = 0
    """Requests the holder is serving now (the router's count): the streams a continued
    prefill stalls."""
    d_absorbed_s: float = 0.0
    """The most stall any stream live on the holder has absorbed so far (its ledger,
    `Endpoint.absorbed`): what the SLO-aware gate subtracts from that stream's budget."""
    d_stream_tokens: float = 0.0
    """How many tokens the holder's streams decode (a moving mean; 0: not measured)."""
    d_tpot_s: float = 0.0
    """How fast the holder's recent streams decoded, per token (a moving mean; 0: none)."""
    first_turn: bool = False
    """No decoder holds the history: continuing means the decoder computes the whole prompt
    (less its prefix cache), which saves no work, only P's queue (`_slo_allows`)."""

    def __post_init__(self) -> None:
        if not 0 <= self.reusable_tokens <= self.prompt_tokens:
            raise ValueError(f"need 0 <= reusable_tokens <= prompt_tokens, got {self}")
        if not 0 <= self.p_cached_tokens <= self.prompt_tokens:
            raise ValueError(f"need 0 <= p_cached_tokens <= prompt_tokens, got {self}")
        if not (self.p_queue_tokens >= 0 and self.d_queue_tokens >= 0):
            raise ValueError(f"need queues >= 0, got {self}")
        if not (math.isfinite(self.d_stream_s) and self.d_stream_s >= 0):
            raise ValueError(f"need a finite d_stream_s >= 0, got {self}")
        if self.d_streams < 0:
            raise ValueError(f"need d_streams >= 0, got {self}")
        if not (_valid(self.d_absorbed_s, self.d_stream_tokens, self.d_tpot_s)):
            raise ValueError(
                f"need finite d_absorbed_s, d_stream_tokens, d_tpot_s >= 0, got {self}"
            )

    @property
    def _reach(self) -> int:
        """How far D's blocks cover the prompt: the verified tokens, in the whole blocks the
        holder has of them when its KV events say (a pull and a continue both stop there)."""
        if self.d_held_tokens is None:
            return self.reusable_tokens
        return min(self.reusable_tokens, self.d_held_tokens)

    @property
    def suffix_tokens(self) -> int:
        """What P computes after a pull (before counting its own cache)."""
        return self.prompt_tokens - self._reach

    @property
    def continue_tokens(self) -> int:
        """What a continued turn computes on the holder."""
        held = self.reusable_tokens if self.d_held_tokens is None else self.d_held_tokens
        return max(0, self.prompt_tokens - held)

    @property
    def pulled_tokens(self) -> int:
        """What a pull brings: the reusable tokens P's own cache lacks."""
        return max(0, self._reach - self.p_cached_tokens)


DEFAULT_SLO_SCALE: Final = 5.0
"""The bounds' multiple of the idle costs the router measures (DistServe's SLO scale), the
same the production benchmark's goodput uses: room for a queue of several turns on P and a
batch of several streams on D, still failing a turn that waited behind a long prefill."""
BRAKE: Final = 0.8
"""No continue while the holder's recent streams (`Shape.d_tpot_s`, measured) decode at this
share of the TPOT bound or slower: the measured check on the budget's estimate."""
SLACK_SHARE: Final = 0.5
"""The share of a stream's TPOT slack that stalls from turns joining D may spend: the rest
covers streams shorter than the holder's mean and the model's error."""


@dataclass(frozen=True, slots=True)
class Slo:
    """What a turn should meet: a TTFT and a TPOT bound, each the operator's or `scale` times
    what the router measured of an idle engine (`ttft_slo`, `tpot_slo`)."""

    scale: float = DEFAULT_SLO_SCALE
    ttft_s: float | None = None
    """Every turn's TTFT bound; None: `scale` idle recomputes of the turn's prompt."""
    tpot_s: float | None = None
    """Every stream's TPOT bound; None: `scale` times an idle decoder's time per token."""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.scale) and self.scale >= 1):
            raise ValueError(f"the SLO scale must be finite and >= 1, got {self.scale}")
        for bound in (self.ttft_s, self.tpot_s):
            if bound is not None and not (math.isfinite(bound) and bound > 0):
                raise ValueError(f"SLO bounds must be finite and > 0, got {bound}")


@dataclass(frozen=True, slots=True)
class Bounds:
    """The operator's bounds on the choice (router config `tuning`)."""

    floor_tokens: int
    """The engine's kv_recompute_threshold: never pull below it."""
    break_even_min_tokens: int = 0
    break_even_max_tokens: int = 1_000_000
    continue_on_decode: bool = True
    continue_max_suffix_tokens: int = 1024
    itl_budget_s: float | None = None
    """What a continued prefill may stall D's other streams; None: derived (`itl_budget`)."""
    tpot_tolerance: float = 0.1
    """The share of a stream's time per output token one continue it sees may add."""
    slo: Slo | None = None
    """The turns' objectives (SLO-aware choice, `_slo_allows`); None: the ITL budget's rule."""

    def __post_init__(self) -> None:
        ints = (self.floor_tokens, self.break_even_min_tokens, self.break_even_max_tokens)
        if min(*ints, self.continue_max_suffix_tokens) < 0:
            raise ValueError(f"token bounds must be >= 0, got {self}")
        budget = self.itl_budget_s
        if budget is not None and not (math.isfinite(budget) and budget >= 0):
            raise ValueError(f"itl_budget_s must be finite and >= 0, got {budget}")
        if not (math.isfinite(self.tpot_tolerance) and 0 < self.tpot_tolerance <= 1):
            raise ValueError(f"tpot_tolerance must be in (0, 1], got {self.tpot_tolerance}")


@dataclass(frozen=True, slots=True)
class Choice:
    path: Path
    costs: Mapping[Path, float]
    """Estimated seconds to first token for each allowed path."""
    reason: str
    """Why, for the log."""


@dataclass(frozen=True, slots=True)
class Coefficients:
    """The cost model's coefficients (seconds, seconds per token) and observations per leg."""

    p_fixed_s: float
    p_compute_s_per_token: float
    p_pull_fixed_s: float
    p_pull_s_per_token: float
    d_first_fixed_s: float
    d_first_s_per_token: float
    d_fixed_s: float
    d_compute_s_per_token: float
    stream_s_per_token: float = 0.02
    """A stream's decode time per output token on D, alone and with nothing joining it."""
    stream_s_per_token_per_other: float = 0.0
    """What each other request in D's batch adds to that (a step grows with the batch)."""
    stream_continue_stall_s: float = 0.02
    """What a turn continued on D (its prefill there) adds to each stream D is decoding."""
    stream_handoff_stall_s: float = 0.0
    """What a turn handed over from P (D takes its blocks and its first step) adds to each
    stream D is decoding: what a refused continue costs D's streams anyway."""
    idle_tpot_s: float = 0.0
    """A decoder's time per output token when nothing slows it: the fastest of the probes of
    an idle decoder (`IDLE_PROBES`, `idle_probe.py`: the engine's own clock), else, before
    any probe, of the recent streams (`IDLE_WINDOW`); measured, not fitted (0: none yet).
    The streams are timed on the router's clock, first token to last, and tokens that reach
    it in bursts (a busy decoder's server falls behind its engine) make a stream read faster
    than its decoder ran: on the pressure benchmark the fastest read 3.4-3.5 ms a token on a
    decoder that took 6.9-7.1 idle and 24 under that load. The stream fit's own
    intercept is not it: under steady load the batch is always about the same size, so the
    fit cannot tell the per-token time from the batch's share and stays near its prior
    (measured on agentic: 18 ms fitted against 6.6 ms idle)."""
    observations: Mapping[str, int] = field(default_factory=dict)
    """Observations taken per leg: prefill, decode_first, continue, stream."""

    def as_metrics(self) -> dict[str, float]:
        """Metric name -> value (`boomerang_router_cost_coefficient{name}`, the state endpoint)."""
        return {k: float(v) for k, v in asdict(self).items() if k != "observations"}

    def on_decoder_s(self, tokens: float) -> float:
        """A decoder's own prefill of `tokens`: a continued turn's time to first token there
        (its queue included when counted in), and the stall its other streams see."""
        return self.d_fixed_s + self.d_compute_s_per_token * tokens

    def idle_tpot(self) -> float:
        """The idle decoder's time per token: measured, else the stream fit's intercept."""
        return self.idle_tpot_s if self.idle_tpot_s > 0 else self.stream_s_per_token

    def costs(self, shape: Shape) -> dict[Path, float]:
        """Each path's estimated seconds to first token for `shape` (allowed or not)."""
        suffix, pulled = shape.suffix_tokens, shape.pulled_tokens
        uncached = shape.prompt_tokens - shape.p_cached_tokens
        d_first = self.d_first_fixed_s + self.d_first_s_per_token * shape.prompt_tokens
        p_wait = self.p_compute_s_per_token * shape.p_queue_tokens
        p_leg = self.p_fixed_s + p_wait + self.p_compute_s_per_token * min(suffix, uncached)
        pull = p_leg + self.p_pull_fixed_s + self.p_pull_s_per_token * pulled + d_first
        recompute = self.p_fixed_s + p_wait + self.p_compute_s_per_token * uncached + d_first
        on_d = shape.d_queue_tokens + shape.continue_tokens
        return {
            Path.PULL: pull,
            Path.RECOMPUTE: recompute,
            Path.CONTINUE: self.on_decoder_s(on_d),
        }


DEFAULT_PRIORS: Final = Coefficients(
    p_fixed_s=0.02,
    p_compute_s_per_token=2e-4,
    p_pull_fixed_s=0.0,
    p_pull_s_per_token=4e-5,
    d_first_fixed_s=0.01,
    d_first_s_per_token=2e-5,
    d_fixed_s=0.02,
    d_compute_s_per_token=1e-3,
    stream_s_per_token=0.02,
    stream_s_per_token_per_other=0.0,
    stream_continue_stall_s=0.02,
    stream_handoff_stall_s=0.0,
)
"""Conservative priors (module docs): pull never dearer than recompute, D's prefill 5x P's, a
handover from P free for D's streams."""


def break_even(c: Coefficients, bounds: Bounds) -> float:
    """History length at which pull and recompute cost the same, clamped to the bounds and the
    floor (inf before clamping when pull never pays)."""
    lo = max(bounds.floor_tokens, bounds.break_even_min_tokens)
    gain, fixed = c.p_compute_s_per_token - c.p_pull_s_per_token, c.p_pull_fixed_s
    if gain <= 0:  # pull never saves anything: it pays only where it costs nothing at all
        return float(lo if gain == 0 and fixed == 0 else max(lo, bounds.break_even_max_tokens))
    tokens = fixed / gain
    return float(max(lo, min(tokens, bounds.break_even_max_tokens)))


FALLBACK_ITL_BUDGET_S: Final = 0.05
"""The ITL budget while the holder's streams are unmeasured (its answers so far not streamed)."""


def itl_budget(bounds: Bounds, d_stream_s: float = 0.0) -> float:
    """What a continued prefill may stall the holder's other streams (module docs): the
    operator's value when set, else `tpot_tolerance` of the holder's measured stream time,
    else the fallback."""
    if bounds.itl_budget_s is not None:
        return bounds.itl_budget_s
    if d_stream_s > 0:
        return bounds.tpot_tolerance * d_stream_s
    return FALLBACK_ITL_BUDGET_S


def continue_limit(c: Coefficients, bounds: Bounds, d_stream_s: float = 0.0) -> int:
    """Longest suffix the continue path may take (0 when it is off): the hard bound, or less
    where D's co-running streams would wait longer than the ITL budget (`itl_budget`, from
    `d_stream_s`, the holder's measured stream time) beyond what a handover from P costs them
    (`stream_handoff_stall_s`, module docs).

    The wait is estimated as the continue turn's own cost on D, `d_fixed + d_compute * suffix`:
    on the CPU engine the longest extra gap a co-running stream saw while D served a continue
    turn matched that turn's time to first token on D within about 10 % at 16, 256 and 2,048
    suffix tokens (`e2e/bench/engine/paths.py`), fixed part included (the step that admits the
    request also pays for its scheduling and its prefix-cache lookup)."""
    if not bounds.continue_on_decode:
        return 0
    limit = bounds.continue_max_suffix_tokens
    left = itl_budget(bounds, d_stream_s) + c.stream_handoff_stall_s - c.d_fixed_s
    if left < 0:
        return 0
    if c.d_compute_s_per_token > 0:
        limit = min(limit, math.floor(left / c.d_compute_s_per_token))
    return max(0, limit)


def decide(c: Coefficients, shape: Shape, bounds: Bounds) -> Choice:
    """The cheapest allowed path for `shape` under `c` (see `CostModel.choose`)."""
    estimate = c.costs(shape)
    r = shape.pulled_tokens
    lo = max(bounds.floor_tokens, bounds.break_even_min_tokens)
    notes: list[str] = []
    allowed = [Path.RECOMPUTE]
    if not shape.pullable:
        notes.append("no pull: D released the blocks")
    elif r > 0 and r >= lo:
        allowed.append(Path.PULL)
    else:
        notes.append(f"no pull: {r} beyond P's cache < {lo}" if r else "no pull: nothing to pull")
    forced = Path.PULL in allowed and r >= bounds.break_even_max_tokens
    if forced:
        notes.append(f"pull forced: reusable {r} >= {bounds.break_even_max_tokens}")
    limit, on_d = continue_limit(c, bounds, shape.d_stream_s), shape.continue_tokens
    if shape.holder and bounds.slo is not None:
        allows, why = _slo_allows(c, shape, bounds, bounds.slo, min(estimate[p] for p in allowed))
        allowed += [Path.CONTINUE] if allows else []
        notes += [why] if why else []
    elif shape.holder and 0 < on_d <= limit:
        allowed.append(Path.CONTINUE)
    elif shape.holder and bounds.continue_on_decode:
        budget = itl_budget(bounds, shape.d_stream_s)
        stall = c.on_decoder_s(on_d) - c.stream_handoff_stall_s
        paid = _overrun_pays(estimate, allowed, stall, budget, shape.d_streams)
        if 0 < on_d <= bounds.continue_max_suffix_tokens and paid is not None:
            allowed.append(Path.CONTINUE)
            notes.append(paid)
        else:
            notes.append(
                f"no continue: {on_d} to compute on D, limit {limit} "
                f"({budget * 1000:.0f} ms budget)"
            )
    costs = {p: estimate[p] for p in _PREFERENCE if p in allowed}
    best: Path | None = None
    for p in costs:
        if forced and p is Path.RECOMPUTE:
            continue
        if best is None or costs[p] < costs[best] - _TIE_S:
            best = p
    assert best is not None
    shown = " ".join(f"{p}={s:.4f}s" for p, s in costs.items())
    return Choice(best, costs, "; ".join([f"{best}: cheapest of {shown}", *notes]))


def ttft_slo(c: Coefficients, slo: Slo, prompt_tokens: int) -> float:
    """A turn's TTFT bound: the operator's, else `scale` times an idle recompute of its whole
    prompt as the model knows it (P's prefill and D's first step, no queue, no cache)."""
    if slo.ttft_s is not None:
        return slo.ttft_s
    idle = c.p_fixed_s + c.p_compute_s_per_token * prompt_tokens
    return slo.scale * (idle + c.d_first_fixed_s + c.d_first_s_per_token * prompt_tokens)


def tpot_slo(c: Coefficients, slo: Slo) -> float:
    """A stream's TPOT bound: the operator's, else `scale` times an idle decoder's time per
    output token (`Coefficients.idle_tpot`: measured, else the stream fit's)."""
    return slo.tpot_s if slo.tpot_s is not None else slo.scale * c.idle_tpot()


def stall_budget(c: Coefficients, slo: Slo, stream_tokens: float) -> float:
    """What the stalls of turns joining a decoder may add up to over one of its streams:
    `SLACK_SHARE` of the stream's TPOT slack (the bound less an idle decoder's time per token)
    over its tokens (the holder's mean); `FALLBACK_ITL_BUDGET_S` until a stream was measured.
    A bigger batch's slower steps are what the other share and the brake (`BRAKE`) are for."""
    if stream_tokens <= 0:
        return FALLBACK_ITL_BUDGET_S
    return SLACK_SHARE * stream_tokens * max(0.0, tpot_slo(c, slo) - c.idle_tpot())


def _slo_allows(
    c: Coefficients, shape: Shape, bounds: Bounds, slo: Slo, on_p: float
) -> tuple[bool, str]:
    """The SLO-aware gate of the continue path (the turn served by a decoder alone), and why.

    The TPOT side is a budget per stream, not per turn: each turn that joins a decoder stalls
    every stream it is decoding by about its prefill there (`Endpoint.absorbed` keeps the sum
    each live stream took), and a stream's time per token stays within its bound while the
    stalls it absorbs stay within `stall_budget`. So a continue is allowed while it fits what
    the most stalled live stream has left: however many turns join, none of D's streams is
    pushed past its TPOT bound by them, and while D has slack, a follow-up takes whichever path
    gets its first token sooner (the cost model, queues included): when P is busy, D.

    A first turn (no history on any decoder) takes D's slack only when P would make it miss
    its TTFT bound (`ttft_slo`): on D it saves no work, only P's queue, and it costs D's
    streams its whole prefill. `on_p` is the best estimate of the paths through P."""
    on_d = shape.continue_tokens
    if not bounds.continue_on_decode or not 0 < on_d <= bounds.continue_max_suffix_tokens:
        return False, f"no continue: {on_d} to compute on D" if bounds.continue_on_decode else ""
    stall = c.on_decoder_s(on_d)
    bound = tpot_slo(c, slo)
    if shape.d_streams and shape.d_tpot_s >= BRAKE * bound:
        return False, (
            f"no continue: D's streams decode at {shape.d_tpot_s * 1000:.0f} ms a token, "
            f"{BRAKE:.0%} of the {bound * 1000:.0f} ms bound or more"
        )
    budget = stall_budget(c, slo, shape.d_stream_tokens)
    left = budget - shape.d_absorbed_s
    if shape.d_streams and stall > left:
        return False, (
            f"no continue: {stall * 1000:.0f} ms stall, D's streams have "
            f"{max(0.0, left) * 1000:.0f} ms of TPOT slack left"
        )
    if not shape.first_turn:
        return True, ""
    ttft = ttft_slo(c, slo, shape.prompt_tokens)
    if on_p > ttft:
        return True, f"on D: P would miss the {ttft * 1000:.0f} ms TTFT bound"
    return False, f"no decoder alone: P meets the {ttft * 1000:.0f} ms TTFT bound"


def _overrun_pays(
    estimate: Mapping[Path, float], others: list[Path], stall: float, budget: float, streams: int
) -> str | None:
    """A continue over the ITL budget, allowed when it pays in everyone's waiting: the turn
    waits `best other - continue` less (its continue estimate includes D's queue), and each of
    the holder's `streams` waits `stall - budget` more than the budget lets it, where `stall` is
    this turn's own prefill on D (not the queue's) less what its handover from P would cost them
    anyway (module docs). The reason for the log when it pays; None when it does not."""
    saved = min(estimate[p] for p in others) - estimate[Path.CONTINUE]
    lost = streams * (stall - budget)
    if saved <= lost:
        return None
    return (
        f"continue over the {budget * 1000:.0f} ms budget: saves {saved * 1000:.0f} ms, "
        f"costs {streams} streams {lost * 1000:.0f} ms"
    )


def _valid(*values: float) -> bool:
    return all(math.isfinite(x) and x >= 0 for x in values)


class CostModel:
    """The learned cost model: `choose` a path per turn, `observe_*` what each leg took."""

    def __init__(
        self,
        priors: Coefficients | None = None,
        *,
        half_life: float = 200.0,
        prior_weight: float = 20.0,
        prior_floor: float = 1.0,
    ) -> None:
        p = priors or DEFAULT_PRIORS
        values = [v for k, v in asdict(p).items() if k not in _MEASURED]
        if not _valid(*values):
            raise ValueError(f"priors must be finite and >= 0, got {p}")
        if not (half_life > 0 and prior_weight > 0 and 0 < prior_floor <= prior_weight):
            raise ValueError("need half_life > 0 and 0 < prior_floor <= prior_weight")
        opts = {"half_life": half_life, "prior_weight": prior_weight, "prior_floor": prior_floor}
        # The pseudo-observations' shapes, in thousands of tokens: typical of each leg.
        grid = (0.064, 1.0, 8.0)
        pulls = [[1.0, c, float(r > 0), r] for c in grid for r in (0.0, 0.064, 1.0, 8.0)]
        theta = [v / s for v, s in zip(values, _SCALE, strict=True)]
        self._p = ForgettingFit(theta[:4], pulls, **opts)
        self._d_first = ForgettingFit(theta[4:6], [[1.0, t] for t in grid], **opts)
        self._opts = opts
        self._d = self._continue_fit(theta[6:8])
        joined = ((0.0, 0.0, 0.0), (2.0, 1.0, 0.0), (4.0, 0.0, 1.0), (8.0, 4.0, 4.0))
        streams = [[t, t * o, a, b] for t in (0.032, 0.256) for o, a, b in joined]
        self._streams = ForgettingFit(theta[8:], streams, **opts)
        self._tpots: deque[float] = deque(maxlen=IDLE_WINDOW)
        self._probed: deque[float] = deque(maxlen=IDLE_PROBES)
        self._cached: Coefficients | None = None

    def _continue_fit(self, prior: list[float]) -> ForgettingFit:
        return ForgettingFit(prior, [[1.0, t] for t in (0.016, 0.256, 1.0)], **self._opts)

    def choose(self, shape: Shape, bounds: Bounds) -> Choice:
        """The cheapest allowed path. Recompute is always allowed; pull only when reusable >=
        max(floor, break_even_min) and > 0, and then recompute never wins at or above
        break_even_max; continue only when a decoder holds the history, the path is on and
        0 < suffix <= continue_limit_tokens. Ties: pull, then recompute."""
        return decide(self.coefficients(), shape, bounds)

    def observe_prefill(
        self, computed_tokens: int, pulled_tokens: int, seconds: float, queued: float = 0.0
    ) -> None:
        """The P leg (the router's POST to P with max_tokens 1): P computed `computed_tokens`
        (the suffix on pull, the prompt on recompute) and pulled `pulled_tokens` (0 on
        recompute), after the `queued` tokens of work sent to it before (it computed them
        first, or alongside in its batches)."""
        if _valid(computed_tokens, pulled_tokens, queued, _MAX_OBSERVED_S - seconds, seconds):
            work = computed_tokens + queued
            x = [1.0, work / _K, float(pulled_tokens > 0), pulled_tokens / _K]
            self._p.add(x, seconds)
            self._cached = None

    def observe_decode_first(self, prompt_tokens: int, seconds: float) -> None:
        """D's time to first token after P (its read of P's blocks and first step)."""
        if _valid(prompt_tokens, _MAX_OBSERVED_S - seconds, seconds):
            self._d_first.add([1.0, prompt_tokens / _K], seconds)
            self._cached = None

    def observe_continue(self, computed_tokens: int, seconds: float) -> None:
        """D's time to first token on the continue path (it computed `computed_tokens`)."""
        if _valid(computed_tokens, _MAX_OBSERVED_S - seconds, seconds):
            if not self._d.count and self._p.count:  # P's measured rate becomes the prior
                self._d = self._continue_fit([self._d.theta[0], self._p.theta[1]])
            self._d.add([1.0, computed_tokens / _K], seconds)
            self._cached = None

    def observe_stream(
        self,
        output_tokens: int,
        continued: int,
        handed_over: int,
        others: float,
        seconds: float,
    ) -> None:
        """One stream on D, first token to last (`seconds`) over `output_tokens`, beside
        `others` requests on average, while `continued` turns continued on D and `handed_over`
        turns came from P got their first token there: what each costs the streams D is
        decoding (`stream_*`)."""
        valid = _valid(continued, handed_over, others, _MAX_OBSERVED_S - seconds, seconds)
        if output_tokens >= IDLE_MIN_TOKENS and valid and seconds > 0:
            self._tpots.append(seconds / (output_tokens - 1))
            self._cached = None
        if output_tokens > 1 and valid:
            steps = (output_tokens - 1) / _K
            self._streams.add([steps, steps * others, continued, handed_over], seconds)
            self._cached = None

    def observe_idle_tpot(self, seconds_per_token: float) -> None:
        """An idle decoder's time per output token, probed (`idle_probe.py`): from now on the
        idle TPOT is the probes' (`Coefficients.idle_tpot_s`)."""
        if math.isfinite(seconds_per_token) and seconds_per_token > 0:
            self._probed.append(seconds_per_token)
            self._cached = None

    def coefficients(self) -> Coefficients:
        """The current estimates (the priors until observed), with observations per leg; the
        continue leg's per-token cost is P's measured one until it has its own (module docs)."""
        if self._cached is None:
            p, f, d = self._p.theta, self._d_first.theta, list(self._d.theta)
            st = self._streams.theta
            counts = (self._p.count, self._d_first.count, self._d.count, self._streams.count)
            if not self._d.count and self._p.count:
                d[1] = p[1]  # per thousand tokens, as fitted
            self._cached = Coefficients(
                p_fixed_s=p[0],
                p_compute_s_per_token=p[1] / _K,
                p_pull_fixed_s=p[2],
                p_pull_s_per_token=p[3] / _K,
                d_first_fixed_s=f[0],
                d_first_s_per_token=f[1] / _K,
                d_fixed_s=d[0],
                d_compute_s_per_token=d[1] / _K,
                stream_s_per_token=st[0] / _K,
                stream_s_per_token_per_other=st[1] / _K,
                stream_continue_stall_s=st[2],
                stream_handoff_stall_s=st[3],
                idle_tpot_s=min(self._probed or self._tpots, default=0.0),
                observations=dict(zip(_LEGS, counts, strict=True)),
            )
        return self._cached

    def break_even_tokens(self, bounds: Bounds, suffix_tokens: int = 0) -> float:
        """History length where pull and recompute cost the same, clamped to the bounds and the
        floor. `suffix_tokens` is accepted for callers that know it: in this model both paths
        compute the suffix on P alike, so it cancels."""
        del suffix_tokens
        return break_even(self.coefficients(), bounds)

    def continue_limit_tokens(self, bounds: Bounds, d_stream_s: float = 0.0) -> int:
        """Longest suffix the continue path may take (see `continue_limit`)."""
        return continue_limit(self.coefficients(), bounds, d_stream_s)
