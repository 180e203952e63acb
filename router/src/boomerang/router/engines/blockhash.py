"""vLLM's own prefix-cache block hashes of a prompt, as its KV events name blocks (pure).

Why: every engine publishes what it stores and evicts as KV events (`kvevents.py`) keyed by
its block hashes. To ask "which engine holds the leading blocks of this prompt", the router
must name the prompt's blocks the same way. vLLM's default hashing is reproducible across
processes by design (sha256 over the pickled `(parent hash, block token ids, extra keys)`,
chained from a root derived from a fixed seed, `vllm.v1.core.kv_cache_utils`), and its events
carry the last 8 bytes of each digest as an integer. This module computes that chain.

Plain text blocks are named, with the request's cache salt where it has one (vLLM puts it in
the first block's extra keys, `("cache_salt", salt)`, and the chain carries it on; the router
salts every tenant's requests, `cache_salt.py`). LoRA and multimodal inputs are not: their
extra keys change the hash, and a request with those simply finds nothing in the index, which
costs a cache miss, never correctness: the index only steers routing.

The router checks the scheme against every event that starts a chain (`verify_stored`): the
events carry the blocks' token ids, so a vLLM that hashes otherwise (another algorithm, a
`PYTHONHASHSEED`, a changed pickle layout) is caught on its first stored prompt, and the index
is then not used.
"""

from __future__ import annotations

import hashlib
import pickle
from collections.abc import Sequence
from functools import lru_cache

DEFAULT_SEED = "vllm-none-hash"
"""vLLM's seed of the root hash for its cryptographic algorithms when PYTHONHASHSEED is unset."""
MASK = (1 << 64) - 1


def _digest(value: object) -> bytes:
    return hashlib.sha256(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)).digest()


@lru_cache(maxsize=8)
def root(seed: str = DEFAULT_SEED) -> bytes:
    """The parent hash of a prompt's first block."""
    return _digest(seed)


def external(digest: bytes) -> int:
    """A block hash as vLLM's KV events carry it: the digest's last 8 bytes, big-endian."""
    return int.from_bytes(digest, "big") & MASK


def chain(
    token_ids: Sequence[int],
    block_size: int,
    seed: str = DEFAULT_SEED,
    parent: bytes | None = None,
    salt: str | None = None,
) -> list[bytes]:
    """The full digests of the whole blocks of `token_ids`, chained from `parent` (the root:
    then the first block carries `salt`, a request's `cache_salt`, as vLLM's extra key)."""
    if block_size <= 0:
        return []
    prev = parent or root(seed)
    extra = (("cache_salt", salt),) if salt and parent is None else None
    out = []
    for at in range(0, len(token_ids) - block_size + 1, block_size):
        prev = _digest((prev, tuple(token_ids[at : at + block_size]), extra))
        extra = None
        out.append(prev)
    return out


def prompt_hashes(
    token_ids: Sequence[int], block_size: int, seed: str = DEFAULT_SEED, salt: str | None = None
) -> list[int]:
    """The prompt's block hashes as events name them, first block first."""
    return [external(d) for d in chain(token_ids, block_size, seed, salt=salt)]


def verify_stored(
    hashes: Sequence[int],
    token_ids: Sequence[int],
    block_size: int,
    seed: str = DEFAULT_SEED,
    salt: str | None = None,
) -> bool:
    """Whether a stored chain that starts at the root hashes as this module does."""
    if len(hashes) * block_size != len(token_ids):
        return False
    return prompt_hashes(token_ids, block_size, seed, salt) == list(hashes)
