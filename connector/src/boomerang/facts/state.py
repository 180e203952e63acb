"""The router's state document, `GET /boomerang/v1/state`: its one description.

Why here: the router writes it and the operator reads it (status shows what an Adaptive router
learned), and the two must agree on every name; the shared facts are the one package both
import (`make lint` checks that it imports neither). Pure constants and one pure check, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

PATH: Final = "/boomerang/v1/state"
"""Where a router serves it (no API key: it holds no conversation data)."""

MODE: Final = "mode"
"""The tuning mode in force, one of `boomerang.facts.MODES`."""
PATH_COUNTS: Final = "paths"
"""Turns served per path since the router started: a mapping from each of `PATHS`."""
PATHS: Final = ("pull", "recompute", "continue")
"""The ways a turn reaches its first token (the router's `costmodel.Path` values)."""
BREAK_EVEN_TOKENS: Final = "break_even_tokens"
"""Learned: pulled tokens at which a pull costs what a recompute costs."""
CONTINUE_LIMIT_TOKENS: Final = "continue_limit_tokens"
"""Longest suffix a continue may compute on a decoder whose streams are not measured yet."""
CONTINUE_LIMITS: Final = "continue_limits"
"""Per decoder URL: its measured stream time (`stream_s`), the ITL budget derived from it
(`itl_budget_s`) and the longest suffix a continue may compute there now (`tokens`)."""
SLO: Final = "slo"
"""The turns' bounds the path choice serves (adaptive, SLO-aware; absent otherwise): `scale`,
`tpot_s` (every stream's) and `ttft_s` per prompt length in tokens as a mapping (`SLO_AT`),
derived from what the router measured unless the operator set them."""
SLO_AT: Final = (1_000, 8_000)
"""The prompt lengths the state shows a TTFT bound for (it grows with the prompt)."""
COEFFICIENTS: Final = "coefficients"
RETENTION_S: Final = "retention_s"
"""Learned: how long a conversation's handle is kept (a quantile of the gaps between turns)."""
RETAINED_BLOCKS: Final = "retained_blocks"
RETAINED_FRACTION: Final = "retained_fraction"
"""Of the decoders' KV blocks, the share the router's leases hold (None when not known)."""
RETAINED_BLOCK_SECONDS: Final = "retained_block_seconds"
LEASES: Final = "leases"
KV_INDEX: Final = "kv_index"
"""What the router's index of the engines' KV holds: `usable`, `blocks`, `bytes`, and per engine
URL its block count (`engines`)."""

REQUIRED: Final = (MODE, PATH_COUNTS, BREAK_EVEN_TOKENS, RETENTION_S, RETAINED_BLOCKS)


def missing(state: Mapping[str, Any]) -> list[str]:
    """The required keys a state document lacks, and paths its counts lack (empty: valid)."""
    gone = [k for k in REQUIRED if k not in state]
    counts = state.get(PATH_COUNTS)
    if isinstance(counts, Mapping):
        gone += [f"{PATH_COUNTS}.{p}" for p in PATHS if p not in counts]
    return gone
