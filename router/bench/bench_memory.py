"""Memory per stored conversation in the router's memory store, measured with tracemalloc.

Part of the router benchmark (`make bench-router` prints it, and
`--memory-only` prints only it); kept apart because it needs no engines, only realistic
handles: the params vLLM's D returns for a history of so many tokens in blocks of so many
(`remote_block_ids` with one id per block), the 128-bit hash of the tokens it holds and their
chained 8-byte per-block hashes (one per whole block).
"""

from __future__ import annotations

import asyncio
import random
import time
import tracemalloc
from array import array
from dataclasses import replace

from boomerang.router import params_codec
from boomerang.router.conversation import build_handle, id_key
from boomerang.router.store import MemoryStore

CACHE_TOKENS = 3_200_000
"""D's KV cache in tokens, for scattered block ids: 200k blocks of 16 tokens, 25k of 128."""
CASES = ((1000, 16), (8192, 128), (32768, 128))
"""(history tokens, block size): vLLM's GPU default blocks at 1k tokens; 128-token blocks (the
CPU engine's, and common on GPUs) at 8k and 32k tokens."""


def memory_per_conversation(
    n: int = 100_000, scattered: bool = False, tokens: int = 1000, block_size: int = 16
) -> float:
    """Bytes per stored conversation in the memory store, for realistic handles.

    `scattered`: block ids drawn at random from a KV cache of `CACHE_TOKENS` tokens (a
    fragmented cache) instead of a run, which is the worst case for the params' compression.
    """
    rng = random.Random(0)
    store = MemoryStore(max_conversations=n)
    blocks = -(-tokens // block_size)
    # Made before tracing starts, so that the loop allocates little besides what it stores.
    # Every conversation has its own params; they share one history, hashed once here (the
    # store copies the hashes into each entry, so the measure is the same).
    held = {"remote_num_tokens": tokens, "remote_block_ids": [list(range(blocks))]}
    url, expires = "http://10.0.12.34:8000", time.time() + 400
    template = build_handle(held, range(tokens), url, expires, block_size)
    assert template is not None and len(template.block_hashes) == 8 * (tokens // block_size)
    scatter = array("I")
    for _ in range(n if scattered else 0):
        scatter.extend(rng.sample(range(CACHE_TOKENS // block_size), blocks))

    async def fill() -> None:
        for i in range(n):
            params = {
                "do_remote_prefill": False,
                "do_remote_decode": True,
                "remote_block_ids": [
                    scatter[i * blocks : (i + 1) * blocks].tolist()
                    if scattered
                    else list(range(1000 + i, 1000 + blocks + i))
                ],
                "remote_engine_id": "0b5c1f9e-6d5e-4b6a-9a43-8a1f0c7d2e11",
                "remote_request_id": f"chatcmpl-{i:032x}",
                "remote_host": "10.0.12.34",
                "remote_port": 5600,
                "tp_size": 1,
                "dcp_size": 1,
                "pp_size": 1,
                "remote_num_tokens": tokens,
                "remote_blocks_expiry_time": 123456.789,
                "transfer_mode": "pull",
            }
            handle = replace(template, params=params_codec.pack(params))
            await store.put(id_key("tenant", f"conversation-{i}"), handle)

    loop = asyncio.new_event_loop()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    loop.run_until_complete(fill())
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    loop.close()
    return (after - before) / n
