"""Decode-first routing, the policy peers ship for multi-turn P/D without bidirectional KV (pure).

Why it exists: a follow-up whose history already sits in a decoder's prefix cache needs no
transfer at all when the decoder computes the few tokens it lacks itself. llm-d's scheduler
picks the decode pod first (prefix-cache and load scorers) and adds a prefill pod only when
that pod's non-cached tokens reach a threshold (`prefix-based-pd-decider`, `nonCachedTokens`);
NVIDIA Dynamo's conditional disaggregation and SGLang's decode-side radix cache make the same
bet. Boomerang runs it as the strongest baseline a user could deploy instead of bidirectional
reuse (`decode_first_tokens` in the router's configuration, bidirectional off): the benchmark
compares its own modes against it, and a deployment may choose it.

The rule: among the decoders within `slack` in-flight requests of the least loaded one, the one
that caches the longest prefix of the prompt (KV events, `kvindex.py`); the turn runs on it
alone when fewer than `threshold` of the prompt's tokens are not cached there, otherwise P
prefills and that decoder decodes. Dynamo's variants add two conditions, both optional:
- `ratio` (its `IslBounding`, 2,048 tokens and 0.7 by default there): the uncached tokens must
  also be under this share of the prompt, so a short prompt the decoder barely caches still
  goes through P;
- `p_busy` (its `IslOrLoad`): the decoder serves the turn alone whenever P is busy, whatever
  it lacks, so that a follow-up does not queue behind first turns on P.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class DecodeChoice:
    url: str
    alone: bool
    """The decoder serves the turn by itself (no prefill engine)."""
    uncached: int
    """Prompt tokens the decoder would compute (not in its prefix cache)."""


def choose(
    prompt_tokens: int,
    cached: Mapping[str, int],
    inflight: Mapping[str, int],
    threshold: int,
    slack: int,
    ratio: float | None = None,
    p_busy: bool = False,
) -> DecodeChoice:
    """The decoder for a turn and whether it serves alone; `inflight` names the candidates in
    the order ties are broken, `cached` what each holds of the prompt (missing: nothing)."""
    if not inflight:
        raise ValueError("decode-first needs at least one decoder")
    least = min(inflight.values())
    near = [url for url, n in inflight.items() if n <= least + slack]
    url = max(near, key=lambda u: (min(cached.get(u, 0), prompt_tokens), -inflight[u]))
    uncached = prompt_tokens - min(cached.get(url, 0), prompt_tokens)
    short = uncached < threshold and (ratio is None or uncached < ratio * max(prompt_tokens, 1))
    return DecodeChoice(url, short or p_busy, uncached)
