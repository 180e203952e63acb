"""Where a conversation's previous turn ran, so its next turn can go where its history is cached.

Why: with prefix caching on (as every production deployment runs it), the prefill engine that
served a conversation's last turn still holds that turn's prompt in its prefix cache, and the
decoder that answered it holds the prompt and the answer: sending the next turn to them saves
P the recompute of the history and shrinks the P->D transfer to what D lacks. Every serious
router does this (session affinity in llm-d, Dynamo and SGLang's gateway); Boomerang does it in
every mode, with or without D->P reuse, and for a conversation found by its id or by the
fingerprint of its content (the same keys as its handle, `conversation.py`).

A placement is a hint, never a correctness input: a wrong one costs only a cache miss. What it
is worth is for the selection strategy to weigh against load (`endpoints.py`): the tokens P is
likely to find cached (the previous prompt, cut to whole blocks) against its outstanding work.
Entries live in a bounded LRU map (per router replica, in memory: losing one costs a miss),
dropped after `ttl_s` (an engine's prefix cache rarely keeps an idle conversation longer).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Placement:
    """The engines of a conversation's previous turn, and the prompt P computed for it."""

    prefill: str | None
    decode: str | None
    prompt_tokens: int
    at: float


class Affinity:
    """Conversation key -> placement of its previous turn (bounded, least recently used out)."""

    def __init__(self, capacity: int, ttl_s: float) -> None:
        self.capacity = capacity
        self.ttl_s = ttl_s
        self._items: OrderedDict[bytes, Placement] = OrderedDict()

    def get(self, key: bytes | None, now: float) -> Placement | None:
        if key is None:
            return None
        placement = self._items.get(key)
        if placement is None:
            return None
        if now - placement.at > self.ttl_s:
            del self._items[key]
            return None
        return placement

    def put(self, key: bytes | None, placement: Placement) -> None:
        if key is None or self.capacity <= 0:
            return
        self._items[key] = placement
        self._items.move_to_end(key)
        while len(self._items) > self.capacity:
            self._items.popitem(last=False)

    def __len__(self) -> int:
        return len(self._items)


def cached_tokens(placement: Placement | None, block_size: int | None) -> dict[str, int]:
    """What each prefill engine probably holds of the new prompt: the previous prompt, cut to
    whole blocks (vLLM caches only full blocks), on the engine that computed it."""
    if placement is None or placement.prefill is None:
        return {}
    tokens = placement.prompt_tokens
    if block_size:
        tokens -= tokens % block_size
    return {placement.prefill: max(0, tokens)}
