"""Memory per stored conversation in the router's memory store, measured with tracemalloc.

Part of the router benchmark (`python -m boomerang.router.bench` prints it); kept apart because
it needs no engines, only realistic handles: the params vLLM's D returns for a 1k-token
history (63 blocks of 16 tokens) and the hash of the tokens it holds.
"""

from __future__ import annotations

import asyncio
import random
import time
import tracemalloc
from array import array

from boomerang.router.conversation import build_handle, id_key
from boomerang.router.store import MemoryStore


def memory_per_conversation(n: int = 100_000, scattered: bool = False) -> float:
    """Bytes per stored conversation in the memory store, for realistic handles.

    `scattered`: block ids drawn at random (a fragmented KV cache) instead of a run, which is
    the worst case for the params' compression.
    """
    rng = random.Random(0)
    store = MemoryStore(max_conversations=n)
    # Made before tracing starts, so that the loop allocates little besides what it stores.
    history = list(range(1000))
    scatter = array("I")
    for _ in range(n if scattered else 0):
        scatter.extend(rng.sample(range(200_000), 63))

    async def fill() -> None:
        for i in range(n):
            params = {
                "do_remote_prefill": False,
                "do_remote_decode": True,
                "remote_block_ids": [
                    scatter[i * 63 : i * 63 + 63].tolist()
                    if scattered
                    else list(range(1000 + i, 1063 + i))
                ],
                "remote_engine_id": "0b5c1f9e-6d5e-4b6a-9a43-8a1f0c7d2e11",
                "remote_request_id": f"chatcmpl-{i:032x}",
                "remote_host": "10.0.12.34",
                "remote_port": 5600,
                "tp_size": 1,
                "dcp_size": 1,
                "pp_size": 1,
                "remote_num_tokens": 1000,
                "remote_blocks_expiry_time": 123456.789,
                "transfer_mode": "pull",
            }
            handle = build_handle(params, history, "http://10.0.12.34:8000", time.time() + 400)
            assert handle is not None
            await store.put(id_key("tenant", f"conversation-{i}"), handle)

    loop = asyncio.new_event_loop()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    loop.run_until_complete(fill())
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    loop.close()
    return (after - before) / n
