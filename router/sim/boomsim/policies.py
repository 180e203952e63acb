"""The routing policies compared, as the router's own pure decisions (plan.py, costmodel.py).

Why here and not in the cluster: a policy is the part of the simulation that must be the
router's and nothing else, so it is kept to calls into `boomerang.router` with the facts the
simulator knows (what each engine holds, as the router's KV index would say; the handle's
tokens; whether D still holds the lease). The policies:

- `plain`: P by least outstanding work, D by fewest requests in flight; no D->P reuse (the
  engines run without bidirectional transfer), whatever P's own prefix cache holds.
- `affinity`: the same engines, P and D chosen by `endpoints.LeastWorkAffinity` with what each
  holds (llm-d's and Dynamo's routing).
- `cpu-tier`: `affinity` with a CPU memory tier on every P (llm-d's P/D multi-tier guide:
  NIXL and vLLM's OffloadingConnector, 100 GiB): P stores the prompts it computed, in whole
  blocks (prompt only: never the previous answer), LRU, and loads a conversation's stored
  prompt over PCIe instead of computing it when its GPU cache has lost it; one source per
  request, NIXL's first. The router does not see the tier (the guide's plain variant).
- `decode-first`: the router's own `decode_first.choose` (llm-d's prefix-based P/D decider):
  among the decoders within the affinity slack of the least loaded, the one caching the longest
  prefix; the turn runs on it alone when its uncached tokens are below the threshold, else P
  prefills and that decoder decodes (no D->P reuse).
- the peers' decode-first at thresholds that fire on tool results (`decode-first-512`,
  `-2048`, `-8192`, and `decode-first-always`: whenever a decoder caches any of the prompt,
  it serves the turn alone), Dynamo's conditional disaggregation (`dynamo`: under 2,048
  uncached tokens and under 0.7 of the prompt) and its load variant (`dynamo-load`: also while
  the chosen P has 2,048 tokens queued); the same `decode_first.choose` with the router's
  `decode_first_ratio` and `decode_first_p_busy_tokens`. The bench runs the same set on
  equal CPU engines (`bench.production.modes.PEERS`).
- `static`, `adaptive`: Boomerang (bidirectional transfer on): `plan.static_plan` and
  `plan.adaptive_plan` with the router's own `CostModel`, learning online from the simulated
  legs' times exactly as the router learns from measured ones, and `Tuning`'s defaults.
- `adaptive-priors`: a what-if, not a router setting today: adaptive whose cost model starts
  from priors read off the engines' profile (`profile_priors`) instead of `DEFAULT_PRIORS`
  (which are CPU-sized and keep the continue path to suffixes of about 30 tokens).
"""

from __future__ import annotations

from dataclasses import dataclass

from boomerang.facts import DECODER_BLOCKS_TTL_S, RECOMPUTE_THRESHOLD_TOKENS, default_handle_ttl
from boomerang.router.config import RouterConfig, Tuning
from boomerang.router.learning.costmodel import Bounds, Coefficients, CostModel, Path
from boomerang.router.retention.policy import GapLearner, RetentionBounds, retention_s
from boomerang.router.turn.plan import Facts, Plan, adaptive_plan, static_plan
from boomsim.profiles import Profile


@dataclass(frozen=True)
class DecodeFirst:
    """A decode-first rule: the router's `decode_first_tokens`, `decode_first_ratio` and
    `decode_first_p_busy_tokens`."""

    tokens: int
    ratio: float | None = None
    p_busy_tokens: int | None = None


ALWAYS = 1 << 40
"""A threshold no prompt reaches: the caching decoder serves every turn alone."""
PEERS: dict[str, DecodeFirst] = {
    "decode-first-512": DecodeFirst(512),
    "decode-first-2048": DecodeFirst(2048),
    "decode-first-8192": DecodeFirst(8192),
    "decode-first-always": DecodeFirst(ALWAYS),
    "dynamo": DecodeFirst(2048, 0.7),
    "dynamo-load": DecodeFirst(2048, 0.7, 2048),
}
"""The peers' decode-first rules at settings that fire (the bench's `PEERS`, plus always)."""
POLICIES = (
    "plain",
    "affinity",
    "cpu-tier",
    "decode-first",
    *PEERS,
    "static",
    "adaptive",
    "adaptive-priors",
)
BIDIRECTIONAL = frozenset({"static", "adaptive", "adaptive-priors"})
LEASE_REFRESH_S = 1.0
"""How often (simulated seconds) the adaptive retention's quantile is recomputed."""


@dataclass(frozen=True)
class Settings:
    """What a run's router and engines are configured with."""

    policy: str
    recompute_threshold: int = RECOMPUTE_THRESHOLD_TOKENS
    """P's kv_recompute_threshold (the router's floor)."""
    decode_first_threshold: int = 256
    """decode-first: run on D alone below this many uncached tokens (`decode_first_tokens`)."""
    decode_slack: int = RouterConfig.model_fields["decode_affinity_slack"].default
    """The router's `decode_affinity_slack` (in-flight requests), its default."""
    decoder_ttl_s: float = float(DECODER_BLOCKS_TTL_S)
    itl_budget_s: float | None = None
    """None: the router's default (`Tuning().itl_budget_s`: derived from the holder's stream
    time, which the simulator's facts do not carry, so its 50 ms fallback)."""

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"unknown policy {self.policy!r}; one of {', '.join(POLICIES)}")

    @property
    def bidirectional(self) -> bool:
        return self.policy in BIDIRECTIONAL

    @property
    def cpu_tier(self) -> bool:
        return self.policy == "cpu-tier"

    @property
    def adaptive(self) -> bool:
        return self.policy.startswith("adaptive")

    @property
    def decode_first(self) -> DecodeFirst | None:
        """The decode-first rule of this policy (None: not a decode-first policy)."""
        if self.policy == "decode-first":
            return DecodeFirst(self.decode_first_threshold)
        return PEERS.get(self.policy)

    @property
    def handle_ttl_s(self) -> float:
        return default_handle_ttl(self.decoder_ttl_s)


class Planner:
    """One router's plan state: the cost model it learns and the gaps it learns."""

    def __init__(self, settings: Settings, profile: Profile | None = None) -> None:
        self.s = settings
        t = Tuning()
        budget = settings.itl_budget_s if settings.itl_budget_s is not None else t.itl_budget_s
        self.bounds = Bounds(
            floor_tokens=settings.recompute_threshold,
            break_even_min_tokens=t.break_even_min_tokens,
            break_even_max_tokens=t.break_even_max_tokens,
            continue_on_decode=t.continue_on_decode,
            continue_max_suffix_tokens=t.continue_max_suffix_tokens,
            itl_budget_s=budget,
        )
        priors = None
        if settings.policy == "adaptive-priors" and profile is not None:
            priors = profile_priors(profile)
        self.model = CostModel(priors)
        self.gaps = GapLearner() if settings.adaptive else None
        self.retention = RetentionBounds(
            t.retention_quantile, t.retention_min_s, settings.handle_ttl_s
        )
        self._lease: tuple[float, float] = (-1e18, settings.handle_ttl_s)

    def plan(self, facts: Facts) -> Plan:
        """The router's plan for a verified turn (Boomerang's modes)."""
        if self.s.adaptive:
            return adaptive_plan(facts, self.model, self.bounds)
        return static_plan(facts, self.s.recompute_threshold)

    def lease_s(self, now: float) -> float:
        """How long D pins a new handle's blocks: D's TTL (static), or the learned quantile of
        the gaps between turns (adaptive, `retention.retention_s`)."""
        if self.gaps is None:
            return self.s.decoder_ttl_s  # static: D's TTL, never released early
        at, value = self._lease
        if now - at >= LEASE_REFRESH_S:  # the quantile costs O(buckets): refreshed, not per turn
            q = self.gaps.quantile(None, self.retention.quantile, now)
            value = retention_s(q, self.retention)
            self._lease = (now, value)
        return value

    def observe_gap(self, gap_s: float, now: float) -> None:
        if self.gaps is not None:
            self.gaps.observe(None, gap_s, now)


def profile_priors(p: Profile) -> Coefficients:
    """The cost model's coefficients as the profile says each leg costs, at a 2k-token prompt:
    what an operator who knows the hardware would start from."""
    per_token = p.prefill_s(2048, 0) / 2048
    xfer = p.kv_bytes_per_token / p.xfer_bytes_per_s
    first = p.request_overhead_s + p.step_fixed_s
    return Coefficients(
        p_fixed_s=first,
        p_compute_s_per_token=per_token,
        p_pull_fixed_s=p.xfer_latency_s + p.pull_fixed_s,
        p_pull_s_per_token=xfer + p.pull_s_per_token,
        d_first_fixed_s=p.xfer_latency_s + p.step_fixed_s,
        d_first_s_per_token=xfer,
        d_fixed_s=first,
        d_compute_s_per_token=per_token,
    )


__all__ = ["POLICIES", "Path", "Planner", "Settings", "profile_priors"]
