"""One index over every engine's KV blocks: block hash -> the engines holding it (pure).

Why: the router routes by what each engine already holds (`plan.py`): the prefill engine with
the longest cached prefix of a prompt, the decoder that still holds a conversation's history.
Engines say what they store and evict as KV events (`kvevents.py` applies them here), and one
router may see a million blocks: a dict of Python ints would cost about 200 bytes a block.
This index is two flat arrays of 64-bit words (a hash table with open addressing and linear
probing, emptied slots shifted back instead of tombstoned), kept at most half full: 32 bytes a
block at the worst, 16 right after it grows. An engine is one bit of the value (`Engines`
hands out bits), so an index serves at most 64 engines (`MAX_ENGINES`); a block held by
several engines is one entry.

Hash 0 marks an empty slot; a block whose hash is 0 is stored as 1 (one chance in 2^64, and
the index only steers routing: a wrong answer costs a cache miss, never correctness).
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Sequence

MAX_ENGINES = 64
_LOAD = 0.5
_MIN_CAPACITY = 1 << 10


def _key(h: int) -> int:
    return h or 1


class BlockIndex:
    """Block hash (64 bits) -> bitmask of the engines holding the block."""

    def __init__(self, capacity: int = _MIN_CAPACITY) -> None:
        size = _MIN_CAPACITY
        while size < capacity:
            size <<= 1
        self._alloc(size)

    def _alloc(self, size: int) -> None:
        self._keys = array("Q", bytes(8 * size))
        self._vals = array("Q", bytes(8 * size))
        self._mask = size - 1
        self._count = 0

    def __len__(self) -> int:
        return self._count

    @property
    def nbytes(self) -> int:
        """What the two arrays take."""
        return 2 * 8 * (self._mask + 1)

    def _find(self, key: int) -> int:
        """The slot holding `key`, or the empty slot where it would go."""
        keys, mask = self._keys, self._mask
        i = key & mask
        while True:
            k = keys[i]
            if k == key or k == 0:
                return i
            i = (i + 1) & mask

    def holders(self, h: int) -> int:
        i = self._find(_key(h))
        return self._vals[i] if self._keys[i] else 0

    def add(self, h: int, bit: int) -> None:
        key = _key(h)
        i = self._find(key)
        if self._keys[i] == 0:
            if (self._count + 1) > _LOAD * (self._mask + 1):
                self._grow()
                i = self._find(key)
            self._keys[i] = key
            self._count += 1
        self._vals[i] |= 1 << bit

    def remove(self, h: int, bit: int) -> None:
        i = self._find(_key(h))
        if self._keys[i] == 0:
            return
        left = self._vals[i] & ~(1 << bit)
        if left:
            self._vals[i] = left
        else:
            self._delete(i)

    def _delete(self, i: int) -> None:
        """Empty slot i and shift back the entries of its probe run that would be lost."""
        keys, vals, mask = self._keys, self._vals, self._mask
        keys[i] = vals[i] = 0
        self._count -= 1
        j = i
        while True:
            j = (j + 1) & mask
            k = keys[j]
            if k == 0:
                return
            home = k & mask
            # Move k back to the hole if its home is not cyclically in (i, j].
            if (j > i and (home <= i or home > j)) or (j < i and i >= home > j):
                keys[i], vals[i] = k, vals[j]
                keys[j] = vals[j] = 0
                i = j

    def _grow(self) -> None:
        keys, vals = self._keys, self._vals
        self._alloc(2 * (self._mask + 1))
        for k, v in zip(keys, vals, strict=True):
            if k:
                i = self._find(k)
                self._keys[i], self._vals[i] = k, v
                self._count += 1

    def drop_engine(self, bit: int) -> int:
        """Forget everything one engine holds (it cleared its cache, restarted, or its events
        can no longer be trusted); how many blocks it held."""
        keys, vals = self._keys, self._vals
        mask, dropped = ~(1 << bit), 0
        survivors = []
        for k, v in zip(keys, vals, strict=True):
            if k:
                dropped += (v >> bit) & 1
                if v & mask:
                    survivors.append((k, v & mask))
        size = self._mask + 1
        while size > _MIN_CAPACITY and len(survivors) < _LOAD * size / 4:
            size >>= 1
        self._alloc(size)
        for k, v in survivors:
            i = self._find(k)
            self._keys[i], self._vals[i] = k, v
            self._count += 1
        return dropped

    def counts(self) -> dict[int, int]:
        """Blocks held per engine bit (a pass over the table: for status, not per turn)."""
        found: dict[int, int] = {}
        for k, v in zip(self._keys, self._vals, strict=True):
            while k and v:
                low = v & -v
                bit = low.bit_length() - 1
                found[bit] = found.get(bit, 0) + 1
                v ^= low
        return found

    def prefixes(self, hashes: Sequence[int], bits: Iterable[int]) -> dict[int, int]:
        """For each engine bit, how many leading blocks of `hashes` it holds."""
        alive = 0
        for bit in bits:
            alive |= 1 << bit
        found: dict[int, int] = {}
        for n, h in enumerate(hashes):
            held = self.holders(h) & alive
            _stop(found, alive & ~held, n)
            alive = held
            if not alive:
                return found
        _stop(found, alive, len(hashes))
        return found


def _stop(found: dict[int, int], bits: int, at: int) -> None:
    while bits:
        low = bits & -bits
        found[low.bit_length() - 1] = at
        bits ^= low


class Engines:
    """Engine URL -> its bit in the index; a departed engine's bit is reused once dropped."""

    def __init__(self) -> None:
        self._bits: dict[str, int] = {}
        self._free = list(range(MAX_ENGINES - 1, -1, -1))

    def bit(self, url: str) -> int | None:
        """The engine's bit, given on first sight; None when all 64 are taken."""
        if url in self._bits:
            return self._bits[url]
        if not self._free:
            return None
        self._bits[url] = bit = self._free.pop()
        return bit

    def known(self, url: str) -> int | None:
        return self._bits.get(url)

    def release(self, url: str) -> int | None:
        """Forget the engine; its bit (to drop from the index first) becomes free again."""
        bit = self._bits.pop(url, None)
        if bit is not None:
            self._free.append(bit)
        return bit

    def urls(self) -> list[str]:
        return list(self._bits)
