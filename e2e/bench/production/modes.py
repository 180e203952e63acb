"""What the production benchmark compares, on what, under which load (pure data).

Modes: how a turn is routed and what runs in the engines.
- Baselines, on stock vLLM engines (`stock.py`: none of Boomerang's code inside, prefix caching
  on in both roles, bidirectional off):
  - `vllm-proxy`: vLLM's own toy P/D proxy (round-robin), as a user copying vLLM's example runs;
  - `plain`: Boomerang's router as a plain P/D proxy, least load, no index;
  - `affinity`: conversation affinity for P and D and KV-index routing of P;
  - `decode-first-N`: the policy llm-d (`prefix-based-pd-decider`), Dynamo (conditional
    disaggregation) and SGLang (decode-side radix cache) ship: the decoder caching the prompt
    serves it alone when fewer than N tokens are not cached there (`router/.../decode_first.py`).
- The same policies on Boomerang's engines with bidirectional off (`@quiet`): what its engine
  fixes alone give (NIXL's progress thread that does not spin, the decoder's idle wait), with
  none of its reuse. On a CPU the stock engines lose half a core each to NIXL's progress thread,
  which a GPU node pays on a host core instead: against these, a ratio is the router's own.
- Boomerang, on its own engines (bidirectional on): `static`, and `adaptive`, the default
  configuration exactly as the API defaults it (nothing tuned for this benchmark).

Regimes: replicas, KV sizes and the conversations' shape. `spare`, `pressure` and `2p1d` are
the default workload; the sweep adds shapes the default was not tuned to: long first prompts,
tool-result-sized follow-ups, 4 and 12 clients, and `agentic`, where P's KV is a third of D's
(as one prefill engine caching the conversations of three decoders), so that P evicts
histories D still holds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

Engines = Literal["stock", "quiet", "boomerang"]
"""Stock vLLM; Boomerang's engines with bidirectional off; Boomerang's engines."""


@dataclass(frozen=True)
class Mode:
    engines: Engines
    router: dict[str, Any] | None
    """The router's overrides; None: vLLM's own proxy instead of Boomerang's router."""

    @property
    def bidirectional(self) -> bool:
        return self.engines == "boomerang"


STOCK_ROUTER = {"bidirectional": False}
DECODE_FIRST_THRESHOLDS = (16, 128, 512)
"""The stock sittings' thresholds (their published rows)."""
PEER_THRESHOLDS = (512, 2048, 8192)
"""Decode-first on equal engines, at thresholds that fire on tool-result-sized turns: with
128-token blocks the unfilled last block alone can reach 128, and a 500-3,000-token tool
result is above 512, so the stock sittings' thresholds were affinity under another name there."""
DYNAMO_ISL_TOKENS, DYNAMO_ISL_RATIO = 2048, 0.7
"""Dynamo's conditional disaggregation defaults (`IslBounding`): skip P when the decoder lacks
fewer than 2,048 tokens and under 0.7 of the prompt."""
P_BUSY_TOKENS = 2048
"""Dynamo's `IslOrLoad` here: P is busy while a tool result's worth of prompt is queued on it."""
QUIET = "@quiet"
"""The suffix of a baseline policy run on Boomerang's engines with bidirectional off."""
_DYNAMO = {**STOCK_ROUTER, "decode_first_tokens": DYNAMO_ISL_TOKENS,
           "decode_first_ratio": DYNAMO_ISL_RATIO}  # fmt: skip
_POLICIES: dict[str, dict[str, Any]] = {
    "affinity": {**STOCK_ROUTER, "affinity": True},
    **{
        f"decode-first-{n}": {**STOCK_ROUTER, "decode_first_tokens": n}
        for n in (128, *PEER_THRESHOLDS)
    },
    "dynamo": _DYNAMO,
    "dynamo-load": {**_DYNAMO, "decode_first_p_busy_tokens": P_BUSY_TOKENS},
}
"""The peers' policies on equal engines: affinity, llm-d's decode-first at every threshold
run, Dynamo's rule and its load variant."""
PEERS = tuple(
    f"{name}{QUIET}"
    for name in ("affinity", *(f"decode-first-{n}" for n in PEER_THRESHOLDS), "dynamo",
                 "dynamo-load")
)  # fmt: skip
"""The equal-engine sitting's baselines (`--equal`): the policies peers ship, at settings that
fire."""
AA = "adaptive-aa"
"""The default mode run again as a mode of its own: its ratio to `adaptive` is the noise band."""
MODES: dict[str, Mode] = {
    "vllm-proxy": Mode("stock", None),
    "plain": Mode("stock", {**STOCK_ROUTER, "affinity": False, "kv_events": {"enabled": False}}),
    "affinity": Mode("stock", {**STOCK_ROUTER, "affinity": True}),
    **{
        f"decode-first-{n}": Mode("stock", {**STOCK_ROUTER, "decode_first_tokens": n})
        for n in DECODE_FIRST_THRESHOLDS
    },
    **{f"{name}{QUIET}": Mode("quiet", router) for name, router in _POLICIES.items()},
    "static": Mode("boomerang", {"tuning": {"mode": "static"}}),
    "adaptive": Mode("boomerang", {"tuning": {"mode": "adaptive"}}),
    AA: Mode("boomerang", {"tuning": {"mode": "adaptive"}}),
}
"""Adaptive is named explicitly: the manifest the benchmark starts from (`local-cpu.yaml`)
pins Static, so an empty override ran Static. Nothing else is set: the API's defaults."""
DEFAULT_MODE = "adaptive"
BASELINES = tuple(name for name, mode in MODES.items() if mode.engines == "stock")
"""What a user runs without Boomerang: the headline's comparison."""
QUIET_BASELINES = tuple(name for name, mode in MODES.items() if mode.engines == "quiet")
"""The same policies on engines as fast as Boomerang's: the router's own share."""


@dataclass(frozen=True)
class Workload:
    """The client's conversations: vLLM's generator parameters (token ranges, inclusive)."""

    conversations: int = 24
    clients: int = 8
    messages: tuple[int, int] = (8, 12)
    """User and assistant messages per conversation: 4-6 user turns."""
    first: tuple[int, int] = (1500, 3000)
    follow_up: tuple[int, int] = (20, 200)
    answer: tuple[int, int] = (32, 96)


@dataclass(frozen=True)
class Regime:
    prefill: int = 1
    decode: int = 1
    p_blocks: int | None = None
    d_blocks: int | None = None
    """KV blocks of 128 tokens per engine (`--num-gpu-blocks-override`); None: the CPU
    engine's KV space."""
    max_model_len: int = 16384
    workload: Workload = field(default_factory=Workload)
    sweep: bool = False
    """Part of the sweep (`--sweep`), not of the default sitting."""


PRESSURE_BLOCKS = 200
"""Both engines' KV in the pressure regime (25,600 tokens): 8 concurrent conversations of 2-5k
tokens plus what D retains exceed it."""
TOOL = Workload(messages=(4, 8), follow_up=(500, 3000))
"""Agents' follow-ups: tool results of 500-3,000 tokens, 2-4 user turns (to fit 16k tokens)."""
REGIMES: dict[str, Regime] = {
    "spare": Regime(),
    "pressure": Regime(p_blocks=PRESSURE_BLOCKS, d_blocks=PRESSURE_BLOCKS, max_model_len=8192),
    "2p1d": Regime(prefill=2),
    "agentic": Regime(p_blocks=200, d_blocks=600, workload=TOOL, sweep=True),
    "long-first": Regime(workload=Workload(conversations=16, first=(6000, 12000)), sweep=True),
    "tool-results": Regime(workload=TOOL, sweep=True),
    "clients-4": Regime(workload=Workload(clients=4), sweep=True),
    "clients-12": Regime(workload=Workload(clients=12), sweep=True),
    "2p2d": Regime(prefill=2, decode=2, sweep=True),
}
"""`2p2d` needs four cores (a core per engine: `boomerang.local.placement`); on two cores the
local runtime refuses it."""


def generator_config(w: Workload) -> dict[str, Any]:
    """vLLM's multi-turn generator JSON for a workload (its text file named `text.txt`)."""

    def uniform(lo_hi: tuple[int, int]) -> dict[str, Any]:
        return {"distribution": "uniform", "min": lo_hi[0], "max": lo_hi[1]}

    return {
        "filetype": "generate_conversations",
        "num_conversations": w.conversations,
        "text_files": ["text.txt"],
        "print_stats": False,
        "prompt_input": {
            "num_turns": uniform(w.messages),
            "common_prefix_num_tokens": {"distribution": "constant", "value": 0},
            "prefix_num_tokens": uniform(w.first),
            "num_tokens": uniform(w.follow_up),
        },
        "prompt_output": {"num_tokens": uniform(w.answer)},
    }


def longest_prompt(w: Workload) -> int:
    """The longest prompt the workload can send (the stall bound's prefill)."""
    user_turns = w.messages[1] // 2
    return w.first[1] + (user_turns - 1) * (w.follow_up[1] + w.answer[1])


def abba(modes: list[str], rounds: int) -> list[list[str]]:
    """One list of `modes` per round, reversed every other round (A B, B A, A B, ...)."""
    return [list(modes) if r % 2 == 0 else list(modes)[::-1] for r in range(rounds)]


def order(modes: list[str], rounds: int) -> list[list[str]]:
    """Engine sets one after the other, never side by side (they would share cores): stock,
    quiet, Boomerang, stock (stock around the rest, so drift of the host's speed falls on
    both; quiet next to Boomerang, whose comparison is the finer one), modes ABBA within.
    Without stock engines the quiet rounds bracket Boomerang's instead: quiet, Boomerang,
    quiet (the equal-engine sitting, `--equal`)."""
    stock = abba([m for m in modes if MODES[m].engines == "stock"], rounds)
    quiet = abba([m for m in modes if MODES[m].engines == "quiet"], rounds)
    ours = abba([m for m in modes if MODES[m].engines == "boomerang"], rounds)
    half = (rounds + 1) // 2
    q_half = len(quiet) if any(stock) else half
    sets = [
        [m for r in stock[:half] for m in r],
        [m for r in quiet[:q_half] for m in r],
        [m for r in ours for m in r],
        [m for r in quiet[q_half:] for m in r],
        [m for r in stock[half:] for m in r],
    ]
    return [s for s in sets if s]
