"""What a turn will try, in order: the plan of legs for a verified turn (pure).

Why it exists: how a turn reaches its first token is a decision, and like the reuse rule
(`reuse.py`) it is kept apart from the I/O and table-tested alone. The flow gathers the facts
(`Facts`: the prompt, what D's verified handle offers, what the chosen P probably holds in its
own prefix cache, whether the decoder holding the history may serve it); the planner returns
the legs to try (`legs.py` runs each): the first is the choice, each later one the fallback if
the one before fails before the client got a byte.

The legs:
- `continue`: the decoder holding the history serves the turn alone from its prefix cache;
- `pull`: P with D's handle attached pulls what its own cache lacks, then D decodes;
- `recompute`: P computes what its own cache lacks without the handle, then D decodes.

The planners:
- `static`: pull when the verified reuse beyond P's own cache reaches the engine's threshold
  (below it vLLM's P would recompute anyway and only tell D to free its blocks), else recompute
  and let D's blocks go at once. With P's prefix cache on and a conversation kept on its P
  (`affinity.py`), the history is usually already on P, and static costs what plain P/D costs;
- `adaptive`: the cheapest allowed leg by the learned cost model (`costmodel.py`), continue
  included, pull only where it is allowed as in static.
- a first turn (no usable history) is planned only in adaptive mode with the turns' bounds
  known (`costmodel._slo_allows`): `continue` on the decoder decode would pick, when P would
  make it miss its TTFT bound and that decoder's streams have the slack, else plain P/D.
A handle the plan does not use is `declined`: it is never offered again, and D's blocks can be
released now. A continue keeps it until D's fresh handle supersedes it, or until the turn falls
back to P (which may then pull it, when D answered: it is alive).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from boomerang import facts
from boomerang.router.learning.costmodel import Bounds, Choice, CostModel, Path, Shape

Mode = facts.Mode
AFTER_CONTINUE: Final = (Path.PULL, Path.RECOMPUTE)
"""What a failed continue falls back to, in order (pull only if still allowed)."""


@dataclass(frozen=True)
class Facts:
    """What the router knows of a verified turn before it chooses."""

    prompt_tokens: int
    reusable_tokens: int
    """Verified tokens of D's handle that match the prompt (0: nothing usable)."""
    pullable: bool
    """D still pins the blocks and confirmed them (a released or unclaimed handle is not)."""
    holder_continues: bool
    """The decoder holding the history may serve the turn (capability, health, load)."""
    p_cached_tokens: int = 0
    """What the chosen P probably holds of the prompt already (its prefix cache)."""
    d_held_tokens: int | None = None
    """What the holder has of the prompt in its cache (None: the verified reusable tokens)."""
    p_queue_tokens: float = 0.0
    """Work queued on the chosen P before this turn (the router's accounting, tokens)."""
    d_queue_tokens: float = 0.0
    """Prefill work of turns continued on the holder before this one (tokens)."""
    d_stream_s: float = 0.0
    """How long the holder's streams decode (`Endpoint.stream_s`; 0: not measured)."""
    d_streams: int = 0
    """Requests the holder serves now (`Endpoint.inflight`): what a continue stalls."""
    d_absorbed_s: float = 0.0
    """The most stall a stream live on the holder has absorbed (`Endpoint.absorbed`)."""
    d_stream_tokens: float = 0.0
    """How many tokens the holder's streams decode (`Endpoint.stream_tokens`)."""
    d_tpot_s: float = 0.0
    """How fast the holder's recent streams decoded per token (`Endpoint.stream_tpot`)."""
    first_turn: bool = False
    """No decoder holds the history: `holder_continues` names a decoder that would compute
    the whole prompt (less its prefix cache) alone."""

    def __post_init__(self) -> None:
        if not 0 <= self.reusable_tokens <= self.prompt_tokens:
            raise ValueError(f"need 0 <= reusable_tokens <= prompt_tokens, got {self}")

    @property
    def beyond_p(self) -> int:
        """Tokens a pull would bring that P's own cache lacks."""
        return max(0, self.reusable_tokens - self.p_cached_tokens)


@dataclass(frozen=True)
class Plan:
    legs: tuple[Path, ...]
    """In order: the choice first, then its fallbacks."""
    reason: str
    costs: Mapping[Path, float] = field(default_factory=dict)

    @property
    def choice(self) -> Path:
        return self.legs[0]

    @property
    def declines(self) -> bool:
        """The handle is not used by the plan's choice nor needed by a fallback."""
        return Path.PULL not in self.legs and Path.CONTINUE not in self.legs


def forgoes_handle(placed_prefill: str | None, chosen_prefill: str | None, p_cached: int) -> bool:
    """Static mode's rule before verifying a handle: when the P that computed the
    conversation's last prompt (`placed_prefill`) serves this turn too and still holds a whole
    block of it (`p_cached` tokens, the KV index or the placement says), its prefix cache holds
    the history and D's handle could bring back only D's last answer, a few milliseconds of
    P's compute, for a verify call, a claim and a read. The handle is then let go unverified
    and the turn is plain P/D (`flow.Router._forgo`; the simulator applies it alike)."""
    return placed_prefill is not None and p_cached > 0 and chosen_prefill == placed_prefill


def static_plan(facts: Facts, floor: int) -> Plan:
    """Pull when the reuse beyond P's own cache reaches the engine's threshold, else recompute."""
    if facts.pullable and facts.beyond_p > 0 and facts.beyond_p >= floor:
        return Plan((Path.PULL,), f"pull {facts.beyond_p} tokens beyond P's cache")
    why = "not pullable" if not facts.pullable else f"{facts.beyond_p} beyond P's cache < {floor}"
    return Plan((Path.RECOMPUTE,), f"recompute: {why}")


def adaptive_plan(facts: Facts, model: CostModel, bounds: Bounds) -> Plan:
    """The cheapest allowed leg, then its fallbacks."""
    choice = _choose(facts, model, bounds, facts.holder_continues)
    legs: tuple[Path, ...] = (choice.path,)
    if choice.path is Path.CONTINUE:
        after = _choose(facts, model, bounds, holder=False).path
        legs += (after,) if after is Path.RECOMPUTE else AFTER_CONTINUE
    return Plan(legs, choice.reason, choice.costs)


def _choose(facts: Facts, model: CostModel, bounds: Bounds, holder: bool) -> Choice:
    """The cost model's choice, where a pull brings only what P's own cache lacks."""
    shape = Shape(
        facts.prompt_tokens,
        facts.reusable_tokens,
        holder,
        facts.pullable,
        p_cached_tokens=min(facts.p_cached_tokens, facts.prompt_tokens),
        d_held_tokens=facts.d_held_tokens,
        p_queue_tokens=facts.p_queue_tokens,
        d_queue_tokens=facts.d_queue_tokens,
        d_stream_s=facts.d_stream_s,
        d_streams=facts.d_streams,
        d_absorbed_s=facts.d_absorbed_s,
        d_stream_tokens=facts.d_stream_tokens,
        d_tpot_s=facts.d_tpot_s,
        first_turn=facts.first_turn,
    )
    return model.choose(shape, bounds)


def after_failure(plan: Plan, failed: Path, holder_answered: bool) -> tuple[Path, ...]:
    """The legs still to try once `failed` failed before the client got a byte: a pull after
    a failed continue only when the holder answered (it is alive: P may read it)."""
    rest = plan.legs[plan.legs.index(failed) + 1 :]
    if failed is Path.CONTINUE and not holder_answered:
        rest = tuple(leg for leg in rest if leg is not Path.PULL) or (Path.RECOMPUTE,)
    return rest
