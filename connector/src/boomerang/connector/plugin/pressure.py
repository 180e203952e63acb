"""Inside vLLM: retained leases yield to live work, and a router claims a lease before P reads it.

Why: see `retained.py` (the bookkeeping and the choice). This module is where they meet vLLM
0.32's internals, in the process that owns each piece:

- the engine core's scheduler: the NIXL connector scheduler's `request_finished` records each
  lease D keeps (`RetainedBook.retained`); the KV cache manager's `allocate_slots`, wrapped per
  scheduler, notes how many blocks a request lacked when it could not get them; after each
  `Scheduler.schedule` the book picks the leases that yield and names them on the step's
  connector metadata (`boomerang_release`), which every worker receives with the step;
- every worker: after the NIXL worker's `start_load_kv` has read the step's metadata, the named
  leases are released exactly as the router's own releases are (`leases.release`): dropped
  from the worker's send map and reported finished with the step, so the scheduler frees their
  blocks when it processes the step's output (a step or two later; later steps count blocks
  already on their way and release no more for them);
- the engine core itself: a utility method, `boomerang_retained(op, ...)`, that the API
  server's lease routes call (`claim`, `unclaim`, `hint`, `yield`, `state`) through vLLM's own
  utility channel, so claims and the choice live in one thread (the engine core's loop) and
  need no lock, whatever the tensor-parallel size.

It runs only where a router can claim: the engine's lease API must be on (its token set),
else a router could not claim and a released lease might be read. The API server publishes the
`pressure` capability on `/metrics` when it is; a router then claims before every pull.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from typing import Any

from boomerang.connector.plugin import idle_loop, leases
from boomerang.connector.plugin.retained import RetainedBook, blocks_for
from boomerang.facts.engine import LEASE_TOKEN_ENV

log = logging.getLogger("boomerang.connector.plugin.pressure")

RELEASE_ATTR = "boomerang_release"
"""The step's connector metadata names the leases that yield under this attribute."""
UTILITY = "boomerang_retained"
"""The engine core method the API server calls (vLLM's utility channel)."""
_BOOK = "_boomerang_retained"
_FAILURES = "_boomerang_alloc_failures"
_PATCHED = "__boomerang_pressure__"
STALE_RELEASE_S = 10.0
"""A lease chosen to yield whose blocks are still not freed after this long no longer counts as
coming free (its release was lost), so it cannot hold back the next release."""


def enabled(env: Any = None) -> bool:
    """Whether leases may yield: only where routers can claim (the lease API is on)."""
    return bool((os.environ if env is None else env).get(LEASE_TOKEN_ENV, "").strip())


def book_of(owner: Any) -> RetainedBook:
    """The book kept on the connector scheduler (one per engine)."""
    book: RetainedBook | None = getattr(owner, _BOOK, None)
    if book is None:
        book = RetainedBook()
        setattr(owner, _BOOK, book)
    return book


# --- the connector scheduler: which finished requests D retains ------------------------------


def wrap_request_finished(original: Any) -> Any:
    """`request_finished`, recording a lease when D keeps a request's blocks for a read."""

    @functools.wraps(original)
    def request_finished(self: Any, request: Any, block_ids: Any) -> Any:
        delayed, params = original(self, request, block_ids)
        if delayed and params and params.get("do_remote_decode"):  # D keeps them for P
            now = time.perf_counter()
            deadline = params.get("remote_blocks_expiry_time") or now
            book_of(self).retained(request.request_id, now, float(deadline))
        return delayed, params

    setattr(request_finished, _PATCHED, True)
    return request_finished


# --- the scheduler: a request that could not get blocks, and the leases that yield -----------


def _held(manager: Any, request_id: str) -> list[int]:
    """The distinct block ids a request holds (all KV cache groups); [] when none."""
    try:
        groups = manager.get_block_ids(request_id)
    except (KeyError, AssertionError, AttributeError, IndexError):
        return []
    return list(dict.fromkeys(b for group in groups for b in group if b))


def _freeable(manager: Any, request_id: str) -> int:
    """Blocks a release frees: those no other request shares (reference count 1)."""
    pool = manager.block_pool.blocks
    return sum(1 for b in _held(manager, request_id) if pool[b].ref_cnt == 1)


def _needed(manager: Any, block_size: int, request: Any, kwargs: dict[str, Any]) -> int:
    """How many free blocks `request` needed to be admitted, those kept for transfers under
    way included (an upper bound: prefix-cache hits are not subtracted, so a little more may
    yield than strictly needed)."""
    tokens = request.num_tokens + int(kwargs.get("num_lookahead_tokens") or 0)
    need = blocks_for(tokens, block_size) - len(_held(manager, request.request_id))
    need = max(1, need) + int(getattr(manager, "watermark_blocks", 0) or 0)
    return need + int(kwargs.get("reserved_blocks") or 0)


def _probe_allocations(scheduler: Any) -> list[int]:
    """This scheduler's list of what refused requests needed in the current step (installs
    the probe once)."""
    failures: list[int] | None = getattr(scheduler, _FAILURES, None)
    if failures is not None:
        return failures
    failures = []
    setattr(scheduler, _FAILURES, failures)
    manager = scheduler.kv_cache_manager
    allocate = manager.allocate_slots
    block_size = int(scheduler.block_size)

    @functools.wraps(allocate)
    def allocate_slots(request: Any, *args: Any, **kwargs: Any) -> Any:
        blocks = allocate(request, *args, **kwargs)
        if blocks is None:
            failures.append(_needed(manager, block_size, request, kwargs))
        return blocks

    manager.allocate_slots = allocate_slots
    return failures


def connector_scheduler(scheduler: Any) -> Any | None:
    return getattr(getattr(scheduler, "connector", None), "connector_scheduler", None)


def relieve(scheduler: Any, output: Any, missing: int) -> list[str]:
    """Choose the leases that yield for `missing` blocks and name them on the step's metadata."""
    owner = connector_scheduler(scheduler)
    metadata = getattr(output, "kv_connector_metadata", None)
    if owner is None or metadata is None or missing <= 0:
        return []
    book = book_of(owner)
    _prune(book, scheduler)
    manager = scheduler.kv_cache_manager
    ids = book.yielding(missing, lambda rid: _freeable(manager, rid), time.perf_counter())
    if ids:
        _name(output, ids)
        log.info(
            "boomerang: %d retained lease(s) yield to live work (%d blocks missing)",
            len(ids),
            missing,
        )
    return ids


def _name(output: Any, ids: list[str]) -> None:
    """Name `ids` on the step's metadata: every worker releases them with the step."""
    metadata = output.kv_connector_metadata
    setattr(metadata, RELEASE_ATTR, [*getattr(metadata, RELEASE_ATTR, ()), *ids])


def _prune(book: RetainedBook, scheduler: Any) -> None:
    requests = scheduler.requests
    book.prune(lambda rid: rid in requests)
    cutoff = time.perf_counter() - STALE_RELEASE_S
    for lease in book.leases.values():
        if lease.releasing and lease.released_at < cutoff:
            lease.releasing = False  # its release was lost: it may be chosen again


def headroom(running: int, free: int, needed: int) -> int:
    """Blocks to free so that the next step needs no preemption: every running request may need
    a new block in a step (a decode crosses a block boundary), and a request that could not be
    admitted needed `needed` free blocks (pure)."""
    return max(0, running + needed - free)


def wrap_schedule(original: Any) -> Any:
    """`Scheduler.schedule`, then the release of what live work will need: what a failed
    allocation lacked, and the headroom that keeps the running requests from being preempted
    (a release frees its blocks a step later, and vLLM preempts a running request the moment
    it cannot extend it: preempted, it computes its whole context again)."""

    @functools.wraps(original)
    def schedule(self: Any, *args: Any, **kwargs: Any) -> Any:
        failures = _probe_allocations(self)
        failures.clear()
        output = original(self, *args, **kwargs)
        free = self.kv_cache_manager.block_pool.get_num_free_blocks()
        missing = headroom(len(self.running), free, max(failures, default=0))
        if missing:
            relieve(self, output, missing)
        owner = connector_scheduler(self)
        if owner is not None and (queued := book_of(owner).take_queued()):
            _name(output, queued)
        return output

    setattr(schedule, _PATCHED, True)
    return schedule


# --- the workers: release what the step's metadata names -------------------------------------


def wrap_start_load_kv(original: Any) -> Any:
    """The NIXL worker's `start_load_kv`, then the releases the scheduler chose."""

    @functools.wraps(original)
    def start_load_kv(self: Any, metadata: Any) -> Any:
        result = original(self, metadata)
        ids = getattr(metadata, RELEASE_ATTR, None)
        if ids:
            leases.release(self, ids)
        return result

    setattr(start_load_kv, _PATCHED, True)
    return start_load_kv


# --- the engine core: claims and state, called by the API server ----------------------------


def retained_utility(self: Any, op: str, request_ids: Any = None, seconds: Any = None) -> Any:
    """`EngineCore.boomerang_retained`: claim, unclaim, hint (renewed for `seconds`), state."""
    scheduler = self.scheduler
    owner = connector_scheduler(scheduler)
    if owner is None:
        return {"supported": False}
    book = book_of(owner)
    _prune(book, scheduler)
    ids = [str(r) for r in request_ids or ()]
    if op != "yield":  # only a yield is acted on by the next step (it names the leases)
        idle_loop.needs_no_step(self)
    if op == "claim":
        return {"supported": True, **book.claim(ids)}
    if op == "unclaim":
        return {"supported": True, "unclaimed": book.unclaim(ids)}
    if op == "yield":
        return {"supported": True, "yielded": book.yield_unclaimed(time.perf_counter())}
    if op == "hint":
        now = time.perf_counter()
        book.hint({rid: now + float(seconds) for rid in ids})
        return {"supported": True}
    manager = scheduler.kv_cache_manager
    return {"supported": True, **book.state(lambda rid: len(_held(manager, rid)))}


# --- installation ------------------------------------------------------------------------------


def _targets() -> dict[str, Any] | None:
    try:
        from vllm.distributed.kv_transfer.kv_connector.v1.nixl import pull_scheduler, pull_worker
        from vllm.v1.core.sched.scheduler import Scheduler
        from vllm.v1.engine.core import EngineCore
    except ImportError:
        return None
    found = {
        "request_finished": getattr(pull_scheduler, "NixlPullConnectorScheduler", None),
        "start_load_kv": getattr(pull_worker, "NixlPullConnectorWorker", None),
        "schedule": Scheduler,
        "engine_core": EngineCore,
    }
    for name in ("request_finished", "start_load_kv", "schedule"):
        if getattr(found[name], name, None) is None:
            return None
    return found


def supported() -> bool:
    """Whether this vLLM has every internal the hooks need."""
    return _targets() is not None


def apply(env: Any = None) -> bool:
    """Install the hooks in this process (idempotent); False when off or unsupported."""
    if not enabled(env):
        return False
    found = _targets()
    if found is None:
        return False
    for name, wrap in (
        ("request_finished", wrap_request_finished),
        ("start_load_kv", wrap_start_load_kv),
        ("schedule", wrap_schedule),
    ):
        cls = found[name]
        method = getattr(cls, name)
        if not getattr(method, _PATCHED, False):
            setattr(cls, name, wrap(method))
    setattr(found["engine_core"], UTILITY, retained_utility)
    return True
