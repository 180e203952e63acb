"""An engine's KV blocks: free, in use, pinned by a retained lease, or cached for reuse (LRU).

Why a model per conversation and not per block: every workload here is append-only (a turn's
prompt extends the previous prompt and answer), so what an engine holds of a conversation is
one prefix, a count of whole blocks. That keeps a million turns cheap while keeping what
matters: a prefix-cache hit is the held prefix in whole blocks; eviction takes the least
recently used conversation's blocks from its tail first (vLLM frees a request's blocks in
reverse order, so its tail is evicted first); blocks in use or pinned are never evicted.

Invariant (`check`): free + the blocks of every item == capacity; `cached` is the blocks of
the LRU's items.

Given a clock, the pool also integrates the blocks it holds for someone (in use or pinned, not
cached: a cached block is free to evict) over time (`held_block_s`): the KV a policy keeps
occupied, which a decoder's retained leases raise.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Final

CACHED: Final = 0
"""Evictable: in the LRU order."""
IN_USE: Final = 1
"""A running request's blocks."""
PINNED: Final = 2
"""A retained lease's blocks (D with bidirectional transfer)."""


class BlockPool:
    """Blocks of one engine; items keyed by conversation id: [blocks, state]."""

    __slots__ = (
        "_at",
        "cached",
        "caching",
        "capacity",
        "clock",
        "evicted",
        "free",
        "held_block_s",
        "items",
        "lru",
    )

    def __init__(
        self, capacity: int, *, caching: bool = True, clock: Callable[[], float] | None = None
    ) -> None:
        self.capacity = capacity
        self.caching = caching
        """Prefix caching on: finished requests' blocks stay cached until evicted."""
        self.free = capacity
        self.items: dict[int, list[int]] = {}
        self.lru: OrderedDict[int, None] = OrderedDict()
        self.evicted = 0
        self.cached = 0
        self.clock = clock
        self.held_block_s = 0.0
        """Blocks in use or pinned, integrated over the clock's time (module docs)."""
        self._at = clock() if clock is not None else 0.0

    def _tick(self) -> None:
        """Account the blocks held since the last change, before this one."""
        if self.clock is not None:
            now = self.clock()
            self.held_block_s += (now - self._at) * (self.capacity - self.free - self.cached)
            self._at = now

    def held(self, conv: int) -> int:
        """Blocks of `conv` this engine holds (any state)."""
        item = self.items.get(conv)
        return item[0] if item is not None else 0

    def evictable(self) -> int:
        return self.cached

    def acquire(
        self, conv: int, blocks: int, yield_leases: Callable[[int], None] | None = None
    ) -> bool:
        """A request of `conv` will use `blocks` blocks in all (what it holds counts): take the
        rest from the free blocks, evicting cached ones and, when `yield_leases` is given,
        asking leases to yield (it unpins some) when that is still short. False (and nothing
        taken) when they cannot be found."""
        self._tick()
        item = self.items.get(conv)
        have = item[0] if item is not None else 0
        need = blocks - have
        if item is not None and item[1] == CACHED:
            del self.lru[conv]  # in use from now: not evictable, nor counted as such
            self.cached -= item[0]
            item[1] = IN_USE
        if need > self.free and not self._room(need, yield_leases):
            if item is not None and item[1] == IN_USE:
                item[1] = CACHED
                self.cached += item[0]
                self.lru[conv] = None
                self.lru.move_to_end(conv, last=False)  # as old as it was, near enough
            return False
        if need > 0:
            self.free -= need
        if item is None:
            self.items[conv] = [max(blocks, 0), IN_USE]
        else:
            item[0] = max(have, blocks)
            item[1] = IN_USE
        return True

    def _room(self, need: int, yield_leases: Callable[[int], None] | None) -> bool:
        """Evict cached blocks, least recently used first; when that is short, ask leases to
        yield the rest (they become cached) and evict again."""
        self._evict(need)
        if self.free < need and yield_leases is not None:
            yield_leases(need - self.free)
            self._evict(need)
        return self.free >= need

    def _evict(self, need: int) -> None:
        lru, items = self.lru, self.items
        while self.free < need and lru:
            conv = next(iter(lru))
            item = items[conv]
            take = min(item[0], need - self.free)
            item[0] -= take
            self.free += take
            self.cached -= take
            self.evicted += take
            if item[0] == 0:
                del lru[conv]
                del items[conv]

    def release(self, conv: int, keep: int, *, pin: bool = False) -> None:
        """The request of `conv` finished: keep `keep` whole blocks (cached, or pinned for a
        lease), free the rest."""
        self._tick()
        item = self.items[conv]
        if item[1] == CACHED:
            self.cached -= item[0]
        keep = min(keep, item[0]) if (self.caching or pin) else 0
        self.free += item[0] - keep
        if keep <= 0:
            del self.items[conv]
            self.lru.pop(conv, None)
            return
        item[0] = keep
        if pin:
            item[1] = PINNED
            self.lru.pop(conv, None)
        else:
            item[1] = CACHED
            self.cached += keep
            self.lru[conv] = None
            self.lru.move_to_end(conv)

    def unpin(self, conv: int) -> int:
        """A lease ended (read, released, expired, yielded): its blocks become cached (or free
        without prefix caching). Returns the blocks it held."""
        item = self.items.get(conv)
        if item is None or item[1] != PINNED:
            return 0
        self._tick()
        blocks = item[0]
        if self.caching:
            item[1] = CACHED
            self.cached += blocks
            self.lru[conv] = None
            self.lru.move_to_end(conv, last=False)  # old: the turn finished a while ago
        else:
            del self.items[conv]
            self.free += blocks
        return blocks

    def pinned(self) -> int:
        return sum(b for b, s in self.items.values() if s == PINNED)

    def in_use(self) -> int:
        return sum(b for b, s in self.items.values() if s == IN_USE)

    def check(self) -> None:
        """Raise when blocks were created or lost."""
        total = self.free + sum(b for b, _ in self.items.values())
        if total != self.capacity or self.free < 0:
            raise AssertionError(f"blocks not conserved: {total} != {self.capacity}")
        if set(self.lru) != {c for c, (_, s) in self.items.items() if s == CACHED}:
            raise AssertionError("LRU order out of step with the cached items")
        counted = sum(self.items[c][0] for c in self.lru)
        if self.cached != counted:
            raise AssertionError(f"cached count {self.cached} != the LRU's {counted} blocks")

    def held_share(self, span_s: float) -> float:
        """The share of the blocks held for someone, on average over `span_s` to now."""
        self._tick()
        return self.held_block_s / (self.capacity * span_s) if span_s > 0 else 0.0


class CpuTier:
    """A prefill engine's CPU memory tier (vLLM's OffloadingConnector beside NIXL, as llm-d's
    P/D multi-tier guide sets P up): what it stores of each conversation is the last prompt P
    computed, in whole blocks (`offload_prompt_only`: never the answer, which only D computed),
    least recently used first out when `capacity` tokens are full."""

    __slots__ = ("capacity", "evicted", "held", "used")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.held: OrderedDict[int, int] = OrderedDict()
        self.used = 0
        self.evicted = 0

    def get(self, conv: int) -> int:
        """The tokens stored for a conversation (0: none); a hit is a use."""
        tokens = self.held.get(conv, 0)
        if tokens:
            self.held.move_to_end(conv)
        return tokens

    def put(self, conv: int, tokens: int) -> None:
        """Store a conversation's prompt (a longer one replaces the shorter), evicting LRU."""
        if tokens <= self.held.get(conv, 0) or tokens > self.capacity:
            return
        self.used += tokens - self.held.pop(conv, 0)
        self.held[conv] = tokens
        while self.used > self.capacity:
            _, gone = self.held.popitem(last=False)
            self.used -= gone
            self.evicted += gone
