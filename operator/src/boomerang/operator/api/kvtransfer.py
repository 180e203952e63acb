"""Bidirectional KV transfer and its tuning: D keeps a turn's blocks, P pulls them back, and the
router picks each turn's path.

Why a module of its own: these settings reach the engines (vLLM's kv-transfer config) and the
router (its reloaded `tuning` section), never the pod's shape.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from boomerang import facts
from boomerang.operator.api.durations import Duration, parse_duration
from boomerang.operator.api.fields import Model


class BreakEvenBounds(Model):
    """Bounds on the learned pull/recompute break-even, in tokens of verified history."""

    min_tokens: int = Field(
        0,
        description="Never learn a break-even below this (kvTransfer.recomputeThreshold is "
        "always a floor on top).",
        ge=0,
    )
    max_tokens: int = Field(
        1_000_000,
        description="Never learn a break-even above this; at least minTokens.",
        ge=0,
    )


class ContinueOnDecodeSpec(Model):
    """The third path: a turn goes straight to the D that holds its history and computes the
    new suffix there, with no P hop and no transfer, bounded by its cost to D's other streams."""

    enabled: bool = Field(True, description="Let the router take the continue-on-decode path.")
    max_suffix_tokens: int = Field(
        8192,
        description="Hard bound: longer new suffixes never continue on D (below it, the turns' "
        "SLO, or itlBudget when set, decides).",
        ge=1,
    )
    itl_budget: Duration | None = Field(
        None,
        description="Continue only while D's estimated inter-token-latency cost of computing "
        "the suffix stays within this (positive). Unset: derived per decoder, a tenth of how "
        "long its streams decode as the router measures them (one continue adds at most 10 % "
        "to a co-running stream's time per output token), 50ms until one is measured.",
    )


class SloSpec(Model):
    """The latency objectives the router chooses each turn's path for (Adaptive): a turn
    continues on D while D's streams have TPOT slack left (summed over every turn that joins
    them), and a first turn runs on a decoder alone when P would make it miss its TTFT bound."""

    enabled: bool = Field(
        True,
        description="Choose paths for these bounds. Off, or with continueOnDecode.itlBudget "
        "set, each continue is bounded alone by the ITL budget.",
    )
    scale: int = Field(
        5,
        description="The bounds not set below are this many times what the router measures "
        "of an idle engine: a recompute of the turn's whole prompt (TTFT), a decoder's time per "
        "output token (TPOT).",
        ge=1,
        le=100,
    )
    ttft: Duration | None = Field(
        None, description="Every turn's time-to-first-token bound (positive). Unset: derived."
    )
    tpot: Duration | None = Field(
        None, description="Every stream's time-per-output-token bound (positive). Unset: derived."
    )


class RetentionSpec(Model):
    """How long the router keeps a conversation's blocks on D, learned from the gaps between
    turns; kvTransfer.decoderBlocksTTL stays the ceiling."""

    quantile_percent: int = Field(
        90,
        description="Keep a handle for this quantile of the learned gap between turns, in "
        "percent (50 to 99).",
        ge=50,
        le=99,
    )
    minimum: Duration = Field(
        "10s",
        description="Never release earlier than this; positive and below "
        "kvTransfer.decoderBlocksTTL.",
    )
    reuse_released: bool = Field(
        True,
        description="After releasing a conversation's blocks, keep its handle until the TTL "
        "for continuing on the same decoder: D's prefix cache holds freed blocks until it "
        "needs the room, and serves what it still has (never offered to prefill).",
    )
    max_client_ttl: Duration | None = Field(
        None,
        alias="maxClientTTL",
        description="The longest retention a client's hint may ask for (Anthropic "
        "cache_control ttl, OpenAI prompt_cache_retention), which replaces the learned one for "
        "its conversation; longer hints are capped and logged, never refused. Unset or 0: "
        "kvTransfer.decoderBlocksTTL. The router's conversation TTL still bounds every hint.",
    )


class TuningSpec(Model):
    """How each turn picks its path (pull, recompute, continue on D) and how long D retains
    blocks. The router reloads this while running: a change here restarts no pod."""

    mode: facts.SpecMode = Field(
        facts.spec_mode(facts.DEFAULT_MODE),
        description="Adaptive: the router learns the costs and the gaps between turns from its "
        "own observations and decides per turn (pull, recompute, or continue on the decoder "
        "that holds the history). Static: pull what P's own cache lacks when it reaches "
        "recomputeThreshold, and keep blocks for the TTLs.",
    )
    break_even: BreakEvenBounds = Field(
        default_factory=lambda: BreakEvenBounds(),
        description="Bounds on the learned pull/recompute break-even (Adaptive).",
    )
    continue_on_decode: ContinueOnDecodeSpec = Field(
        default_factory=lambda: ContinueOnDecodeSpec(),
        description="The continue-on-decode path and its bounds (Adaptive).",
    )
    slo: SloSpec = Field(
        default_factory=lambda: SloSpec(),
        description="The turns' TTFT and TPOT bounds the path choice serves (Adaptive).",
    )
    retention: RetentionSpec = Field(
        default_factory=lambda: RetentionSpec(),
        description="Learned retention of D's blocks (Adaptive).",
    )
    decode_memory_budget_percent: int = Field(
        50,
        description="Percent of D's KV blocks that retained conversations may hold (Adaptive); "
        "beyond it the least likely to return are released first.",
        ge=1,
        le=100,
    )

    @property
    def router_mode(self) -> facts.Mode:
        """The mode as the router's config and state document spell it."""
        return facts.router_mode(self.mode)


class KVTransferSpec(Model):
    """Bidirectional KV transfer: D keeps a turn's blocks so P can pull them next turn."""

    # Bidirectional reuse exists only in NIXL; the enum is the rule, and a CEL rule tying
    # `bidirectional` to the connector comes back when another connector is supported.
    connector: Literal["NixlConnector"] = Field(
        "NixlConnector", description="vLLM KV connector. Bidirectional reuse needs NIXL."
    )
    bidirectional: bool = Field(True, description="Let P pull D's blocks back (D->P READ).")
    recompute_threshold: int = Field(
        facts.RECOMPUTE_THRESHOLD_TOKENS,
        description="P recomputes when fewer tokens than this are reusable.",
        ge=0,
    )
    decoder_blocks_ttl: Duration = Field(
        facts.seconds(facts.DECODER_BLOCKS_TTL_S),
        alias="decoderBlocksTTL",
        description="How long D pins a finished request's blocks for the next turn.",
    )
    lease_duration: Duration = Field(
        facts.seconds(facts.LEASE_DURATION_S),
        description="P's heartbeat-renewed lease on blocks D will pull.",
    )
    backend: Literal["UCX", "LIBFABRIC"] | None = Field(
        None, description="NIXL backend; default LIBFABRIC when EFA is requested, else UCX."
    )
    load_failure_policy: Literal["recompute", "fail"] = Field(
        "recompute", description="What P does when a KV read fails: recompute, or fail the request."
    )
    tuning: TuningSpec = Field(
        default_factory=lambda: TuningSpec(),
        description="Per-turn path choice and learned retention (Static or Adaptive); "
        "reloaded by the router while running, so a change restarts no pod.",
    )

    @property
    def decoder_blocks_ttl_s(self) -> int:
        """`decoderBlocksTTL` in whole seconds, as D's engine takes it; the router, the status
        and the handle lifetimes read this same number, so none can outlive D's blocks."""
        return round(parse_duration(self.decoder_blocks_ttl))

    @property
    def lease_duration_s(self) -> int:
        """`leaseDuration` in whole seconds, as P's engine takes it."""
        return round(parse_duration(self.lease_duration))
