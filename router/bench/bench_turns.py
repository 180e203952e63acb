"""How the router benchmark's load generator sends turns: to the router, or "direct" (P then D
with the bodies the router would send, handles included), plain or streamed.

Kept apart from `router_bench.py` (the processes, rounds and tables) so the protocol a turn
follows reads on its own. A streamed turn is read to its end and returned as a plain answer
would be, and a routed stream is checked for fields the client must never see.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Iterator
from typing import Any

import orjson

from boomerang.router.apis import protocol
from boomerang.router.apis.validation import validate
from boomerang.router.engines.upstream import EngineClient, Limits

LIMITS = Limits(total=120.0, connect=60.0)
STREAM_TOKENS = 16
"""Tokens per streamed turn (`--stream`): the client's max_tokens."""


async def _post(client: EngineClient, url: str, body: dict[str, Any]) -> Any:
    status, raw = await client.request("POST", url, orjson.dumps(body), LIMITS)
    assert status == 200, raw
    return orjson.loads(raw)


async def post_stream(client: EngineClient, url: str, body: dict[str, Any], routed: bool) -> Any:
    """POST a streaming request, read the stream to its end and return it as a non-streamed
    answer would be (the reply's content, and D's params from the final chunk)."""
    resp = await client.stream("POST", url, orjson.dumps(body), LIMITS, LIMITS.total or 60.0)
    try:
        raw = await resp.read()
    finally:
        resp.release()
    assert resp.status == 200, raw
    if routed:  # what the client must never see
        assert b"kv_transfer_params" not in raw and b"token_ids" not in raw, raw
    events = [e[6:] for e in raw.split(b"\n\n") if e.startswith(b"data: ")]
    assert events[-1] == b"[DONE]", raw
    content, params = [], None
    for event in events[:-1]:
        chunk = orjson.loads(event)
        params = chunk.get("kv_transfer_params") or params
        for choice in chunk["choices"]:
            content.append(choice["delta"].get("content") or "")
    reply = {"role": "assistant", "content": "".join(content)}
    return {"choices": [{"message": reply}], "kv_transfer_params": params}


async def send_turn(
    client: EngineClient, urls: dict[str, str], body: dict[str, Any], handle: Any
) -> Any:
    streamed = bool(body.get("stream"))
    if "router" in urls:
        url = urls["router"] + "/v1/chat/completions"
        if streamed:
            return await post_stream(client, url, body, routed=True)
        return await _post(client, url, body)
    req = validate("chat", body, None)
    p_body = protocol.prefill_request(req.body, handle)
    p_data = await _post(client, urls["p"] + "/v1/chat/completions", p_body)
    d_body = protocol.decode_request(req.body, p_data["kv_transfer_params"], stream=streamed)
    if streamed:
        return await post_stream(client, urls["d"] + "/v1/chat/completions", d_body, False)
    return await _post(client, urls["d"] + "/v1/chat/completions", d_body)


def think_times(seed: str, mean_s: float) -> Iterator[float]:
    """Think times before each turn: exponential with this mean (0: none), seeded."""
    rng = random.Random(seed)
    while True:
        yield rng.expovariate(1.0 / mean_s) if mean_s else 0.0


async def conversation(
    client: EngineClient,
    urls: dict[str, str],
    cid: str,
    turns: int,
    thinks: Iterator[float],
    deadline: float,
    out: list[float],
    stream: bool = False,
) -> int:
    """Up to `turns` turns (none starts after `deadline`); returns how many ran."""
    history = [{"role": "user", "content": f"conversation {cid} opens with a question"}]
    handle = None
    for turn in range(turns):
        pause = next(thinks)
        if time.perf_counter() + pause >= deadline:  # the round ends before this turn
            await asyncio.sleep(max(0.0, deadline - time.perf_counter()))
            return turn
        if pause:
            await asyncio.sleep(pause)
        body: dict[str, Any] = {"model": "fake", "messages": history, "conversation_id": cid}
        if stream:
            body |= {"stream": True, "max_tokens": STREAM_TOKENS}
        start = time.perf_counter()
        data = await send_turn(client, urls, body, handle)
        out.append(time.perf_counter() - start)
        handle = data.get("kv_transfer_params")
        reply = data["choices"][0]["message"]
        history = [*history, reply, {"role": "user", "content": f"turn {turn} follow-up"}]
    return turns
