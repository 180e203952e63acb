"""The defaults, bounds and names that more than one part of Boomerang uses, defined once.

Why it exists: the operator (the CRD's defaults and admission rules), the router (its config
defaults and handle lifetimes), the engine side (vLLM's extra config and the lease API) and the
simulator each need the same facts about vLLM's bidirectional NixlConnector. Written in each,
they drifted apart (the decoder TTL stood in five places, the decline window in four, one of
them a CEL string). Each part now imports them from here, and a test reads the CRD's schema,
the router's config and the engine's settings against this module.

Pure constants and arithmetic: no I/O, nothing imported from the rest of Boomerang, so every
part may import it (`make lint` checks that it imports nothing of theirs).
"""

from __future__ import annotations

from typing import Final, Literal, get_args

DECODER_BLOCKS_TTL_S: Final = 480
"""vLLM's default `decoder_kv_blocks_ttl`: how long D keeps a finished request's blocks for a
pull (the spec's `kvTransfer.decoderBlocksTTL`), in whole seconds as vLLM takes it."""

RECOMPUTE_THRESHOLD_TOKENS: Final = 64
"""vLLM's default `kv_recompute_threshold`: P recomputes when fewer tokens are reusable."""

LEASE_DURATION_S: Final = 30
"""P's heartbeat-renewed lease on the blocks it will pull (`kvTransfer.leaseDuration`)."""

P_DECLINE_WINDOW_S: Final = 5
"""vLLM's prefill declines a D->P read within this many seconds of D's block deadline: a
conversation's handle must lapse at least this long before D's TTL does."""

HANDLE_MARGIN_SHARE: Final = 0.1
HANDLE_MARGIN_MIN_S: Final = 5
"""The margin a router's handle keeps beside P's decline window: this share of the decoder
TTL, at least `HANDLE_MARGIN_MIN_S` (`default_handle_ttl`)."""

Mode = Literal["static", "adaptive"]
"""The tuning mode as the router and its state document spell it."""
MODES: Final[tuple[Mode, ...]] = get_args(Mode)
DEFAULT_MODE: Final[Mode] = "adaptive"
SpecMode = Literal["Static", "Adaptive"]
"""The same modes as the CRD spells them (`kvTransfer.tuning.mode`, Kubernetes' enum style)."""
SPEC_MODES: Final[tuple[SpecMode, ...]] = get_args(SpecMode)


def spec_mode(mode: Mode) -> SpecMode:
    """The CRD's spelling of a router mode."""
    return SPEC_MODES[MODES.index(mode)]


def router_mode(mode: str) -> Mode:
    """The router's spelling of a CRD mode (either spelling accepted); ValueError otherwise."""
    for spec, router in zip(SPEC_MODES, MODES, strict=True):
        if mode in (spec, router):
            return router
    raise ValueError(f"tuning mode {mode!r} is none of {', '.join(SPEC_MODES)}")


def seconds(value: float) -> str:
    """A whole or fractional number of seconds as the spec's duration string (`480s`)."""
    return f"{value:g}s"


def default_handle_ttl(decoder_ttl_s: float) -> float:
    """How long a router may offer D's blocks: the decoder TTL minus P's decline window minus a
    margin (`HANDLE_MARGIN_SHARE` of the TTL, at least `HANDLE_MARGIN_MIN_S`).

    The margin covers the time between D finishing (when its TTL starts) and the router storing
    the handle, plus clock drift between router replicas sharing Redis. The operator's status,
    the router's own default and the simulator all read it from here.
    """
    margin = max(HANDLE_MARGIN_MIN_S, HANDLE_MARGIN_SHARE * decoder_ttl_s)
    return decoder_ttl_s - P_DECLINE_WINDOW_S - margin
