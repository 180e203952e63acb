"""The aiohttp application: routes, middlewares and the lifecycle of everything a router holds.

`create_app(config)` is the only way in: no module globals, one engine client per app,
resources (store, session, discovery watchers, health prober, expiry sweeper, API keys poller,
tuning reload, the retention sweeper and its lease client) opened and closed in `cleanup_ctx`,
state under typed `AppKey`s. Besides the OpenAI endpoints: `GET /boomerang/v1/state` (what is
in force: mode, break-even, paths, retention; no API key, like `/metrics`), and, under the
API key and scoped to its tenant, `DELETE /boomerang/v1/conversations/{id}` (end it: D's
blocks are released now) and `POST /boomerang/v1/conversations/{id}/renew` (keep it longer:
D's lease is renewed up to its ceiling), both in either tuning mode. The completion endpoints take
an in-flight slot (`admission.py`) after authentication and before the body is read. Tests
and the local runtime start it in-process; `boomerang-router` runs it with `web.run_app` (with
handler cancellation on, so a client disconnect cancels the upstream calls).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import time
from collections.abc import AsyncIterator
from functools import partial
from typing import Any

import aiohttp
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from boomerang.facts import state as router_state
from boomerang.router import apis, auth, logs
from boomerang.router import conversation as conv
from boomerang.router.admission import InflightLimit, Overloaded
from boomerang.router.apis import hints, sessions
from boomerang.router.apis.validation import ClientRequest, Kind, check_model, parse_json
from boomerang.router.config import EndpointSource, RouterConfig
from boomerang.router.engines import failover
from boomerang.router.engines.discovery import SliceWatcher, api_access
from boomerang.router.engines.endpoints import LeastWorkAffinity, Pool, Strategy
from boomerang.router.engines.health import probe_all, run_prober
from boomerang.router.engines.idle_probe import run_idle_probes
from boomerang.router.engines.kvevents import Index, KvEvents
from boomerang.router.engines.upstream import (
    EngineClient,
    UpstreamError,
    get_json,
    post_json,
    timeout,
)
from boomerang.router.errors import ApiError
from boomerang.router.metrics import Metrics
from boomerang.router.retention.claims import Claims
from boomerang.router.retention.leases import LeaseClient, LeaseFailure, Retention
from boomerang.router.store import ConversationStore, MemoryStore
from boomerang.router.tuning import TuningReload
from boomerang.router.turn import degraded
from boomerang.router.turn.decode import ClientGone
from boomerang.router.turn.flow import Router

log = logging.getLogger("boomerang.router")

CONFIG = web.AppKey("config", RouterConfig)
METRICS = web.AppKey("metrics", Metrics)
ROUTER = web.AppKey("router", Router)
RETENTION = web.AppKey("retention", Retention)
KEYS = web.AppKey("api_keys", auth.KeyFile)
INFLIGHT = web.AppKey("inflight", InflightLimit)
REQUEST_ID = web.RequestKey("request_id", str)
API = "/boomerang/v1"


def create_app(
    config: RouterConfig,
    *,
    strategy: Strategy | None = None,
    store: ConversationStore | None = None,
) -> web.Application:
    """The router application for `config` (a strategy or store may be injected)."""
    app = web.Application(client_max_size=config.max_request_bytes, middlewares=[_request_context])
    app[CONFIG] = config
    app[METRICS] = Metrics()
    app[INFLIGHT] = InflightLimit(config.max_inflight, config.overload_retry_after_s)
    app[METRICS].inflight.set_function(lambda: app[INFLIGHT].current)
    if config.api_keys_file:
        app[KEYS] = auth.KeyFile(config.api_keys_file)
    app.cleanup_ctx.append(_lifecycle(strategy, store))
    app.on_response_prepare.append(_add_request_id)
    app.router.add_post("/v1/chat/completions", _completions("chat"))
    app.router.add_post("/v1/completions", _completions("completion"))
    app.router.add_post("/v1/responses", _completions("responses"))
    app.router.add_post("/v1/messages", _completions("messages"))
    app.router.add_route("*", "/v1/responses/{rest:.*}", _stored_responses)
    app.router.add_post("/v1/messages/count_tokens", _count_tokens)
    app.router.add_get("/v1/models", _models)
    app.router.add_get("/health", _health)
    app.router.add_get("/ready", _ready)
    app.router.add_get("/metrics", _metrics)
    app.router.add_get(router_state.PATH, _state)
    app.router.add_delete(f"{API}/conversations/{{conversation_id}}", _end_conversation)
    app.router.add_post(f"{API}/conversations/{{conversation_id}}/renew", _renew_conversation)
    return app


def _make_store(config: RouterConfig) -> ConversationStore:
    if config.store.kind == "redis":
        from boomerang.router.redis_store import RedisStore

        assert config.store.url is not None
        return RedisStore(config.store.url, config.store.key_prefix)
    return MemoryStore(config.store.max_conversations)


def _static_or_watch(
    source: EndpointSource, pool: Pool, session: aiohttp.ClientSession
) -> asyncio.Task[None] | None:
    if source.urls is not None:
        pool.set_urls(source.urls)
        return None
    assert source.kubernetes is not None
    watcher = SliceWatcher(source.kubernetes, api_access(), pool.set_urls)
    return asyncio.create_task(watcher.run(session))


def _lifecycle(strategy: Strategy | None, store: ConversationStore | None) -> Any:
    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        config, metrics = app[CONFIG], app[METRICS]
        h = config.health
        pools = [
            Pool("prefill", h.eject_after_failures, h.readmit_after_successes),
            Pool("decode", h.eject_after_failures, h.readmit_after_successes),
        ]
        headers = {}
        if config.engine_api_key:
            headers["Authorization"] = f"Bearer {config.engine_api_key}"
        engines = EngineClient(headers)
        session = aiohttp.ClientSession()  # the Kubernetes API (EndpointSlice watches)
        the_store = store or _make_store(config)
        leases = LeaseClient(config)
        claims = Claims(leases, metrics)
        index = Index(config.kv_events.hash_seed, metrics) if config.kv_events.enabled else None
        p_holds = partial(_prefill_holds, index, pools[0]) if index is not None else None
        retention = app[RETENTION] = Retention(
            config,
            the_store,
            leases,
            metrics,
            decoders=partial(_kv_blocks, pools[1]),
            p_holds=p_holds,
        )
        app[ROUTER] = Router(
            config,
            pools[0],
            pools[1],
            strategy or LeastWorkAffinity(config.decode_affinity_slack),
            the_store,
            metrics,
            engines,
            retention=retention,
            claims=claims,
            kv=index,
        )
        tasks = _watchers(config, pools, session)
        await probe_all(engines, pools, config, metrics)
        tasks += _background(app, engines, pools, the_store)
        if index is not None:
            urls = partial(_engine_urls, pools)
            tasks.append(
                asyncio.create_task(KvEvents(config.kv_events, index, urls, metrics).run())
            )
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await retention.close()
            await claims.close()
            await leases.close()
            await the_store.close()
            await session.close()
            await engines.close()

    return lifecycle


def _engine_urls(pools: list[Pool]) -> list[str]:
    """Every engine the pools list (whose KV events the index follows)."""
    return [url for pool in pools for url in pool.endpoints]


def _kv_blocks(decode: Pool) -> dict[str, int | None]:
    """Each decode engine's KV cache size in blocks, as its `/metrics` said."""
    return {ep.url: ep.kv_blocks for ep in decode.endpoints.values()}


def _prefill_holds(index: Index, prefill: Pool, block: int) -> bool:
    """Whether a prefill engine holds the block named `block` (the KV index's view)."""
    return index.holds(block, prefill.endpoints)


def _watchers(
    config: RouterConfig, pools: list[Pool], session: aiohttp.ClientSession
) -> list[asyncio.Task[None]]:
    sources = ((config.prefill, pools[0]), (config.decode, pools[1]))
    return [t for src, pool in sources if (t := _static_or_watch(src, pool, session))]


def _background(
    app: web.Application, engines: EngineClient, pools: list[Pool], store: ConversationStore
) -> list[asyncio.Task[None]]:
    """The loops that run for the app's lifetime: probes (health, and an idle decoder's
    TPOT for the cost model), store sweeps, key and tuning reloads, retention."""
    config, metrics = app[CONFIG], app[METRICS]
    jobs = [
        run_prober(engines, pools, config, metrics),
        _sweeper(store, config, metrics),
        TuningReload(config, metrics).run(),
        app[RETENTION].run(),
    ]
    if config.health.idle_probe:
        paths = app[ROUTER].paths  # its model is looked up at each probe: tests replace it
        jobs.append(
            run_idle_probes(engines, pools, config, lambda t: paths.model.observe_idle_tpot(t))
        )
    if KEYS in app:
        jobs.append(_key_poller(app[KEYS], config.api_keys_poll_s, metrics))
    return [asyncio.create_task(job) for job in jobs]


async def _sweeper(store: ConversationStore, config: RouterConfig, metrics: Metrics) -> None:
    while True:
        await asyncio.sleep(config.store.sweep_interval_s)
        store.sweep(time.time())
        size = await store.size()
        if size is not None:
            metrics.stored_conversations.set(size)


async def _key_poller(keys: auth.KeyFile, interval_s: float, metrics: Metrics) -> None:
    while True:
        await asyncio.sleep(interval_s)
        changed = keys.refresh()
        if changed is not None:
            metrics.api_key_reloads.labels("ok" if changed else "error").inc()


@web.middleware
async def _request_context(request: web.Request, handler: Any) -> web.StreamResponse:
    """Request id for logs and the response; ApiError -> OpenAI-style error body."""
    rid = logs.new_request_id(request.headers.get("X-Request-Id"))
    request[REQUEST_ID] = rid
    token = logs.request_id.set(rid)
    try:
        try:
            response: web.StreamResponse = await handler(request)
        except ApiError as exc:
            response = exc.response()
        except web.HTTPException as exc:
            response = ApiError(exc.status, exc.reason).response()
        except Exception:
            log.exception("Unhandled error")
            response = ApiError(500, "internal router error").response()
        return response
    finally:
        logs.request_id.reset(token)


async def _add_request_id(request: web.Request, response: web.StreamResponse) -> None:
    rid = request.get(REQUEST_ID)
    if rid:
        response.headers["X-Request-Id"] = rid


def _tenant(request: web.Request) -> str:
    key_file = request.app.get(KEYS)
    keys = key_file.keys if key_file is not None else None
    header = request.app[CONFIG].tenant_header
    gateway = request.headers.get(header) if header else None
    tenant: str = auth.tenant_of(request.headers.get("Authorization"), keys, gateway)
    return tenant


async def _read_body(request: web.Request, limit: int) -> bytes:
    if request.content_length is not None and request.content_length > limit:
        raise ApiError(413, f"request body exceeds {limit} bytes")
    try:
        return await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise ApiError(413, f"request body exceeds {limit} bytes") from None


def _completions(kind: Kind) -> Any:
    api = apis.of(kind)

    async def handler(request: web.Request) -> web.StreamResponse:
        config, metrics = request.app[CONFIG], request.app[METRICS]
        outcome = "error"
        try:
            tenant = _tenant(request)
            with request.app[INFLIGHT].slot():
                data = parse_json(await _read_body(request, config.max_request_bytes))
                req = _client_request(kind, data, request, metrics)
                check_model(req.model, config.model)
                router = request.app[ROUTER]
                response: web.StreamResponse = await router.handle(request, req, tenant)
            outcome = "ok"
            return response
        except Overloaded as exc:
            outcome = "overloaded"
            return _error_response(api, exc)
        except ApiError as exc:
            outcome = "client_error" if exc.status < 500 else "unavailable"
            return _error_response(api, exc)
        except (ClientGone, asyncio.CancelledError):
            outcome = "cancelled"
            raise
        finally:
            metrics.requests.labels(outcome).inc()

    return handler


def _client_request(
    kind: Kind, data: dict[str, Any], request: web.Request, metrics: Metrics
) -> ClientRequest:
    """The body checked the API's way, with what names the conversation (`sessions.py`) and the
    client's retention hint, capped (`hints.py`); a hint over the cap is counted and logged,
    never refused."""
    config = request.app[CONFIG]
    req = apis.validate(kind, data, request.headers.get("X-Conversation-Id"))
    names = config.session_headers
    session = sessions.identify(req.conversation_id, request.headers, names, data)
    asked = hints.asked_s(kind, data)
    cap = config.tuning.retention_max_client_s
    retention = hints.cap(asked, cap, config.decoder_blocks_ttl_s)
    if retention is not None:
        metrics.retention_hint.observe(retention.asked_s)
        if retention.capped:
            metrics.retention_hints_capped.inc()
            log.info(
                "Capped retention hint",
                extra={"asked_s": retention.asked_s, "applied_s": retention.applied_s},
            )
    return dataclasses.replace(req, session=session, retention=retention)


def _error_response(api: apis.Api, exc: ApiError) -> web.Response:
    """`exc` in the API's own error shape."""
    return web.json_response(api.error_body(exc), status=exc.status, headers=exc.headers or None)


async def _stored_responses(request: web.Request) -> web.StreamResponse:
    """`/v1/responses/...` (retrieve, cancel, delete, input items, ...): the router stores no
    response, so none of them can be served."""
    _tenant(request)
    raise ApiError(
        404,
        f"`{request.method} {request.path}` is not served: this router keeps no responses "
        "and serves stateless `POST /v1/responses` only (`store: false`, the whole "
        "conversation in `input`)",
    )


async def _count_tokens(request: web.Request) -> web.StreamResponse:
    """Anthropic's token count: stateless, answered by one engine (P first) as it would
    render the request; errors in Anthropic's shape."""
    api = apis.of("messages")
    config = request.app[CONFIG]
    try:
        _tenant(request)
        data = parse_json(await _read_body(request, config.max_request_bytes))
        check_model(data.get("model") if isinstance(data.get("model"), str) else None, config.model)
        router = request.app[ROUTER]
        t = config.timeouts
        limit = timeout(t.tokenize_s, t.connect_s)
        last: UpstreamError | None = None
        for ep in [*router.prefill.candidates(), *router.decode.candidates()]:
            try:
                answer = await post_json(router.engines, ep.url + request.path, data, limit, None)
            except UpstreamError as exc:
                if not exc.retryable:
                    raise failover.client_error(exc) from None
                last = exc
                continue
            return web.json_response(answer)
        raise failover.unavailable("prefill", last)
    except ApiError as exc:
        return _error_response(api, exc)


async def _models(request: web.Request) -> web.StreamResponse:
    _tenant(request)
    router = request.app[ROUTER]
    t = request.app[CONFIG].timeouts
    for pool in (router.decode, router.prefill):
        for ep in pool.candidates():
            try:
                data = await get_json(
                    router.engines, ep.url + "/v1/models", timeout(t.probe_s, t.connect_s)
                )
            except UpstreamError:
                continue
            return web.json_response(data)
    raise ApiError(503, "no engine answered /v1/models")


async def _health(request: web.Request) -> web.StreamResponse:
    return web.json_response({"status": "ok"})


async def _ready(request: web.Request) -> web.StreamResponse:
    router = request.app[ROUTER]
    p, d = router.prefill.ready_count(), router.decode.ready_count()
    ready = degraded.serving(p, d, fallback=router.config.single_engine_fallback)
    body = {"ready": ready, "prefill": p, "decode": d, "alone": ready and not (p and d)}
    return web.json_response(body, status=200 if ready else 503)


async def _metrics(request: web.Request) -> web.StreamResponse:
    if (router := request.app.get(ROUTER)) is not None:
        router.paths.refresh()  # the learned values, as of this scrape
    body = generate_latest(request.app[METRICS].registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def _state(request: web.Request) -> web.StreamResponse:
    """What is in force: mode, break-even, paths taken, coefficients, retention."""
    return web.json_response(request.app[ROUTER].state())


def _conversation(request: web.Request) -> tuple[bytes, str]:
    """The store key of the client-named conversation in the path, in the caller's tenant."""
    tenant = _tenant(request)
    return conv.id_key(tenant, request.match_info["conversation_id"]), tenant


async def _end_conversation(request: web.Request) -> web.StreamResponse:
    """The client ended the conversation: forget its handle, free D's blocks now. 404: the
    router holds no handle for it (never had one, already ended, taken by a turn, expired)."""
    key, _ = _conversation(request)
    if not await request.app[RETENTION].end(key):
        raise ApiError(404, "no retained KV for this conversation")
    return web.Response(status=204)


async def _renew_conversation(request: web.Request) -> web.StreamResponse:
    """Keep the conversation's KV longer: renew D's lease (up to D's ceiling, the decoder
    TTL) and offer the handle until the new deadline; 200 `{"expires_in_s": ...}`."""
    key, tenant = _conversation(request)
    seconds = _renew_seconds(await _read_body(request, 4096))
    try:
        renewed = await request.app[RETENTION].renew(key, tenant, seconds)
    except LeaseFailure:
        raise ApiError(502, "the decode engine did not renew the lease") from None
    if renewed is None:
        raise ApiError(404, "no retained KV for this conversation")
    return web.json_response({"expires_in_s": round(renewed.expires_in_s, 3)})


def _renew_seconds(raw: bytes) -> float | None:
    """The optional `{"seconds": s}` of a renewal (None: as long as D allows)."""
    if not raw.strip():
        return None
    seconds = parse_json(raw).get("seconds")
    if seconds is None:
        return None
    number = isinstance(seconds, int | float) and not isinstance(seconds, bool)
    if not number or not math.isfinite(seconds) or seconds <= 0:
        raise ApiError(400, "seconds must be a positive number", param="seconds")
    return float(seconds)
