"""A stand-in for vLLM's KV event publisher: the same sockets and wire format, driven by tests.

vLLM's `ZmqEventPublisher` sends `(topic, seq as 8 big-endian bytes, msgpack batch)` on a PUB
socket, keeps the batches for replay on a ROUTER socket (a request carries the first seq
wanted; the answer is every kept batch from it, then an end marker), and its batches are
`[ts, [events...], dp_rank]` with each event a map tagged by `type`. This one does the same on
loopback, with hooks to drop batches (a gap), forget old ones (a short buffer) and restart.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import msgpack
import zmq
import zmq.asyncio

from boomerang.router.engines import blockhash

END_SEQ = (-1).to_bytes(8, "big", signed=True)


def stored(
    ids: list[int], block_size: int, first: int = 0, salt: str | None = None
) -> dict[str, Any]:
    """vLLM's event for the whole blocks of `ids` from block `first` on (the earlier ones
    stored before: the event names the last of them as the parent), of a request salted
    `salt`: its first block's extra keys carry the bare salt, as vLLM publishes them."""
    hashes = blockhash.prompt_hashes(ids, block_size, salt=salt)
    extra = [[salt] if salt and i == 0 else None for i in range(first, len(hashes))]
    return {
        "type": "BlockStored",
        "block_hashes": hashes[first:],
        "parent_block_hash": hashes[first - 1] if first else None,
        "token_ids": ids[first * block_size : len(hashes) * block_size],
        "block_size": block_size,
        "lora_id": None,
        "medium": "GPU",
        "lora_name": None,
        "extra_keys": extra if any(extra) else None,
    }


def removed(hashes: list[int]) -> dict[str, Any]:
    return {"type": "BlockRemoved", "block_hashes": hashes, "medium": "GPU"}


class FakePublisher:
    def __init__(self) -> None:
        self.ctx = zmq.asyncio.Context.instance()
        self.pub = self.ctx.socket(zmq.PUB)
        self.pub_port = self.pub.bind_to_random_port("tcp://127.0.0.1")
        self.router = self.ctx.socket(zmq.ROUTER)
        self.replay_port = self.router.bind_to_random_port("tcp://127.0.0.1")
        self.buffer: list[tuple[int, bytes]] = []
        self.seq = 0
        self.replays: list[int] = []
        self._task = asyncio.create_task(self._serve())

    async def send(self, *events: dict[str, Any], drop: bool = False) -> int:
        """Publish one batch (or, with `drop`, only keep it for replay: a missed batch)."""
        payload = msgpack.packb([time.time(), list(events), 0])
        seq, self.seq = self.seq, self.seq + 1
        self.buffer.append((seq, payload))
        if not drop:
            await self.pub.send_multipart([b"kv", seq.to_bytes(8, "big"), payload])
        return seq

    def restart(self) -> None:
        """A restarted engine: numbering from 0, nothing kept."""
        self.seq, self.buffer = 0, []

    async def _serve(self) -> None:
        while True:
            client, _, start = await self.router.recv_multipart()
            first = int.from_bytes(start, "big")
            self.replays.append(first)
            for seq, payload in self.buffer:
                if seq >= first:
                    frames = [client, b"", b"kv", seq.to_bytes(8, "big"), payload]
                    await self.router.send_multipart(frames)
            await self.router.send_multipart([client, b"", b"", END_SEQ, b""])

    async def close(self) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        self.pub.close(0)
        self.router.close(0)
