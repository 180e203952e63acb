"""What a prefill engine will still hold of a prompt when the turn's prefill starts (pure).

Why it exists: the KV index (or the conversation's placement) says what P caches *now*, but a
turn queued behind others runs later, and every block those others allocate first comes out of
P's free blocks, least recently used first. A P whose cache is small against its load (one P
feeding several decoders, long agent histories) has evicted the history by then, and a plan
that trusted the snapshot recomputed it all instead of pulling it from D (measured: in the
benchmark's agentic regime every follow-up's history was "cached on P" at plan time and P
then computed it whole, `docs/benchmarks.md`).

The estimate follows vLLM's eviction order. A finished request's blocks join P's free queue
tail first (its last block is evicted first, its first block last), and behind every block
freed before them. So before this conversation's cached blocks are touched, what P allocates
for the work queued ahead is taken from the rest of its KV, and once that is spent the
conversation loses its tail block by block:

    kept_blocks = clamp(capacity_blocks - ahead_blocks, 0, cached_blocks)

`ahead_blocks` is the KV of the turns the router has sent to P and not yet had answered, their
whole prompts (`Endpoint.kv_tokens`, the router's own accounting, no engine call): what they
compute takes free blocks, and what they find cached is in use while they run, out of the
free queue the conversation's blocks sit in. Counting every prompt whole errs low where those
turns share blocks; measured, counting only what they compute erred high (the benchmark's
agentic regime: 11k of 25.6k tokens "kept", none found). Where P's KV size or block size is
unknown the snapshot stands (the previous behaviour).

Erring low costs little: a turn that attaches D's handle while P still holds the history pulls
only what P lacks (vLLM's P matches its own prefix cache first), so the worst case is a read
notification to D; erring high costs a whole recompute.
"""

from __future__ import annotations

import math


def kept_tokens(
    cached_tokens: int, ahead_tokens: float, capacity_blocks: int | None, block_size: int | None
) -> int:
    """Of `cached_tokens` (whole blocks P holds of the prompt now), those it will still hold
    once it has allocated the blocks of `ahead_tokens` queued before the turn."""
    if cached_tokens <= 0:
        return 0
    if not capacity_blocks or not block_size or ahead_tokens <= 0:
        return cached_tokens
    cached_blocks = cached_tokens // block_size
    ahead_blocks = math.ceil(ahead_tokens / block_size)
    kept = max(0, min(cached_blocks, capacity_blocks - ahead_blocks))
    return kept * block_size
