"""The streaming plugin's pure parts: which SSE events get D's params, and how."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any

from boomerang.connector.plugin.register import needs_patch, with_params, wrap_stream_generator

PARAMS = {"do_remote_decode": True, "remote_block_ids": [1, 2]}


def event(finish: str | None, **extra: Any) -> str:
    body = {
        "id": "x",
        "choices": [{"index": 0, "delta": {"content": "a"}, "finish_reason": finish}],
    }
    body.update(extra)
    return f"data: {json.dumps(body)}\n\n"


def test_finishing_chunk_gets_the_params_at_top_level() -> None:
    out = json.loads(with_params(event("stop"), PARAMS)[len("data: ") :])
    assert out["kv_transfer_params"] == PARAMS
    assert out["choices"][0]["finish_reason"] == "stop"


def test_other_chunks_pass_unchanged() -> None:
    for ev in (event(None), "data: [DONE]\n\n", ": keepalive\n\n", 'data: {"usage": {}}\n\n'):
        assert with_params(ev, PARAMS) == ev


def test_nothing_is_added_when_the_request_asked_for_no_transfer() -> None:
    assert with_params(event("length"), None) == event("length")


def test_version_gate() -> None:
    assert needs_patch("0.32.0") and needs_patch("0.21.1+cpu") and not needs_patch("0.33.0")
    assert not needs_patch("1.0.0")


def test_wrapped_generator_sees_the_engine_outputs_params() -> None:
    class Serving:
        async def completion_stream_generator(self, request, result_generator, request_id):
            async for _idx, out in result_generator:
                yield event("stop" if out.finished else None)
            yield "data: [DONE]\n\n"

    async def engine():
        yield 0, SimpleNamespace(finished=False, kv_transfer_params=None)
        yield 0, SimpleNamespace(finished=True, kv_transfer_params=PARAMS)

    wrapped = wrap_stream_generator(Serving.completion_stream_generator)

    async def collect() -> list[str]:
        return [e async for e in wrapped(Serving(), None, engine(), request_id="r")]

    events = asyncio.run(collect())
    assert "kv_transfer_params" not in events[0]
    assert json.loads(events[1][6:])["kv_transfer_params"] == PARAMS
    assert events[2] == "data: [DONE]\n\n"
