"""Fake vLLM prefill and decode engines that keep the P/D protocol faithfully, for tests.

What is faithful: the request/response shapes of vLLM's OpenAI server (chat and text
completions, streaming and not, `return_token_ids`, `/tokenize`, `/version`, `/health`), the
kv_transfer_params P and D exchange, and the rules of the NIXL connector: P holds its blocks
for D under a lease, D pins prompt + output minus the last sampled token for the decoder TTL,
every read frees the blocks it read, an expired handle is declined (P recomputes) and vLLM
streams D's params only from 0.33 (`stream_params`). What a real engine silently gets wrong
(reading freed blocks, reading blocks that do not hold the prompt's prefix) the shared
`Fabric` records in `violations`, so a test can assert that the router never causes it.

The tokenizer and chat template are in `fake_tokenizer.py`.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import socket
import time
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from boomerang.router.fake_tokenizer import (
    BOS,
    END,
    END_THINK,
    THINK,
    decode_ids,
    encode,
    render_chat,
    reply_for,
)


def free_port() -> int:
    """A loopback TCP port that nothing listens on (for a fake engine, Redis, or a dead peer)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, timeout_s: float) -> bool:
    """Whether something accepts connections on loopback `port` within `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return True
        except OSError:
            time.sleep(0.05)
    return False


@dataclass
class Held:
    """Blocks an engine holds for a remote reader (until it reads them or they expire)."""

    tokens: list[int]
    expires_at: float


@dataclass
class Fabric:
    """The fake NIXL world shared by the fake engines of one test."""

    held: dict[tuple[str, str], Held] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)
    pulls: list[tuple[str, int]] = field(default_factory=list)
    declined: int = 0

    def read(self, engine_id: str, request_id: str, want: list[int], who: str) -> bool:
        """A remote read of `want`'s prefix; True when KV really moved."""
        # A read (or a decision not to read) frees the blocks: a second read finds nothing.
        blocks = self.held.pop((engine_id, request_id), None)
        if blocks is None:
            self.violations.append(f"{who} read freed blocks {engine_id}/{request_id}")
            return False
        if time.perf_counter() > blocks.expires_at - 5.0:
            self.declined += 1
            return False
        n = min(len(blocks.tokens), len(want))
        if blocks.tokens[:n] != want[:n]:
            self.violations.append(f"{who} read blocks holding another token prefix")
            return False
        self.pulls.append((who, n))
        return True


@dataclass
class EngineSpec:
    """Knobs of one fake engine."""

    role: str
    engine_id: str
    fabric: Fabric
    version: str = "0.32.0"
    stream_params: bool = False
    bidirectional: bool = True
    decoder_ttl_s: float = 480.0
    lease_s: float = 30.0
    reply_words: int = 4
    reasoning: bool = False
    delay_s: float = 0.0
    fail_status: int | None = None
    """Answer completions with this HTTP status (simulates a broken engine)."""
    healthy: bool = True
    """False: /health answers 503 (an engine that is down or restarting)."""
    api_key: str | None = None
    """Like vLLM's --api-key: completions and tokenize need this Bearer key."""
    chunk_delay_s: float = 0.0
    """Pause between streamed chunks (to test disconnects mid-stream)."""
    disconnected: int = 0
    """Streams whose reader went away before the end."""
    calls: list[dict[str, Any]] = field(default_factory=list)
    record_calls: bool = True
    """False: leave `calls` empty (a long benchmark would keep every request body)."""
    tokenize_calls: int = 0
    seen_return_token_ids: bool = False
    request_ids: list[str | None] = field(default_factory=list)
    """The `X-Request-Id` of every completion and tokenize call (when `record_calls`)."""


class FakeEngine:
    """One fake vLLM OpenAI server in a P or D role."""

    def __init__(self, spec: EngineSpec) -> None:
        self.spec = spec
        self._ids = itertools.count(1)

    def app(self) -> web.Application:
        """The aiohttp app serving this engine."""
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._completion)
        app.router.add_post("/v1/completions", self._completion)
        app.router.add_post("/tokenize", self._tokenize)
        app.router.add_get("/health", self._health)
        app.router.add_get("/version", self._version)
        app.router.add_get("/v1/models", self._models)
        return app

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(text="", status=200 if self.spec.healthy else 503)

    async def _version(self, request: web.Request) -> web.Response:
        return _json({"version": self.spec.version})

    async def _models(self, request: web.Request) -> web.Response:
        return _json({"object": "list", "data": [{"id": "fake", "object": "model"}]})

    def _authorized(self, request: web.Request) -> bool:
        key = self.spec.api_key
        return key is None or request.headers.get("Authorization") == f"Bearer {key}"

    async def _tokenize(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return _json({"error": "Unauthorized"}, status=401)
        body = _loads(await request.read())
        self.spec.tokenize_calls += 1
        if self.spec.record_calls:
            self.spec.request_ids.append(request.headers.get("X-Request-Id"))
        ids = self._prompt_ids(body)
        return _json({"count": len(ids), "max_model_len": 1 << 20, "tokens": ids})

    def _prompt_ids(self, body: dict[str, Any]) -> list[int]:
        if "messages" in body:
            kwargs = body.get("chat_template_kwargs") or {}
            gen = body.get("add_generation_prompt", kwargs.get("add_generation_prompt", True))
            return render_chat(body["messages"], gen)
        prompt = body.get("prompt")
        if isinstance(prompt, list):
            return list(prompt)
        special = [BOS] if body.get("add_special_tokens", True) else []
        return special + encode(prompt or "")

    async def _completion(self, request: web.Request) -> web.StreamResponse:
        if not self._authorized(request):
            return _json({"error": "Unauthorized"}, status=401)
        body = _loads(await request.read())
        if self.spec.record_calls:
            self.spec.calls.append(body)
            self.spec.request_ids.append(request.headers.get("X-Request-Id"))
        if self.spec.delay_s:
            await asyncio.sleep(self.spec.delay_s)
        if self.spec.fail_status is not None:
            return _json(
                {"error": {"message": "engine failure", "code": self.spec.fail_status}},
                status=self.spec.fail_status,
            )
        if body.get("prompt") == "" or body.get("messages") == []:
            return _json({"error": {"message": "empty prompt"}}, status=400)
        self.spec.seen_return_token_ids |= bool(body.get("return_token_ids"))
        prompt_ids = self._prompt_ids(body)
        params = body.get("kv_transfer_params") or None
        rid = f"req-{self.spec.engine_id}-{next(self._ids)}"
        if self.spec.role == "prefill":
            return _json(self._prefill(body, prompt_ids, params, rid))
        return await self._decode(request, body, prompt_ids, params, rid)

    def _params(
        self, rid: str, num_tokens: int, expiry: float | None, is_d: bool
    ) -> dict[str, Any]:
        return {
            "do_remote_prefill": not is_d,
            "do_remote_decode": is_d,
            "remote_block_ids": [list(range(max(1, num_tokens // 16 + 1)))],
            "remote_engine_id": self.spec.engine_id,
            "remote_request_id": rid,
            "remote_host": "127.0.0.1",
            "remote_port": 5600,
            "tp_size": 1,
            "dcp_size": 1,
            "pp_size": 1,
            "remote_num_tokens": num_tokens,
            "remote_blocks_expiry_time": expiry,
            "transfer_mode": "pull",
        }

    def _prefill(
        self, body: dict[str, Any], ids: list[int], params: dict[str, Any] | None, rid: str
    ) -> dict[str, Any]:
        fab = self.spec.fabric
        if body.get("stream") or body.get("max_tokens") != 1:
            fab.violations.append("prefill got a streaming or multi-token request")
        if params and params.get("do_remote_decode") and params.get("remote_block_ids"):
            if not self.spec.bidirectional:
                fab.violations.append("handle sent to a prefill engine without bidirectional")
            fab.read(params["remote_engine_id"], params["remote_request_id"], ids, "prefill")
        expiry = time.perf_counter() + self.spec.lease_s
        fab.held[(self.spec.engine_id, rid)] = Held(list(ids), expiry)
        out = _response(body, rid, "x", [ids[-1] % 97], "length", ids, body.get("return_token_ids"))
        out["kv_transfer_params"] = self._params(rid, len(ids), None, is_d=False)
        return out

    def _generate(self, body: dict[str, Any], ids: list[int]) -> tuple[str, list[int], str, str]:
        """(content, output ids, finish reason, reasoning)."""
        text = reply_for(ids, self.spec.reply_words)
        reasoning = "let me think" if self.spec.reasoning else ""
        out = [THINK, *encode(reasoning), END_THINK] if reasoning else []
        out += encode(text)
        limit = body.get("max_tokens") or body.get("max_completion_tokens")
        if limit is not None and len(out) >= limit:
            out = out[:limit]
            return decode_ids(out), out, "length", ""
        return text, [*out, END], "stop", reasoning

    async def _decode(
        self,
        request: web.Request,
        body: dict[str, Any],
        ids: list[int],
        params: dict[str, Any] | None,
        rid: str,
    ) -> web.StreamResponse:
        fab = self.spec.fabric
        if params and params.get("do_remote_prefill"):
            fab.read(params["remote_engine_id"], params["remote_request_id"], ids, "decode")
        content, out_ids, finish, reasoning = self._generate(body, ids)
        d_params = None
        if params and self.spec.bidirectional:
            n = len(ids) + len(out_ids) - 1
            expiry = time.perf_counter() + self.spec.decoder_ttl_s
            fab.held[(self.spec.engine_id, rid)] = Held((ids + out_ids)[:n], expiry)
            d_params = self._params(rid, n, expiry, is_d=True)
        want_ids = body.get("return_token_ids")
        if not body.get("stream"):
            out = _response(body, rid, content, out_ids, finish, ids, want_ids, reasoning)
            out["kv_transfer_params"] = d_params
            return _json(out)
        return await self._stream(request, body, rid, content, out_ids, finish, ids, d_params)

    async def _stream(
        self,
        request: web.Request,
        body: dict[str, Any],
        rid: str,
        content: str,
        out_ids: list[int],
        finish: str,
        ids: list[int],
        d_params: dict[str, Any] | None,
    ) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        try:
            await self._chunks(resp, body, rid, content, out_ids, finish, ids, d_params)
        except ConnectionResetError:
            self.spec.disconnected += 1
        except asyncio.CancelledError:
            self.spec.disconnected += 1  # aiohttp cancels the handler when the peer goes away
            raise
        return resp

    async def _chunks(
        self,
        resp: web.StreamResponse,
        body: dict[str, Any],
        rid: str,
        content: str,
        out_ids: list[int],
        finish: str,
        ids: list[int],
        d_params: dict[str, Any] | None,
    ) -> None:
        chat = "messages" in body
        want_ids = bool(body.get("return_token_ids"))
        base = _base(body, rid, chunk=True)
        first: dict[str, Any] = {**base, "choices": [_chunk_choice(chat, "", None, None)]}
        if chat:
            first["choices"][0]["delta"]["role"] = "assistant"
        if want_ids:
            (first if chat else first["choices"][0])["prompt_token_ids"] = ids
        await resp.write(_event(first))
        pieces = content.split(" ")
        consumed = len(out_ids) - len(encode(content)) - (1 if finish == "stop" else 0)
        consumed = max(0, consumed)
        for i, word in enumerate(pieces):
            last = i == len(pieces) - 1
            text = word if i == 0 else " " + word
            end = len(out_ids) if last else consumed + len(text)
            tok = out_ids[0 if i == 0 else consumed : end]
            consumed = end
            choice = _chunk_choice(chat, text, finish if last else None, tok if want_ids else None)
            chunk: dict[str, Any] = {**base, "choices": [choice]}
            if last and self.spec.stream_params:
                chunk["kv_transfer_params"] = d_params
            await asyncio.sleep(self.spec.chunk_delay_s)
            await resp.write(_event(chunk))
        opts = body.get("stream_options") or {}
        if opts.get("include_usage"):
            usage = _usage(len(ids), len(out_ids))
            await resp.write(_event({**base, "choices": [], "usage": usage}))
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()


def _loads(raw: bytes) -> Any:
    """orjson, or the standard library for what orjson refuses (lone surrogates, NaN)."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return json.loads(raw)


def _dumps(obj: Any) -> bytes:
    try:
        return orjson.dumps(obj)
    except (TypeError, orjson.JSONEncodeError):
        return json.dumps(obj).encode()


def _json(obj: Any, status: int = 200) -> web.Response:
    """A JSON response (`web.json_response` costs a stdlib `json.dumps` per reply)."""
    return web.Response(body=_dumps(obj), status=status, content_type="application/json")


def _event(payload: dict[str, Any]) -> bytes:
    return b"data: " + _dumps(payload) + b"\n\n"


def _base(body: dict[str, Any], rid: str, chunk: bool) -> dict[str, Any]:
    chat = "messages" in body
    obj = ("chat.completion.chunk" if chunk else "chat.completion") if chat else "text_completion"
    return {"id": rid, "object": obj, "created": 0, "model": body.get("model") or "fake"}


def _chunk_choice(
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


def _usage(prompt: int, completion: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def _response(
    body: dict[str, Any],
    rid: str,
    content: str,
    out_ids: list[int],
    finish: str,
    prompt_ids: list[int],
    want_ids: Any,
    reasoning: str = "",
) -> dict[str, Any]:
    out = _base(body, rid, chunk=False)
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
    out["usage"] = _usage(len(prompt_ids), len(out_ids))
    return out
