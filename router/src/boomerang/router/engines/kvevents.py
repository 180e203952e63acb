"""Every engine's KV cache events, applied to the router's index (`kvindex.py`).

Why: the router routes a turn by what each engine already holds (`plan.py`), and only the
engines know that. vLLM publishes each step's stored and evicted blocks (`--kv-events-config`,
rendered for both roles by `boomerang.connector.config`) on a ZMQ PUB socket, numbered, and
keeps the last batches for replay on a ROUTER socket. One task per engine follows them:
- on (re)connecting it asks for everything still in the engine's replay buffer, so a router
  that starts after the engines (or an engine restart) learns what was stored before;
- a batch out of sequence means missed events: it asks for the missing ones; when the
  engine no longer has them, or the engine's numbering restarted (a restarted engine lost its
  cache), what the index holds for that engine is dropped and rebuilt from what comes;
- `AllBlocksCleared` drops the engine's entries; `BlockStored` and `BlockRemoved` of the
  engine's own KV cache (medium GPU, the CPU build included) and its first KV cache group are
  applied, a cache salt on a chain's first block included (every tenant's requests carry
  one, `cache_salt.py`); blocks with other extra keys (LoRA, multimodal inputs) are not, since
  the router cannot name them from a prompt (`blockhash.py`).
Every stored chain that starts at the root is checked against the router's own hashing; one
mismatch makes the index unusable (`usable` false, a warning and a metric), and the router
routes as if it had none, by placement alone (`affinity.py`).

Engines come and go with discovery: the set of engines followed is the pools' endpoints,
checked every `RESCAN_S`; an engine that left is unfollowed and its entries dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import urllib.parse
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Final

import msgpack
import zmq
import zmq.asyncio

from boomerang.router.config import KvEventsConfig
from boomerang.router.engines import blockhash
from boomerang.router.engines.kvindex import BlockIndex, Engines
from boomerang.router.metrics import Metrics

log = logging.getLogger("boomerang.router")
RESCAN_S: Final = 1.0
REPLAY_TIMEOUT_S: Final = 5.0
RECONNECT_S: Final = 2.0
END_SEQ: Final = (-1).to_bytes(8, "big", signed=True)
"""What vLLM's replay socket sends after the last batch it has."""
OWN_MEDIA: Final = frozenset({None, "GPU"})


def endpoints(url: str, cfg: KvEventsConfig) -> tuple[str, str] | None:
    """The engine's event and replay endpoints, from its base URL."""
    parts = urllib.parse.urlsplit(url)
    if parts.hostname is None:
        return None
    port = parts.port or (443 if parts.scheme == "https" else 80)
    if max(port + cfg.port_offset, port + cfg.replay_port_offset) > 65535:
        return None  # not an engine that follows the convention (a test's ephemeral port)
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return (
        f"tcp://{host}:{port + cfg.port_offset}",
        f"tcp://{host}:{port + cfg.replay_port_offset}",
    )


def _nameable(event: dict[str, Any]) -> tuple[bool, str | None]:
    """Whether the router can name a stored event's blocks, and the cache salt they were
    hashed with (None: none). Not nameable: a LoRA, or extra keys other than a salt on a
    chain's first block. Events carry one untagged extra-keys entry per block (a salt as its
    bare string; msgpack gives tuples back as lists)."""
    if event.get("lora_name"):
        return False, None
    extra = event.get("extra_keys") or []
    first = extra[0] if extra else None
    if any(e for e in extra[1:]):
        return False, None
    if not first:
        return True, None
    root_block = event.get("parent_block_hash") is None
    if root_block and isinstance(first, list | tuple) and len(first) == 1:
        salt = first[0]
        return (True, salt) if isinstance(salt, str) and salt else (False, None)
    return False, None


class Index:
    """The index, the engines' bits, and whether the router's hashing matches theirs."""

    def __init__(self, seed: str | None, metrics: Metrics) -> None:
        self.blocks = BlockIndex()
        self.engines = Engines()
        self.seed = seed or blockhash.DEFAULT_SEED
        self.usable = True
        self.block_size: int | None = None
        self._metrics = metrics

    def apply(self, url: str, batch: Any) -> None:
        """Apply one event batch (`[ts, events, dp_rank]`) from engine `url`."""
        bit = self.engines.bit(url)
        if bit is None or not isinstance(batch, list | tuple) or len(batch) < 2:
            return
        for event in batch[1] or ():
            if isinstance(event, dict):
                self._event(bit, event)

    def _event(self, bit: int, event: dict[str, Any]) -> None:
        kind = event.get("type")
        self._metrics.kv_events.labels(str(kind)).inc()
        if kind == "AllBlocksCleared":
            self.blocks.drop_engine(bit)
            return
        if event.get("medium") not in OWN_MEDIA or event.get("group_idx") not in (None, 0):
            return
        hashes = [h for h in event.get("block_hashes") or () if isinstance(h, int)]
        if kind == "BlockRemoved":
            for h in hashes:
                self.blocks.remove(h, bit)
        elif kind == "BlockStored" and (named := _nameable(event))[0]:
            self._check(event, hashes, named[1])
            for h in hashes:
                self.blocks.add(h, bit)

    def _check(self, event: dict[str, Any], hashes: list[int], salt: str | None) -> None:
        size = event.get("block_size")
        if not isinstance(size, int) or size <= 0:
            return
        self.block_size = self.block_size or size
        ids = event.get("token_ids") or []
        if event.get("parent_block_hash") is not None or not self.usable:
            return
        if not blockhash.verify_stored(hashes, ids, size, self.seed, salt):
            self.usable = False
            self._metrics.kv_index_usable.set(0)
            log.warning(
                "KV events hash blocks otherwise than the router: index not used",
                extra={"block_size": size},
            )

    def drop(self, url: str) -> None:
        bit = self.engines.known(url)
        if bit is not None:
            self.blocks.drop_engine(bit)

    def forget(self, url: str) -> None:
        self.drop(url)
        self.engines.release(url)

    @property
    def ready(self) -> bool:
        """Whether the index can answer: the hashing matches and an engine said its block size."""
        return self.usable and self.block_size is not None

    def hashes(self, token_ids: Sequence[int], salt: str | None = None) -> list[int] | None:
        """The prompt's block hashes as the engines name them, for a request salted `salt`
        (None: the index cannot say)."""
        if not self.usable or not self.block_size:
            return None
        return blockhash.prompt_hashes(token_ids, self.block_size, self.seed, salt)

    def cached_tokens(self, hashes: Sequence[int] | None, urls: Iterable[str]) -> dict[str, int]:
        """For each engine, how many leading tokens of the prompt (`hashes`) it holds in
        whole blocks (empty when the index cannot say)."""
        size = self.block_size
        if hashes is None or not self.usable or not size:
            return {}
        bits = self._bits(urls)
        if not bits:
            return {}
        found = self.blocks.prefixes(hashes, bits.values())
        return {u: found.get(b, 0) * size for u, b in bits.items()}

    def holds(self, h: int, urls: Iterable[str]) -> bool:
        """Whether any of the engines `urls` holds the block named `h`."""
        if not self.usable:
            return False
        mask = self.blocks.holders(h)
        return any(mask >> b & 1 for b in self._bits(urls).values())

    def _bits(self, urls: Iterable[str]) -> dict[str, int]:
        """The index bits of the engines among `urls` that it knows."""
        return {u: b for u in urls if (b := self.engines.known(u)) is not None}

    def summary(self) -> dict[str, Any]:
        """The index in the router's state document (`router_state.KV_INDEX`)."""
        counts = self.blocks.counts()
        engines = {
            u: counts.get(b, 0)
            for u in self.engines.urls()
            if (b := self.engines.known(u)) is not None
        }
        return {
            "usable": self.usable,
            "blocks": len(self.blocks),
            "bytes": self.blocks.nbytes,
            "engines": engines,
        }

    def publish(self) -> None:
        self._metrics.kv_index_blocks.set(len(self.blocks))
        self._metrics.kv_index_bytes.set(self.blocks.nbytes)


class KvEvents:
    """Follows the engines of the pools (`urls()`), one task each, into `index`."""

    def __init__(
        self,
        cfg: KvEventsConfig,
        index: Index,
        urls: Callable[[], Iterable[str]],
        metrics: Metrics,
    ) -> None:
        self.cfg, self.index, self._urls, self._metrics = cfg, index, urls, metrics
        self._ctx = zmq.asyncio.Context.instance()
        self._tasks: dict[str, asyncio.Task[None]] = {}

    async def run(self) -> None:
        """Forever (until cancelled): follow every engine the pools list."""
        try:
            while True:
                self.rescan()
                self.index.publish()
                await asyncio.sleep(RESCAN_S)
        finally:
            for task in self._tasks.values():
                task.cancel()
            await asyncio.gather(*self._tasks.values(), return_exceptions=True)

    def rescan(self) -> None:
        wanted = set(self._urls())
        for url in set(self._tasks) - wanted:
            self._tasks.pop(url).cancel()
            self.index.forget(url)
        for url in wanted - set(self._tasks):
            self._tasks[url] = asyncio.create_task(self._follow(url))

    async def _follow(self, url: str) -> None:
        found = endpoints(url, self.cfg)
        if found is None:
            return
        while True:
            try:
                await Follower(self, url, *found).run()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a broken engine must not stop the router's index
                log.warning("KV events failed", extra={"engine": url, "error": repr(exc)})
            self.index.drop(url)
            await asyncio.sleep(RECONNECT_S)


class Follower:
    """One engine's event stream, in sequence, with replays to fill gaps."""

    def __init__(self, events: KvEvents, url: str, pub: str, replay: str) -> None:
        self.events, self.url, self.pub, self.replay = events, url, pub, replay
        self.index = events.index
        self.last: int | None = None

    async def run(self) -> None:
        sub = self.events._ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(self.pub)
        try:
            await self._catch_up(0)
            while True:
                frames = await sub.recv_multipart()
                if len(frames) == 3:
                    await self._batch(int.from_bytes(frames[1], "big"), frames[2])
        finally:
            sub.close()

    async def _batch(self, seq: int, payload: bytes) -> None:
        if self.last is not None and seq <= self.last:
            if seq == 0 and self.last > 0:  # numbering restarted: a new engine life
                self._restart()
                self._apply(seq, payload)
            return
        if self.last is not None and seq > self.last + 1:
            self.events._metrics.kv_event_gaps.inc()
            await self._catch_up(self.last + 1)
            if self.last is not None and seq <= self.last:
                return
            if self.last is not None and seq > self.last + 1:  # the engine no longer has them
                self._restart()
        self._apply(seq, payload)

    def _apply(self, seq: int, payload: bytes) -> None:
        self.index.apply(self.url, msgpack.unpackb(payload, raw=False, strict_map_key=False))
        self.last = seq

    def _restart(self) -> None:
        """What the index knows of this engine can no longer be trusted: drop it."""
        self.events._metrics.kv_index_resyncs.inc()
        self.index.drop(self.url)
        self.last = None

    async def _catch_up(self, start: int) -> None:
        """Apply every batch from `start` the engine still keeps for replay."""
        dealer = self.events._ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect(self.replay)
        try:
            await dealer.send_multipart([b"", start.to_bytes(8, "big")])
            while True:
                frames = await asyncio.wait_for(dealer.recv_multipart(), REPLAY_TIMEOUT_S)
                if len(frames) < 4 or frames[2] == END_SEQ or frames[1] == b"":
                    return
                seq = int.from_bytes(frames[2], "big")
                if self.last is None and seq > start:  # the oldest ones are gone
                    self._restart()
                if self.last is None or seq == self.last + 1:
                    self._apply(seq, frames[3])
        except TimeoutError:
            return  # no replay socket (an older engine): what comes from now on
        finally:
            dealer.close()


def close() -> None:
    with contextlib.suppress(Exception):
        zmq.asyncio.Context.instance().term()
