"""The OpenAI response shapes the fake engines answer with (vLLM's, token ids included).

Kept apart from `testing.py` so the engines' protocol logic reads on its own; nothing here
knows about P, D or KV transfer.
"""

from __future__ import annotations

import json
from typing import Any

import orjson
from aiohttp import web


def loads_lenient(raw: bytes) -> Any:
    """orjson, or the standard library for what orjson refuses (lone surrogates, NaN)."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return json.loads(raw)


def dumps_lenient(obj: Any) -> bytes:
    try:
        return orjson.dumps(obj)
    except (TypeError, orjson.JSONEncodeError):
        return json.dumps(obj).encode()


def json_reply(obj: Any, status: int = 200) -> web.Response:
    """A JSON response (`web.json_response` costs a stdlib `json.dumps` per reply)."""
    return web.Response(body=dumps_lenient(obj), status=status, content_type="application/json")


def sse_event(payload: dict[str, Any]) -> bytes:
    return b"data: " + dumps_lenient(payload) + b"\n\n"


def response_base(body: dict[str, Any], rid: str, chunk: bool) -> dict[str, Any]:
    chat = "messages" in body
    obj = ("chat.completion.chunk" if chunk else "chat.completion") if chat else "text_completion"
    return {"id": rid, "object": obj, "created": 0, "model": body.get("model") or "fake"}


def chunk_choice(
    chat: bool, text: str, finish: str | None, token_ids: list[int] | None
) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": finish}
    if chat:
        choice["delta"] = {"content": text}
    else:
        choice["text"] = text
    if token_ids is not None:
        choice["token_ids"] = token_ids
    return choice


def usage(prompt: int, completion: int, cached: int = 0) -> dict[str, Any]:
    """vLLM's usage; with `--enable-prompt-tokens-details` it adds the prompt tokens it did not
    compute (its prefix-cache hit and what its connector loaded), only when there are any."""
    out: dict[str, Any] = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }
    if cached:
        out["prompt_tokens_details"] = {"cached_tokens": cached}
    return out


def loaded(params: dict[str, Any] | None, prompt: list[int]) -> int:
    """Prompt tokens an engine given `params` loads from another engine instead of computing
    them (vLLM counts them as cached): P pulling D's handle, D pulling P's blocks."""
    if not params:
        return 0
    n = params.get("remote_num_tokens")
    if params.get("do_remote_decode") and params.get("remote_block_ids") and isinstance(n, int):
        return min(n, len(prompt))
    return len(prompt) if params.get("do_remote_prefill") else 0


def completion_response(
    body: dict[str, Any],
    rid: str,
    content: str,
    out_ids: list[int],
    finish: str,
    prompt_ids: list[int],
    want_ids: Any,
    reasoning: str = "",
) -> dict[str, Any]:
    out = response_base(body, rid, chunk=False)
    choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": finish}
    if "messages" in body:
        choice["message"] = {"role": "assistant", "content": content, "tool_calls": []}
        if reasoning:
            choice["message"]["reasoning"] = reasoning
        if want_ids:
            out["prompt_token_ids"] = prompt_ids
    else:
        choice["text"] = content
        if want_ids:
            choice["prompt_token_ids"] = prompt_ids
    if want_ids:
        choice["token_ids"] = out_ids
    out["choices"] = [choice]
    out["usage"] = usage(len(prompt_ids), len(out_ids))
    return out
