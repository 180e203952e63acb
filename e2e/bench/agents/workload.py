"""A seeded multi-turn agent workload: the traffic the adaptive-reuse benchmark replays.

Comparing reuse policies (issue 12: the router's defaults, "static", against an adaptive mode
still to come) is only fair on identical traffic, so the workload is a plan computed up front
from a seed, with no I/O and no clock: which conversations start when, how many turns each has,
how long its user or tool "thinks" before each turn, how many new tokens each turn appends, and
which conversations are abandoned. Replaying one plan against two router modes sends the same
requests at the same (scaled) times; `fingerprint()` proves it was the same plan.

The shape follows what agent traffic looks like to a KV cache:

- conversations of varying length (turns log-normal around a median, at least two);
- think times log-normal (heavy-tailed: most gaps are seconds, a few outlast D's TTL);
- new suffixes from a few tokens (a user message) to thousands (a tool result);
- abandoned conversations: the user leaves before the planned last turn, and nothing tells D
  that the blocks it retained for the next turn will never be read.

Times in the plan are real seconds; the runner multiplies them by its `--time-scale`. Token ids
are drawn from the builtin models' ordinary vocabulary (ids 16..7999), per turn from its own
seed, so a replay rebuilds exactly the same prompts.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

VOCAB = (16, 8000)
"""Token ids [16, 8000) are ordinary words of the builtin models (below 16: special tokens)."""


@dataclass(frozen=True)
class SuffixKind:
    """One kind of new turn content, sized log-uniformly in [low, high] tokens."""

    name: str
    weight: float
    low: int
    high: int


SUFFIX_MIX: tuple[SuffixKind, ...] = (
    SuffixKind("user", 0.45, 4, 64),
    SuffixKind("tool_small", 0.25, 65, 256),
    SuffixKind("tool_medium", 0.18, 257, 1024),
    SuffixKind("tool_large", 0.12, 1025, 3072),
)
"""A user message is a few tokens to a paragraph; tool results range up to thousands."""


@dataclass(frozen=True)
class WorkloadConfig:
    """Everything the plan is drawn from. Times are real seconds (before any time scale)."""

    conversations: int = 32
    arrival_mean_s: float = 150.0
    """Mean gap between conversation starts (a Poisson process: exponential gaps)."""
    turns_median: float = 5.0
    turns_sigma: float = 0.6
    """Planned turns per conversation: log-normal (median, sigma), rounded, in [2, turns_max]."""
    turns_max: int = 16
    first_prompt: tuple[int, int] = (256, 2048)
    """Turn 1's prompt (system prompt and task), log-uniform in this range of tokens."""
    suffix_mix: tuple[SuffixKind, ...] = SUFFIX_MIX
    think_median_s: float = 30.0
    think_sigma: float = 1.3
    """Gap between a turn's answer and the next turn: log-normal (median, sigma of its log)."""
    abandon_share: float = 0.25
    """Share of conversations that stop before their planned last turn."""
    output_tokens: tuple[int, int] = (8, 32)
    """Tokens D generates per turn (uniform in this range; EOS ignored)."""
    max_context: int = 8192
    """A conversation ends early rather than grow its prompt beyond this many tokens."""
    seed: int = 2026


QUICK = WorkloadConfig(
    conversations=8,
    arrival_mean_s=60.0,
    turns_median=4.0,
    turns_max=6,
    first_prompt=(128, 1024),
    max_context=4096,
)
"""About a minute of scaled traffic on two cores: proves the pipeline, not a measurement."""


@dataclass(frozen=True)
class PlannedTurn:
    """One request: `new_tokens` ids (from `token_seed`) appended after the previous answer."""

    index: int
    kind: str
    """"first" for turn 1 (its whole prompt is new), else a SuffixKind name."""
    new_tokens: int
    think_s: float
    """Real seconds from the previous turn's last token to this request (0 for turn 1)."""
    max_tokens: int
    token_seed: int

    def ids(self) -> list[int]:
        rng = random.Random(self.token_seed)
        return [rng.randrange(*VOCAB) for _ in range(self.new_tokens)]


@dataclass(frozen=True)
class Conversation:
    id: str
    start_s: float
    """Real seconds from the start of the run to turn 1."""
    planned_turns: int
    abandoned: bool
    """The user left after `len(turns)` of `planned_turns` turns."""
    turns: tuple[PlannedTurn, ...]

    def context_tokens(self) -> int:
        """The prompt length of the last turn plus its answer: the most D holds for it."""
        return sum(t.new_tokens + t.max_tokens for t in self.turns)


@dataclass(frozen=True)
class Plan:
    config: WorkloadConfig
    conversations: tuple[Conversation, ...] = field(default_factory=tuple)

    def turns(self) -> Iterator[tuple[Conversation, PlannedTurn]]:
        for conv in self.conversations:
            for turn in conv.turns:
                yield conv, turn

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def fingerprint(self) -> str:
        """A short hash of the whole plan: equal fingerprints, identical traffic."""
        text = json.dumps(self.to_dict(), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def log_uniform(rng: random.Random, low: int, high: int) -> int:
    """An integer in [low, high] whose logarithm is uniform: as many 10s as 1000s."""
    value = round(math.exp(rng.uniform(math.log(low), math.log(high))))
    return min(max(value, low), high)


def lognormal(rng: random.Random, median: float, sigma: float) -> float:
    """A log-normal draw given its median (exp of the mean of its log) and the sigma of its log."""
    return rng.lognormvariate(math.log(median), sigma)


def suffix_size(rng: random.Random, mix: tuple[SuffixKind, ...]) -> tuple[str, int]:
    kind = rng.choices(mix, weights=[k.weight for k in mix])[0]
    return kind.name, log_uniform(rng, kind.low, kind.high)


def planned_turns(rng: random.Random, cfg: WorkloadConfig) -> int:
    return min(max(round(lognormal(rng, cfg.turns_median, cfg.turns_sigma)), 2), cfg.turns_max)


def conversation(cfg: WorkloadConfig, index: int, start_s: float, abandoned: bool) -> Conversation:
    """Conversation `index`, drawn from its own generator (so a second run of a config, or a
    change of one conversation's fate, leaves the others' turns unchanged)."""
    rng = random.Random(f"{cfg.seed}:conversation:{index}")
    planned = planned_turns(rng, cfg)
    keep = rng.randint(1, planned - 1) if abandoned else planned
    turns: list[PlannedTurn] = []
    context = 0
    for i in range(keep):
        if i == 0:
            kind, size, think = "first", log_uniform(rng, *cfg.first_prompt), 0.0
        else:
            kind, size = suffix_size(rng, cfg.suffix_mix)
            think = lognormal(rng, cfg.think_median_s, cfg.think_sigma)
        out = rng.randint(*cfg.output_tokens)
        seed = rng.randrange(1 << 62)
        if turns and context + size + out > cfg.max_context:
            break  # a full context ends the conversation (not an abandonment)
        turns.append(PlannedTurn(i + 1, kind, size, think, out, seed))
        context += size + out
    return Conversation(f"c{index:03d}", start_s, planned, abandoned, tuple(turns))


def abandoned_set(cfg: WorkloadConfig) -> set[int]:
    """Which conversations are abandoned: exactly `abandon_share` of them (rounded), chosen by
    the seed. An exact share keeps two seeds, or a short run, comparable; a coin per
    conversation would abandon none of eight one time in ten."""
    count = round(cfg.abandon_share * cfg.conversations)
    return set(random.Random(f"{cfg.seed}:abandon").sample(range(cfg.conversations), count))


def make_plan(cfg: WorkloadConfig) -> Plan:
    """The whole workload of `cfg`: pure, and the same for the same config."""
    arrivals = random.Random(f"{cfg.seed}:arrivals")
    abandoned = abandoned_set(cfg)
    convs, start = [], 0.0
    for i in range(cfg.conversations):
        convs.append(conversation(cfg, i, start, i in abandoned))
        start += arrivals.expovariate(1.0 / cfg.arrival_mean_s)
    return Plan(cfg, tuple(convs))


def span_s(plan: Plan) -> float:
    """Real seconds of think time and arrival gaps alone (the run takes that times the time
    scale, plus the time the turns themselves take)."""
    return max((c.start_s + sum(t.think_s for t in c.turns) for c in plan.conversations), default=0)


def prefill_work_s(plan: Plan, seconds: Callable[[int], float]) -> tuple[float, float]:
    """P's compute for the plan with every follow-up turn reused (only its suffix computed)
    and with none reused, given P's prefill time per prompt length (`PrefillCost.seconds`)."""
    reused = recomputed = 0.0
    for conv in plan.conversations:
        context = 0
        for turn in conv.turns:
            prompt = context + turn.new_tokens
            reused += seconds(prompt) - seconds(context)
            recomputed += seconds(prompt)
            context = prompt + turn.max_tokens
    return reused, recomputed


def describe(plan: Plan) -> str:
    """A few lines on what the plan holds, printed above the results."""
    turns = [t for _c, t in plan.turns()]
    kinds: dict[str, int] = {}
    for t in turns:
        kinds[t.kind] = kinds.get(t.kind, 0) + 1
    thinks = sorted(t.think_s for t in turns if t.index > 1)
    p50 = thinks[len(thinks) // 2] if thinks else 0.0
    abandoned = sum(c.abandoned for c in plan.conversations)
    mix = ", ".join(f"{k} {n}" for k, n in sorted(kinds.items()))
    return (
        f"plan {plan.fingerprint()} (seed {plan.config.seed}): {len(plan.conversations)} "
        f"conversations, {len(turns)} turns ({mix}), {abandoned} abandoned; think times "
        f"median {p50:.0f} s, max {max(thinks, default=0.0):.0f} s (real); arrivals and think "
        f"times span {span_s(plan):.0f} s (real)"
    )
