"""Inside vLLM: an engine that only retains blocks waits for input instead of stepping.

Why and when: see `idle_policy.py`. This module is where the decision meets vLLM's engine loop
(`EngineCoreProc.run_busy_loop`: `_process_input_queue()`, then one step, repeated):

- `_process_input_queue` runs as vLLM wrote it first (inputs deferred by the last step, its own
  blocking wait when there is no work at all, the queued inputs), then, when the scheduler holds
  only finished requests kept for a later read and nothing came in since the last step, waits
  on the input queue for at most what is left of the idle period. An input that arrives is
  handled at once and vLLM drains the rest; then the loop steps once, unless the input needs
  no step, when the wait goes on for the rest of the period.
- `_handle_client_request` notes when the loop last handled an input (wherever vLLM handles it:
  before a step, during one, or in the wait above), so that input gets its step right away;
  a utility method that needs no step says so while it runs (`needs_no_step`: the lease API's
  reads of the retained state, polled every 2 s).

`has_work` is left alone: vLLM also asks it to decide a drain at shutdown and when a pause is
complete, and those keep vLLM's meaning. The wait is not inside vLLM's watchdog pause (0.33+);
keep `BOOMERANG_IDLE_STEP_S` below the watchdog's timeout (300 s by default) when it is on.
Every internal used is a checked point (`vllm_points.IDLE_LOOP`); any that cannot be read at
run time makes the loop step as vLLM would.
"""

from __future__ import annotations

import functools
import os
import queue
import time
from collections.abc import Callable, Mapping
from typing import Any

from boomerang.connector.plugin.idle_policy import LoopFacts, idle_step_s, idle_wait_s

_PATCHED = "__boomerang_idle__"
_LAST_STEP = "_boomerang_last_step"
_LAST_INPUT = "_boomerang_last_input"
_QUIET = "_boomerang_input_needs_no_step"
Clock = Callable[[], float]


def facts_of(core: Any) -> LoopFacts | None:
    """What the engine core holds (None when its layout is not the one checked)."""
    try:
        scheduler = core.scheduler
        requests = scheduler.requests
        connector = scheduler.connector
        busy = bool(scheduler.running)  # cheap first: a busy engine never waits
        unfinished = busy or any(not r.is_finished() for r in list(requests.values()))
        return LoopFacts(
            requests=len(requests),
            unfinished=int(unfinished),
            finished_unsent=len(scheduler.finished_req_ids),
            push_pending=connector is not None and bool(connector.has_pending_push_work()),
            other_connector=scheduler.ec_connector is not None,
            batches_in_flight=len(core.batch_queue or ()),
            engines_running=bool(core.engines_running),
            may_block=bool(core.process_input_queue_block) and bool(core.is_running()),
        )
    except (AttributeError, TypeError):
        return None


def wait_for_input(core: Any, seconds: float) -> bool:
    """Block on the engine's input queue for up to `seconds` and handle what arrives; False
    when the queue is not one this can wait on (the loop then steps, as vLLM's would)."""
    inputs = getattr(core, "input_queue", None)
    if not isinstance(inputs, queue.Queue):
        return False
    try:
        request = inputs.get(timeout=seconds)
    except queue.Empty:
        return True
    core._handle_client_request(*request)
    return True


def wrap_process_input_queue(original: Any, period: float, clock: Clock = time.monotonic) -> Any:
    """`EngineCoreProc._process_input_queue`, then the idle wait (see the module)."""

    @functools.wraps(original)
    def _process_input_queue(self: Any) -> None:
        original(self)
        last_step = getattr(self, _LAST_STEP, 0.0)
        while (
            wait := idle_wait_s(
                facts_of(self), last_step, getattr(self, _LAST_INPUT, 0.0), clock(), period
            )
        ) > 0 and wait_for_input(self, wait):
            original(self)  # what came in with it; the work is there, so vLLM does not block
        setattr(self, _LAST_STEP, clock())  # the loop steps next

    setattr(_process_input_queue, _PATCHED, True)
    return _process_input_queue


def needs_no_step(core: Any) -> None:
    """Called by a utility method while it runs on the engine core: this call need not wake the
    loop for a step (it reads state, or books what no step acts on). Without it every input
    wakes the loop: the lease API polls the retained state every 2 s, and a step each time
    would keep the worker in its spin window (measured: 0.35-0.48 of a core)."""
    setattr(core, _QUIET, True)


def wrap_handle_client_request(original: Any, clock: Clock = time.monotonic) -> Any:
    """`EngineCoreProc._handle_client_request`, noting when an input was handled that needs a
    step (every input but the utility calls that say they need none)."""

    @functools.wraps(original)
    def _handle_client_request(self: Any, request_type: Any, request: Any) -> Any:
        setattr(self, _QUIET, False)
        try:
            return original(self, request_type, request)
        finally:
            if not getattr(self, _QUIET, False):
                setattr(self, _LAST_INPUT, clock())

    setattr(_handle_client_request, _PATCHED, True)
    return _handle_client_request


def apply(env: Mapping[str, str] | None = None) -> float:
    """Install the idle wait in this process (idempotent); the idle period, 0 when off."""
    period = idle_step_s(os.environ if env is None else env)
    if period == 0:
        return 0.0
    try:
        from vllm.v1.engine.core import EngineCoreProc
    except ImportError:
        return 0.0
    current = EngineCoreProc._process_input_queue
    if not getattr(current, _PATCHED, False):
        EngineCoreProc._process_input_queue = wrap_process_input_queue(current, period)
    handle = EngineCoreProc._handle_client_request
    if not getattr(handle, _PATCHED, False):
        EngineCoreProc._handle_client_request = wrap_handle_client_request(handle)
    return period
