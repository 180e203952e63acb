"""Fake vLLM prefill and decode engines that keep the P/D protocol faithfully, for tests.

What is faithful: the request/response shapes of vLLM's OpenAI server (chat and text
completions, streaming and not, `return_token_ids`, `/tokenize`, `/version`, `/health`), the
kv_transfer_params P and D exchange, and the rules of the NIXL connector: P holds its blocks
for D under a lease, D pins prompt + output minus the last sampled token for the decoder TTL,
every read frees the blocks it read, an expired handle is declined (P recomputes) and vLLM
streams D's params only from 0.33 (`stream_params`), a plain request (no kv_transfer_params)
is served by either role like a single engine would, and `/metrics` carries vLLM's
`vllm:cache_config_info` gauge with the engine's KV block size (`block_size`). Blocks are
numbered per engine and each remembers the token ids it holds; what a real engine silently gets
wrong (reading freed blocks, or blocks and token counts that do not hold the reader's prompt,
as a wrongly narrowed handle would make it) the shared `Fabric` (`fake_fabric.py`) records in
`violations`, so a test can assert that the router never causes it.

The tokenizer and chat template are in `fake_tokenizer.py`.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import fake_apis
import fake_leases
from aiohttp import web
from fake_fabric import Fabric, Held
from fake_responses import (
    chunk_choice,
    completion_response,
    json_reply,
    loaded,
    loads_lenient,
    response_base,
    sse_event,
    usage,
)
from fake_tokenizer import (
    BOS,
    END,
    END_THINK,
    THINK,
    decode_ids,
    encode,
    render_chat,
    reply_for,
)

from boomerang.facts.engine import (
    CONTINUE_CAPABILITY,
    ENGINE_CAPABILITY_METRIC,
    ENGINE_REVISION_METRIC,
)
from boomerang.router.auth import ANONYMOUS
from boomerang.router.turn.cache_salt import engine_salt

__all__ = ["EngineSpec", "Fabric", "FakeEngine", "Held", "free_port", "wait_port"]


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
class EngineSpec:
    """Knobs of one fake engine."""

    role: str
    engine_id: str
    fabric: Fabric
    version: str = "0.32.0"
    stream_params: bool = False
    bidirectional: bool = True
    decoder_ttl_s: float = 480.0
    block_size: int = 16
    """KV block size in tokens: how blocks are cut, and what `/metrics` reports."""
    block_size_metric: bool = True
    """False: `/metrics` has no `vllm:cache_config_info` (an engine that does not say)."""
    revision: str | None = None
    """The engine revision `/metrics` publishes, as Boomerang's plugin does (None: none)."""
    capabilities: tuple[str, ...] = (CONTINUE_CAPABILITY,)
    """What `/metrics` says Boomerang's plugin put in force (empty: an engine without it)."""
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
    in_band_errors: int = 0
    """Streams still to end with vLLM's in-band error (`data: {"error": ...}` then [DONE],
    under the 200), as vLLM reports a failed KV load under `kv_load_failure_policy: fail`."""
    in_band_after: int = 0
    """Tokens streamed before that error (0: after the role's event, before any token)."""
    chunk_delay_s: float = 0.0
    """Pause between streamed chunks (to test disconnects mid-stream)."""
    failed_loads: int = 0
    """Pulls still to fail on P: it recomputes, and its usage counts nothing as cached (vLLM's
    count after a failed load, `kv_load_failure_policy: recompute`)."""
    tpot_s: float = 0.0
    """Time per output token of an answer not streamed (what the router's idle probe times)."""
    clock_tpot_s: float | None = None
    """What `/metrics` says an answer not streamed took per output token, as vLLM's
    `vllm:request_time_per_output_token_seconds` histogram (its engine core's clock; 0 for a
    one-token answer); None: no such histogram."""
    finished_beside: int = 0
    """Answers not streamed of many tokens still to count one more request in that histogram
    (another client's, finished beside it: the engine was not idle)."""
    chunk_per_token: bool = False
    """Stream one chunk per generated token, as vLLM does (default: one per word, fewer
    chunks for tests); reasoning tokens are then streamed as content."""
    disconnected: int = 0
    """Streams whose reader went away before the end."""
    calls: list[dict[str, Any]] = field(default_factory=list)
    record_calls: bool = True
    """False: leave `calls` empty (a long benchmark would keep every request body)."""
    tokenize_calls: int = 0
    seen_return_token_ids: bool = False
    request_ids: list[str | None] = field(default_factory=list)
    """The `X-Request-Id` of every completion and tokenize call (when `record_calls`)."""
    kv_blocks: int | None = None
    """D's KV blocks in all (`num_gpu_blocks` of `vllm:cache_config_info`; None: not said)."""
    api_ids: bool = True
    """Boomerang's plugin on the Responses and Messages endpoints (`fake_apis.py`): their
    answers to P/D requests carry the prompt's and output's ids, and a streamed Messages
    answer D's params; False: as vLLM 0.32 alone."""
    lease_api: bool = True
    """Serve the lease API of Boomerang's plugin (`fake_leases.py`); False: 404, no plugin."""
    lease_token: str | None = None
    """Its bearer token (None: lease control off, 403)."""
    lease_status: int | None = None
    """Answer every lease call with this HTTP status."""
    claim_answer_s: float = 0.0
    """How long D takes to answer a claim it has already made (its next engine step)."""
    lease_calls: list[str] = field(default_factory=list)
    released: list[str] = field(default_factory=list)
    renewed: list[str] = field(default_factory=list)
    claimed: list[str] = field(default_factory=list)
    unclaimed: list[str] = field(default_factory=list)


class FakeEngine:
    """One fake vLLM OpenAI server in a P or D role."""

    def __init__(self, spec: EngineSpec) -> None:
        self.spec = spec
        self._ids = itertools.count(1)
        self._blocks = itertools.count()
        self._tpot_totals = [0.0, 0]  # the TPOT histogram's sum and count

    def app(self) -> web.Application:
        """The aiohttp app serving this engine."""
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._completion)
        app.router.add_post("/v1/completions", self._completion)
        app.router.add_post("/tokenize", self._tokenize)
        app.router.add_get("/health", self._health)
        app.router.add_get("/version", self._version)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/metrics", self._metrics)
        fake_leases.add_routes(app, self.spec)
        fake_apis.add_routes(app, self)
        return app

    async def _metrics(self, request: web.Request) -> web.Response:
        lines = ["# TYPE vllm:num_requests_running gauge", "vllm:num_requests_running 0.0"]
        if self.spec.block_size_metric:
            labels = f'cache_dtype="auto",block_size="{self.spec.block_size}",engine="0"'
            if self.spec.kv_blocks is not None:
                labels += f',num_gpu_blocks="{self.spec.kv_blocks}"'
            lines += [
                "# TYPE vllm:cache_config_info gauge",
                f"vllm:cache_config_info{{{labels}}} 1.0",
            ]
        if self.spec.revision is not None:
            lines += [
                f"# TYPE {ENGINE_REVISION_METRIC} gauge",
                f'{ENGINE_REVISION_METRIC}{{revision="{self.spec.revision}"}} 1.0',
            ]
        if self.spec.capabilities:
            lines.append(f"# TYPE {ENGINE_CAPABILITY_METRIC} gauge")
            lines += [
                f'{ENGINE_CAPABILITY_METRIC}{{capability="{c}"}} 1.0'
                for c in self.spec.capabilities
            ]
        if self.spec.clock_tpot_s is not None:
            name = "vllm:request_time_per_output_token_seconds"
            total, count = self._tpot_totals
            lines += [
                f"# TYPE {name} histogram",
                f'{name}_bucket{{le="+Inf",engine="0"}} {count}.0',
                f'{name}_count{{engine="0"}} {count}.0',
                f'{name}_sum{{engine="0"}} {total}',
            ]
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")

    def _hold(self, rid: str, tokens: list[int], expiry: float) -> list[int]:
        """Blocks for `tokens`, held on the fabric for a remote reader; their ids."""
        size = self.spec.block_size
        ids = [next(self._blocks) for _ in range(-(-len(tokens) // size))]
        self.spec.fabric.held[(self.spec.engine_id, rid)] = Held(tokens, expiry, ids, size)
        return ids

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(text="", status=200 if self.spec.healthy else 503)

    async def _version(self, request: web.Request) -> web.Response:
        return json_reply({"version": self.spec.version})

    async def _models(self, request: web.Request) -> web.Response:
        return json_reply({"object": "list", "data": [{"id": "fake", "object": "model"}]})

    def _authorized(self, request: web.Request) -> bool:
        key = self.spec.api_key
        return key is None or request.headers.get("Authorization") == f"Bearer {key}"

    async def _tokenize(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return json_reply({"error": "Unauthorized"}, status=401)
        body = loads_lenient(await request.read())
        self.spec.tokenize_calls += 1
        if self.spec.record_calls:
            self.spec.request_ids.append(request.headers.get("X-Request-Id"))
        ids = self._prompt_ids(body)
        return json_reply({"count": len(ids), "max_model_len": 1 << 20, "tokens": ids})

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
            return json_reply({"error": "Unauthorized"}, status=401)
        body = loads_lenient(await request.read())
        if self.spec.record_calls:
            self.spec.calls.append(body)
            self.spec.request_ids.append(request.headers.get("X-Request-Id"))
        if self.spec.delay_s:
            await asyncio.sleep(self.spec.delay_s)
        if self.spec.fail_status is not None:
            return json_reply(
                {"error": {"message": "engine failure", "code": self.spec.fail_status}},
                status=self.spec.fail_status,
            )
        if body.get("prompt") == "" or body.get("messages") == []:
            return json_reply({"error": {"message": "empty prompt"}}, status=400)
        self.spec.seen_return_token_ids |= bool(body.get("return_token_ids"))
        prompt_ids = self._prompt_ids(body)
        params = body.get("kv_transfer_params") or None
        rid = f"req-{self.spec.engine_id}-{next(self._ids)}"
        if self.spec.role == "prefill" and params is not None:
            return json_reply(self._prefill(body, prompt_ids, params, rid))
        # D, or P given a plain request (no kv_transfer_params): vLLM serves it like a single
        # engine, generating the whole answer and retaining nothing.
        return await self._decode(request, body, prompt_ids, params, rid)

    def _params(
        self, rid: str, blocks: list[int], num_tokens: int, expiry: float | None, is_d: bool
    ) -> dict[str, Any]:
        return {
            "do_remote_prefill": not is_d,
            "do_remote_decode": is_d,
            "remote_block_ids": [blocks],
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
        out = completion_response(
            body, rid, "x", [ids[-1] % 97], "length", ids, body.get("return_token_ids")
        )
        out["kv_transfer_params"] = self.prefill(body, ids, params, rid)
        pulls = bool(params and params.get("do_remote_decode") and params.get("remote_block_ids"))
        failed = pulls and self.spec.failed_loads > 0
        self.spec.failed_loads -= failed
        out["usage"] = usage(len(ids), 1, 0 if failed else loaded(params, ids))
        return out

    def prefill(
        self, body: dict[str, Any], ids: list[int], params: dict[str, Any] | None, rid: str
    ) -> dict[str, Any]:
        """P's part of a turn (`body` with the chat fields): pull what a handle names, hold
        the prompt's blocks for D; P's params."""
        fab = self.spec.fabric
        if body.get("stream") or body.get("max_tokens") != 1:
            fab.violations.append("prefill got a streaming or multi-token request")
        if params and params.get("do_remote_decode") and params.get("remote_block_ids"):
            if not self.spec.bidirectional:
                fab.violations.append("handle sent to a prefill engine without bidirectional")
            _read(fab, params, ids, "prefill")
        blocks = self._hold(rid, list(ids), time.perf_counter() + self.spec.lease_s)
        return self._params(rid, blocks, len(ids), None, is_d=False)

    def generate(
        self, body: dict[str, Any], ids: list[int], params: dict[str, Any] | None, rid: str
    ) -> tuple[str, list[int], str, str, dict[str, Any] | None]:
        """D's part of a turn (or one engine's): read P's blocks, generate, hold prompt +
        output minus the last token; (content, output ids, finish, reasoning, D's params)."""
        if params and params.get("do_remote_prefill"):
            _read(self.spec.fabric, params, ids, "decode")
        content, out_ids, finish, reasoning = self._generate(body, ids)
        d_params = None
        if params and self.spec.bidirectional:
            n = len(ids) + len(out_ids) - 1
            expiry = time.perf_counter() + self.spec.decoder_ttl_s
            blocks = self._hold(rid, (ids + out_ids)[:n], expiry)
            d_params = self._params(rid, blocks, n, expiry, is_d=True)
        return content, out_ids, finish, reasoning, d_params

    def _generate(self, body: dict[str, Any], ids: list[int]) -> tuple[str, list[int], str, str]:
        """(content, output ids, finish reason, reasoning)."""
        text = reply_for(ids, self.spec.reply_words)
        reasoning = "let me think" if self.spec.reasoning else ""
        out = [THINK, *encode(reasoning), END_THINK] if reasoning else []
        out += encode(text)
        limit = body.get("max_tokens") or body.get("max_completion_tokens")
        while body.get("ignore_eos") and text and limit is not None and len(out) < limit:
            out += encode(text)  # vLLM's ignore_eos: the answer runs to max_tokens
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
        content, out_ids, finish, reasoning, d_params = self.generate(body, ids, params, rid)
        want_ids = body.get("return_token_ids")
        cached = loaded(params, ids)
        if not body.get("stream"):
            await asyncio.sleep(self.spec.tpot_s * len(out_ids))
            if self.spec.clock_tpot_s is not None:
                self._tpot_totals[0] += self.spec.clock_tpot_s if len(out_ids) > 1 else 0.0
                self._tpot_totals[1] += 1
                if self.spec.finished_beside and len(out_ids) > 1:
                    self.spec.finished_beside -= 1
                    self._tpot_totals[1] += 1
            out = completion_response(body, rid, content, out_ids, finish, ids, want_ids, reasoning)
            out["kv_transfer_params"] = d_params
            out["usage"] = usage(len(ids), len(out_ids), cached)
            return json_reply(out)
        answer = (content, out_ids, finish, ids, d_params, cached)
        return await self._stream(request, body, rid, answer)

    async def _stream(
        self,
        request: web.Request,
        body: dict[str, Any],
        rid: str,
        answer: tuple[str, list[int], str, list[int], dict[str, Any] | None, int],
    ) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        try:
            await self._chunks(resp, body, rid, *answer)
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
        cached: int = 0,
    ) -> None:
        chat = "messages" in body
        want_ids = bool(body.get("return_token_ids"))
        base = response_base(body, rid, chunk=True)
        first: dict[str, Any] = {**base, "choices": [chunk_choice(chat, "", None, None)]}
        if chat:
            first["choices"][0]["delta"]["role"] = "assistant"
        if want_ids:
            (first if chat else first["choices"][0])["prompt_token_ids"] = ids
        await resp.write(sse_event(first))
        if self.spec.chunk_per_token:
            pieces = [(decode_ids([t]), [t]) for t in out_ids]
        else:
            pieces = _word_pieces(content, out_ids, finish)
        for i, (text, tok) in enumerate(pieces):
            if self.spec.in_band_errors and i == self.spec.in_band_after:
                self.spec.in_band_errors -= 1
                error = {"message": "KV load failed", "type": "InternalServerError", "code": 500}
                await resp.write(sse_event({"error": error}) + b"data: [DONE]\n\n")
                await resp.write_eof()
                return
            last = i == len(pieces) - 1
            choice = chunk_choice(chat, text, finish if last else None, tok if want_ids else None)
            chunk: dict[str, Any] = {**base, "choices": [choice]}
            if last and self.spec.stream_params:
                chunk["kv_transfer_params"] = d_params
            await asyncio.sleep(self.spec.chunk_delay_s)
            await resp.write(sse_event(chunk))
        opts = body.get("stream_options") or {}
        if opts.get("include_usage"):
            counts = usage(len(ids), len(out_ids), cached)
            await resp.write(sse_event({**base, "choices": [], "usage": counts}))
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()


def _word_pieces(content: str, out_ids: list[int], finish: str) -> list[tuple[str, list[int]]]:
    """(text, token ids) of each streamed chunk, one per word of `content`; the first also
    carries any reasoning ids, the last the END id."""
    pieces = content.split(" ")
    consumed = len(out_ids) - len(encode(content)) - (1 if finish == "stop" else 0)
    consumed = max(0, consumed)
    out = []
    for i, word in enumerate(pieces):
        text = word if i == 0 else " " + word
        end = len(out_ids) if i == len(pieces) - 1 else consumed + len(text)
        out.append((text, out_ids[0 if i == 0 else consumed : end]))
        consumed = end
    return out


def _read(fab: Fabric, params: dict[str, Any], prompt: list[int], who: str) -> None:
    """Pull what the handle names: its first group's blocks, `remote_num_tokens` of them."""
    groups = params.get("remote_block_ids") or [[]]
    n = params.get("remote_num_tokens")
    engine, rid = params["remote_engine_id"], params["remote_request_id"]
    fab.read(engine, rid, prompt, who, groups[0], n if isinstance(n, int) else None)


# What a test client sends through the router (`w` is the conftest world: client and metrics).


def chat(messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"model": "fake", "messages": messages, **extra}


async def post(w: Any, body: dict[str, Any], **headers: str) -> tuple[int, Any]:
    resp = await w.client.post("/v1/chat/completions", json=body, headers=headers)
    return resp.status, await resp.json()


async def stream(w: Any, body: dict[str, Any], path: str = "/v1/chat/completions") -> list[Any]:
    resp = await w.client.post(path, json={**body, "stream": True})
    assert resp.status == 200, await resp.text()
    raw = (await resp.read()).decode()
    events = [e[len("data: ") :] for e in raw.split("\n\n") if e.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


async def filed(w: Any, n: int) -> None:
    """Wait until the router filed its n-th handle (it files just after answering)."""
    for _ in range(200):
        if await w.metric("boomerang_router_handles_stored_total") >= n:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{n} handles were never filed")


# Engines that misbehave in one exact way at the TCP level, for the HTTP client's and the
# engine-call facade's tests.


async def raw_server(
    handle: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]],
) -> tuple[asyncio.Server, str]:
    """A TCP server running `handle` per connection; its base URL."""
    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"


async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Reads the request's head, then closes without an answer."""
    await reader.readuntil(b"\r\n\r\n")
    writer.close()


async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Reads, and never answers."""
    await reader.read()


async def trickle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Answers 200 with a chunked body of one byte every 50 ms, for 2.5 s."""
    await reader.readuntil(b"\r\n\r\n")
    writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
    for _ in range(50):
        writer.write(b"1\r\nx\r\n")
        await writer.drain()
        await asyncio.sleep(0.05)


def d_caches(
    w: Any, tokens: list[int], i: int = 0, role: str = "decode", tenant: str = ANONYMOUS
) -> None:
    """Engine i of `role` holds `tokens` in its prefix cache, stored by a request of `tenant`
    (salted as the router salts it), as its KV events would have told the router's index (the
    fake engines publish none)."""
    from boomerang.router.app import ROUTER
    from boomerang.router.engines import blockhash

    router = w.client.server.app[ROUTER]
    spec = (w.decode if role == "decode" else w.prefill)[i]
    offset = len(w.prefill) if role == "decode" else 0
    url = str(w.servers[offset + i].make_url("")).rstrip("/")
    bit = router.kv.engines.bit(url)
    router.kv.block_size = spec.block_size
    salt = engine_salt(tenant) if router.config.tenant_cache_salt else None
    for h in blockhash.prompt_hashes(tokens, spec.block_size, salt=salt):
        router.kv.blocks.add(h, bit)


def held_tokens(w: Any, engine: str = "d0") -> list[int]:
    """The tokens of what `engine` pins on the fabric (its last retained request's)."""
    held = [h.tokens for (e, _r), h in w.fabric.held.items() if e == engine]
    return held[-1]
