"""Engine-side control of the decoder's retained KV blocks: release them early, or renew them.

Why: with bidirectional transfer, D pins the blocks of every finished request for a fixed
`decoder_kv_blocks_ttl` (480 s by default), reused or not, and vLLM offers no way to end or
extend that: a conversation the router knows is over, or a handle it will never offer again
(superseded, recomputed), still holds D's memory for the whole TTL; a conversation that is
merely slow loses its blocks at the TTL. The router knows which; this module gives it the
control, on D's own HTTP port (`/boomerang/v1/leases`, see `boomerang.connector.config`).

How, with two official vLLM extension points (both set by `config.engine_args` for both roles):
- `lease_api.LeaseControl`, an ASGI middleware (`--middleware`) in the API server: serves the
  routes with bearer-token auth (`BOOMERANG_LEASE_TOKEN`) and calls the workers through
  `engine_client.collective_rpc` (this module's `LeaseWorker`).
- `LeaseWorker`, methods mixed into vLLM's worker (`--worker-extension-cls`): they reach the
  NIXL connector worker (`get_kv_transfer_group().connector_worker`), whose `_reqs_to_send`
  maps D's engine request id (the handle's `remote_request_id`) to the blocks' perf_counter
  deadline. Renewing moves the deadline later. Releasing drops the entry and the per-request
  maps vLLM's own reap cleans, and hands the id to the reap of the next engine step (its
  `_reap_expired_send_leases`, wrapped once per worker instance), so the scheduler frees the
  blocks as if P had read them: vLLM's expired counter and warning stay for real expiries.
  The release reaches D's engine loop as an input, and the loop steps after every input, also
  while it otherwise waits between idle steps (`idle_loop`), so "next step" is at once.

The RPC runs on the worker's main thread between engine steps, where vLLM itself touches
these maps, so no lock is needed. Supported: the vLLM releases of `vllm_points.SUPPORTED_VLLM`
(run on the CPU build of 0.32, the others checked against their sources). A vLLM whose
internals differ is answered 501, never guessed at. The caller must own the handle: releasing
blocks that P is reading lets them be reused under the read (the router releases a handle only
after taking it out of its store).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, MutableMapping, Sequence
from typing import Any

from boomerang.connector.plugin.vllm_points import LEASE_WORKER, REAP, SUPPORTED_VLLM
from boomerang.facts import DECODER_BLOCKS_TTL_S

MAX_REQUEST_IDS = 4096
MAX_BODY_BYTES = 1 << 20
RPC_TIMEOUT_S = 10.0
DEFAULT_CEILING_S = float(DECODER_BLOCKS_TTL_S)
"""vLLM's default `decoder_kv_blocks_ttl`, the ceiling when the engine's config names none."""

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class LeaseError(Exception):
    """A request the lease API answers with an error status and the JSON error shape."""

    def __init__(self, status: int, message: str, kind: str) -> None:
        super().__init__(message)
        self.status, self.message, self.kind = status, message, kind

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.kind)


def error_body(message: str, kind: str) -> dict[str, Any]:
    """Every error of the lease API: `{"error": {"message": ..., "type": ...}}`."""
    return {"error": {"message": message, "type": kind}}


def bad_request(message: str) -> LeaseError:
    return LeaseError(400, message, "invalid_request_error")


def parse_request(raw: bytes, *, renew: bool) -> tuple[list[str], float | None]:
    """A release or renew body: the request ids (deduplicated, in order) and, for renew, the
    requested seconds (None when absent: renew to the ceiling). Raises a 400 `LeaseError`."""
    try:
        data = json.loads(raw) if raw else None
    except ValueError as exc:
        raise bad_request(f"body is not JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise bad_request("body must be a JSON object")
    ids = data.get("request_ids")
    if not isinstance(ids, list) or not all(isinstance(i, str) and i for i in ids):
        raise bad_request("request_ids must be a list of non-empty strings")
    if len(ids) > MAX_REQUEST_IDS:
        raise bad_request(f"at most {MAX_REQUEST_IDS} request_ids per call")
    seconds = data.get("seconds") if renew else None
    if seconds is not None:
        valid = isinstance(seconds, int | float) and not isinstance(seconds, bool)
        if not valid or not math.isfinite(seconds) or seconds <= 0:
            raise bad_request("seconds must be a positive number")
        seconds = float(seconds)
    return list(dict.fromkeys(ids)), seconds


def clamp_seconds(seconds: float | None, ceiling: float) -> float:
    """A renewal's length: within (0, ceiling]; None means the ceiling."""
    if seconds is None or seconds > ceiling:
        return ceiling
    return seconds


# --- worker side: the NIXL connector worker's internals (vllm_points.LEASE_WORKER) ---------

_RELEASED_ATTR = "_boomerang_released"
_REQUIRED = (*LEASE_WORKER.attributes, REAP.name.rsplit(".", 1)[-1])


def nixl_worker() -> Any | None:
    """This process's NIXL connector worker, or None when there is none to control."""
    try:
        from vllm.distributed.kv_transfer.kv_transfer_state import (
            get_kv_transfer_group,
            has_kv_transfer_group,
        )
    except ImportError:
        return None
    if not has_kv_transfer_group():
        return None
    return getattr(get_kv_transfer_group(), "connector_worker", None)


def missing_internals(worker: Any) -> list[str]:
    """What this module needs of the NIXL worker and `worker` lacks (empty: supported)."""
    if worker is None:
        return ["connector_worker"]
    missing = [name for name in _REQUIRED if not hasattr(worker, name)]
    if not missing and not isinstance(worker._reqs_to_send, dict):
        missing.append("_reqs_to_send as a dict")
    return missing


def _released_queue(worker: Any) -> set[str]:
    """The ids released since the last engine step; wraps the worker's reap once to hand
    them to `done_sending` (the scheduler then frees their blocks)."""
    queue: set[str] | None = getattr(worker, _RELEASED_ATTR, None)
    if queue is not None:
        return queue
    released: set[str] = set()
    reap = worker._reap_expired_send_leases

    def reap_and_release(done_sending: set[str]) -> None:
        if released:
            done_sending.update(released)
            released.clear()
        reap(done_sending)

    worker._reap_expired_send_leases = reap_and_release
    setattr(worker, _RELEASED_ATTR, released)
    return released


def release(worker: Any, request_ids: Iterable[str]) -> dict[str, Any]:
    """Drop the leases of `request_ids`; their blocks are freed on the next engine step."""
    queue = _released_queue(worker)
    released, unknown = [], []
    for req_id in request_ids:
        if worker._reqs_to_send.pop(req_id, None) is None:
            unknown.append(req_id)
            continue
        worker._reqs_to_process.discard(req_id)
        worker.consumer_notification_counts_by_req.pop(req_id, None)
        worker.expected_consumer_notifications_by_req.pop(req_id, None)
        queue.add(req_id)
        released.append(req_id)
    return {"released": released, "unknown": unknown}


ORIGINS = "_boomerang_lease_origins"
"""The worker attribute holding each renewed request's deadline before its first renewal."""


def renew(
    worker: Any,
    request_ids: Iterable[str],
    seconds: float,
    now: float | None = None,
    ceiling: float = DEFAULT_CEILING_S,
) -> dict[str, Any]:
    """Move the deadlines of `request_ids` to now + seconds (never earlier than they were),
    and never more than `ceiling` past the deadline vLLM gave the blocks: renewals repeated
    by one client cannot pin D's memory for ever, whatever router asks (at most two TTLs after
    the request finished, in all)."""
    now = time.perf_counter() if now is None else now
    sending = worker._reqs_to_send
    origins: dict[str, float] = getattr(worker, ORIGINS, None) or {}
    for gone in [r for r in origins if r not in sending]:  # released, read or expired
        del origins[gone]
    setattr(worker, ORIGINS, origins)
    renewed: dict[str, float] = {}
    unknown = []
    for req_id in request_ids:
        old = sending.get(req_id)
        if old is None:
            unknown.append(req_id)
            continue
        limit = origins.setdefault(req_id, old) + ceiling
        sending[req_id] = renewed[req_id] = max(old, min(now + seconds, limit))
    return {"renewed": renewed, "unknown": unknown}


def ceiling_of(worker: Any) -> float:
    """D's `decoder_kv_blocks_ttl`, the longest renewal."""
    try:
        kv = worker.vllm_config.kv_transfer_config
        return float(kv.get_from_extra_config("decoder_kv_blocks_ttl", DEFAULT_CEILING_S))
    except (AttributeError, TypeError, ValueError):
        return DEFAULT_CEILING_S


def _on_worker(call: Callable[[Any, float], dict[str, Any]]) -> dict[str, Any]:
    """Run `call(nixl worker, ceiling)` when this vLLM's internals are the supported ones."""
    worker: Any = nixl_worker()
    if missing := missing_internals(worker):
        return {"supported": False, "missing": missing}
    ceiling = ceiling_of(worker)
    return {"supported": True, "ceiling_s": ceiling, **call(worker, ceiling)}


class LeaseWorker:
    """vLLM worker extension (`--worker-extension-cls`): lease calls over `collective_rpc`.

    Names are prefixed: vLLM refuses an extension whose attributes the worker already has.
    Each returns plain data (it crosses a process boundary) with `supported` and `ceiling_s`.
    """

    def boomerang_lease_held(self) -> dict[str, Any]:
        return _on_worker(lambda worker, _ceiling: {"held": len(worker._reqs_to_send)})

    def boomerang_lease_release(self, request_ids: list[str]) -> dict[str, Any]:
        return _on_worker(lambda worker, _ceiling: release(worker, request_ids))

    def boomerang_lease_renew(
        self, request_ids: list[str], seconds: float | None
    ) -> dict[str, Any]:
        return _on_worker(
            lambda worker, ceiling: renew(
                worker, request_ids, clamp_seconds(seconds, ceiling), ceiling=ceiling
            )
        )


def merge(results: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One answer from every worker's (one per tensor-parallel rank; each holds its shard of
    the blocks): an id counts where any rank knew it; a renewed deadline is the earliest."""
    if not results:
        raise LeaseError(501, "the engine returned no worker results", "not_supported")
    for result in results:
        if not isinstance(result, Mapping) or not result.get("supported"):
            missing = result.get("missing") if isinstance(result, Mapping) else None
            raise LeaseError(
                501,
                f"this vLLM's NIXL worker is not a supported one (missing: {missing}); "
                f"supported vLLM: {', '.join(SUPPORTED_VLLM)}",
                "not_supported",
            )
    first = results[0]
    merged: dict[str, Any] = {"ceiling_s": first.get("ceiling_s", DEFAULT_CEILING_S)}
    if "held" in first:
        merged["held"] = max(int(r["held"]) for r in results)
    if "released" in first:
        released = list(dict.fromkeys(i for r in results for i in r["released"]))
        merged["released"] = released
        merged["unknown"] = [i for i in first["unknown"] if i not in set(released)]
    if "renewed" in first:
        renewed: dict[str, float] = {}
        for r in results:
            for req_id, deadline in r["renewed"].items():
                renewed[req_id] = min(deadline, renewed.get(req_id, deadline))
        merged["renewed"] = renewed
        merged["unknown"] = [i for i in first["unknown"] if i not in renewed]
    return merged
