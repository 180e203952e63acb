"""Pure parts: configuration, verification, fingerprints, SSE, discovery, capability choice."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from pydantic import ValidationError

from boomerang.router import conversation as conv
from boomerang.router.__main__ import cli_overrides, parse_args
from boomerang.router.apis import sse
from boomerang.router.config import RouterConfig
from boomerang.router.engines.capabilities import decode_mode, version_tuple
from boomerang.router.engines.discovery import SliceWatcher, ready_urls
from boomerang.router.engines.endpoints import Endpoint, LeastWorkAffinity, Pool

STATIC = {"prefill": {"urls": ["http://127.0.0.1:1"]}, "decode": {"urls": ["http://127.0.0.1:2"]}}


def test_handle_ttl_defaults_below_decoder_ttl_with_margin() -> None:
    cfg = RouterConfig.model_validate(STATIC)
    assert cfg.effective_handle_ttl_s < cfg.decoder_blocks_ttl_s - 5


def test_handle_ttl_not_below_decoder_ttl_minus_5s_is_rejected() -> None:
    with pytest.raises(ValidationError, match="strictly below"):
        RouterConfig.model_validate({**STATIC, "decoder_blocks_ttl_s": 60, "handle_ttl_s": 55})


def test_endpoint_source_needs_exactly_one_of_urls_or_kubernetes() -> None:
    with pytest.raises(ValidationError, match="exactly one"):
        RouterConfig.model_validate({**STATIC, "decode": {}})
    both = {"urls": ["http://x"], "kubernetes": {"namespace": "n", "service": "s"}}
    with pytest.raises(ValidationError, match="exactly one"):
        RouterConfig.model_validate({**STATIC, "decode": both})


def test_every_config_field_is_described() -> None:
    def walk(model: Any) -> None:
        for name, field in model.model_fields.items():
            assert field.description, f"{model.__name__}.{name}"
            ann = field.annotation
            for sub in getattr(ann, "__args__", (ann,)):
                if hasattr(sub, "model_fields"):
                    walk(sub)

    walk(RouterConfig)


def test_file_then_env_then_flags(tmp_path: Any) -> None:
    path = tmp_path / "router.yaml"
    cfg = RouterConfig.model_validate(
        {**STATIC, "store": {"kind": "redis", "url": "redis://file"}, "listen_port": 1}
    )
    path.write_text(json.dumps(cfg.model_dump(mode="json", exclude_none=True)))
    env = {"BOOMERANG_REDIS_URL": "redis://env", "BOOMERANG_ROUTER_LISTEN_PORT": "2"}
    args = parse_args(["--port", "3", "--decode", "http://d1:8000", "--decode", "http://d2:8000"])
    loaded = RouterConfig.load(path, env=env, overrides=cli_overrides(args))
    assert loaded.store.url == "redis://env"
    assert loaded.listen_port == 3
    assert loaded.decode.urls == ["http://d1:8000", "http://d2:8000"]
    assert loaded.prefill.urls == ["http://127.0.0.1:1"]


def test_recompute_threshold_comes_from_the_file_env_or_flag() -> None:
    assert RouterConfig.model_validate(STATIC).recompute_threshold == 64  # vLLM's default
    env = {"BOOMERANG_ROUTER_RECOMPUTE_THRESHOLD": "128"}
    assert RouterConfig.load(env=env, overrides=STATIC).recompute_threshold == 128
    flags = cli_overrides(parse_args(["--recompute-threshold", "256"]))
    assert RouterConfig.load(env=env, overrides={**STATIC, **flags}).recompute_threshold == 256
    with pytest.raises(ValidationError):
        RouterConfig.model_validate({**STATIC, "recompute_threshold": -1})


def test_an_ejected_decoder_must_report_its_block_size_again() -> None:
    pool = Pool("decode", eject_after=1)
    pool.set_urls(["http://d"])
    d = pool.endpoints["http://d"]
    d.block_size = 128
    pool.failed(d)
    assert d.ejected and d.block_size is None  # it may come back configured differently


def test_verification_needs_a_strict_extension_of_the_held_tokens() -> None:
    held = [1, 2, 3, 4, 5]
    params = {"remote_num_tokens": 4, "do_remote_decode": True, "remote_block_ids": [[0]]}
    h = conv.build_handle(params, held, "http://d", 0.0)
    assert h is not None
    assert h.matches([1, 2, 3, 4, 9])
    assert not h.matches([1, 2, 3, 4])  # nothing left to compute
    assert not h.matches([1, 2, 3, 5, 9])
    assert not h.matches([0, 1, 2, 3, 4, 9])
    assert conv.build_handle(params, [1, 2], "http://d", 0.0) is None
    assert h.kv_params() == params
    assert conv.Handle.decode(h.encode()) == h


def test_fingerprint_ignores_what_clients_drop_and_sees_what_they_change() -> None:
    reply = {"role": "assistant", "content": "hi", "reasoning": "r", "refusal": None}
    history = [{"role": "user", "content": [{"type": "text", "text": "hello"}]}, reply]
    same = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"}]
    edited = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "ho"}]
    k = conv.fingerprint_key("t", "m", history)
    assert k == conv.fingerprint_key("t", "m", same)
    assert k != conv.fingerprint_key("t", "m", edited)
    assert k != conv.fingerprint_key("other-tenant", "m", same)
    assert conv.lookup_messages([*same, {"role": "user", "content": "q"}]) == same


async def test_sse_reader_handles_lines_longer_than_64k() -> None:
    big = {"prompt_token_ids": list(range(40_000))}
    payload = sse.event(big) + sse.DONE_EVENT

    async def chunks() -> Any:
        for i in range(0, len(payload), 1000):
            yield payload[i : i + 1000]

    events = [e async for e in sse.read_events(sse.split_lines(chunks()))]
    assert events == [big, sse.DONE]


def test_buffered_response_becomes_equivalent_chunks() -> None:
    response = {
        "id": "x",
        "object": "chat.completion",
        "created": 1,
        "model": "m",
        "choices": [
            {
                "index": 0,
                "finish_reason": "tool_calls",
                "logprobs": {"content": []},
                "message": {
                    "role": "assistant",
                    "content": None,
                    "reasoning": "why",
                    "tool_calls": [
                        {
                            "id": "c",
                            "type": "function",
                            "function": {"name": "f", "arguments": "{}"},
                        }
                    ],
                },
            }
        ],
        "usage": {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3},
    }
    chunks = list(sse.chunks_from_response(response, include_usage=True))
    delta = chunks[0]["choices"][0]["delta"]
    assert delta["reasoning"] == "why" and delta["tool_calls"][0]["index"] == 0
    assert chunks[0]["choices"][0]["finish_reason"] == "tool_calls"
    assert chunks[0]["choices"][0]["logprobs"] == {"content": []}
    assert chunks[-1]["usage"]["total_tokens"] == 3 and chunks[-1]["choices"] == []


def test_ready_urls_keep_ready_pod_ips_only() -> None:
    slices = [
        {
            "addressType": "IPv4",
            "endpoints": [
                {"addresses": ["10.0.0.1"], "conditions": {"ready": True}},
                {"addresses": ["10.0.0.2"], "conditions": {"ready": False}},
                {"addresses": ["10.0.0.3"]},
            ],
        },
        {"addressType": "IPv6", "endpoints": [{"addresses": ["fd00::1"]}]},
        {"addressType": "FQDN", "endpoints": [{"addresses": ["x.example"]}]},
    ]
    assert ready_urls(slices, 8000) == [
        "http://10.0.0.1:8000",
        "http://10.0.0.3:8000",
        "http://[fd00::1]:8000",
    ]


def test_slice_watch_events_update_the_url_set() -> None:
    from boomerang.router.config import KubernetesSource
    from boomerang.router.engines.discovery import ApiAccess

    seen: list[list[str]] = []
    w = SliceWatcher(
        KubernetesSource(namespace="n", service="s", port=80),
        ApiAccess("https://x", {}, False),
        seen.append,
    )
    s1 = {
        "metadata": {"name": "a", "resourceVersion": "2"},
        "endpoints": [{"addresses": ["10.0.0.1"]}],
    }
    w.apply({"type": "ADDED", "object": s1})
    w.apply({"type": "DELETED", "object": {"metadata": {"name": "a", "resourceVersion": "3"}}})
    assert seen == [["http://10.0.0.1:80"], []]
    with pytest.raises(RuntimeError):
        w.apply({"type": "ERROR", "object": {"code": 410, "message": "too old"}})
    assert w._rv == ""


def test_decode_prefers_the_holder_unless_overloaded() -> None:
    a, b = Endpoint("http://a", "decode"), Endpoint("http://b", "decode")
    s = LeastWorkAffinity(slack=2)
    a.inflight = 2
    assert s.decode([a, b], "http://a") is a
    a.inflight = 3
    assert s.decode([a, b], "http://a") is b


def test_ejected_engines_are_skipped_until_readmitted() -> None:
    pool = Pool("prefill", eject_after=2)
    pool.set_urls(["http://a", "http://b"])
    a = pool.endpoints["http://a"]
    pool.failed(a)
    pool.failed(a)
    assert [e.url for e in pool.candidates()] == ["http://b"]
    pool.succeeded(a, probe=True)
    assert len(pool.candidates()) == 2


def test_a_url_back_from_discovery_remembers_when_it_left() -> None:
    """Same pod IP, maybe a restarted pod: handles made before it left must stay void."""
    from boomerang.router.engines import endpoints

    pool = Pool("decode")
    pool.set_urls(["http://a", "http://b"])
    pool.set_urls(["http://b"])
    left = pool.departed["http://a"]
    assert left > 0
    pool.set_urls(["http://a", "http://b"])
    assert pool.endpoints["http://a"].lost_at == left
    assert pool.endpoints["http://b"].lost_at == 0.0
    assert "http://a" not in pool.departed
    for i in range(endpoints.MAX_DEPARTED + 10):  # pod churn: the memory stays bounded
        pool.set_urls([f"http://p{i}"])
    assert len(pool.departed) == endpoints.MAX_DEPARTED


def test_a_stream_counts_what_joined_its_decoder_and_the_batch_it_decoded_in() -> None:
    """Two streams overlap on D: the first sees the second (handed over from P) and a
    continued turn join; the second sees only the continued one. The first decodes 2 s beside
    one other request, then 2 s beside two: 1.5 others on average."""
    ep = Endpoint("http://d", "decode", load_at=0.0)
    ep.count(1, now=0.0)
    first = ep.join(handed_over=False, now=0.0)
    ep.count(1, now=0.0)
    second = ep.join(handed_over=True, now=1.0)
    ep.count(1, now=2.0)
    ep.join(handed_over=False, now=3.0)
    assert ep.since(first, now=4.0) == (1, 1, pytest.approx(1.5))
    assert ep.since(second, now=4.0) == (1, 0, pytest.approx(1.667, rel=1e-3))
    assert ep.joined == (2, 1)
    assert ep.since(ep.join(handed_over=True, now=4.0), now=4.0).others == 2.0  # no time yet


def test_a_decoders_stream_time_is_a_moving_mean_of_sane_measures() -> None:
    """`Endpoint.stream_s` (the continue budget's base): the first measure stands, each later
    one moves it by a tenth; zero, negative, non-finite and hour-long ones are ignored."""
    ep = Endpoint("http://d0", "decode")
    for nonsense in (0.0, -1.0, math.nan, math.inf, 7200.0):
        ep.streamed(nonsense)
    assert ep.stream_s == 0.0
    ep.streamed(2.0)
    assert ep.stream_s == 2.0
    ep.streamed(1.0)
    assert ep.stream_s == pytest.approx(1.9)
    ep.streamed(math.nan)
    assert ep.stream_s == pytest.approx(1.9)


def test_streaming_choice_follows_what_the_engine_can_do() -> None:
    cfg = RouterConfig.model_validate(STATIC)
    ep = Endpoint("http://d", "decode", version="0.32.0")
    assert decode_mode(False, ep, cfg, 0.0) == "json"
    assert decode_mode(True, ep, cfg, 0.0) == "stream"  # unknown: stream and observe
    ep.stream_params, ep.stream_params_at = False, 0.0
    assert decode_mode(True, ep, cfg, 1.0) == "buffer"
    assert decode_mode(True, ep, cfg, 10_000.0) == "stream"  # re-checked later
    assert version_tuple("0.33.1rc1+cpu") == (0, 33)


async def test_memory_store_is_bounded_by_size_and_sweeps_expired_handles() -> None:
    from boomerang.router.store import EXPIRED_GRACE_S, MemoryStore

    store = MemoryStore(max_conversations=3)
    for i in range(5):
        await store.put(bytes([i]), conv.Handle(b"", b"", 1, "d", expires_at=100.0 + i))
    assert await store.size() == 3
    assert (await store.take(bytes([0]), 0.0))[0] == "missing"  # the oldest were evicted
    assert (await store.take(bytes([4]), 200.0))[0] == "expired"
    assert store.sweep(103.0 + EXPIRED_GRACE_S) == 2
    assert await store.size() == 0


async def test_memory_store_hands_back_what_was_filed_and_hides_it_from_the_gc() -> None:
    import gc

    from boomerang.router.store import MemoryStore

    store = MemoryStore(max_conversations=10)
    handle = conv.Handle(b"params", b"h" * 16, 7, "http://d:8000", 500.0, 4, b"b" * 8)
    await store.put(b"k", handle)
    await store.put(b"j", conv.Handle(b"p", b"g" * 16, 3, "http://e:8000", expires_at=600.0))
    gc.collect()
    assert not any(gc.is_tracked(v) for v in store._items.values())  # full GCs skip them
    assert await store.take(b"k", 0.0) == ("found", handle)
    assert await store.take(b"k", 0.0) == ("missing", None)


async def test_a_full_memory_store_drops_its_oldest_entries_in_batches() -> None:
    from boomerang.router.store import EVICT_FRACTION, MemoryStore

    store = MemoryStore(max_conversations=EVICT_FRACTION * 2)
    for i in range(EVICT_FRACTION * 2):
        await store.put(i.to_bytes(2, "big"), conv.Handle(b"p", b"", 1, "d", 100.0))
    await store.put((0).to_bytes(2, "big"), conv.Handle(b"new", b"", 1, "d", 100.0))  # refiled
    await store.put(b"last", conv.Handle(b"p", b"", 1, "d", 100.0))
    assert await store.size() == EVICT_FRACTION * 2 - 2  # the excess and a batch of 2 went
    kept = [k for k in (1, 2, 3, 4) if (await store.take(k.to_bytes(2, "big"), 0.0))[1]]
    assert kept == [4]  # the oldest went first; 0 was refiled, so it is among the newest
    status, handle = await store.take((0).to_bytes(2, "big"), 0.0)
    assert status == "found" and handle is not None and handle.params == b"new"


def test_json_logs_carry_the_request_id_and_extras() -> None:
    import logging

    from boomerang.router.logs import JsonFormatter, new_request_id, request_id

    token = request_id.set(new_request_id("req-42"))
    try:
        record = logging.makeLogRecord({"msg": "Served turn", "levelname": "INFO"})
        record.reuse = "hit"
        line = json.loads(JsonFormatter().format(record))
    finally:
        request_id.reset(token)
    assert line["request_id"] == "req-42" and line["reuse"] == "hit"
    assert new_request_id("bad id with spaces\n") != "bad id with spaces\n"
