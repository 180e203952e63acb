"""The streamed-answer relay on its own: SSE bytes cut into events however they arrive, what the
router collects from D's chunks (the ids that become the next turn's verified history, the
final chunk's params) and what the client sees (D's bytes when nothing is stripped, never the
engine's fields), fed with scripted engine streams instead of a fake engine."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from boomerang.router.apis import sse
from boomerang.router.engines.upstream import EngineStream, UpstreamError
from boomerang.router.turn.decode import DecodeResult, StreamRelay

D_PARAMS = {"do_remote_decode": True, "remote_block_ids": [[4, 5]], "remote_num_tokens": 31}


def chunk(text: str | None, ids: list[int] | None, finish: str | None = None) -> dict[str, Any]:
    """A vLLM chat chunk (`text` None: the first, with the role and the prompt's ids)."""
    choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": finish}
    choice["delta"] = {"role": "assistant", "content": ""} if text is None else {"content": text}
    out: dict[str, Any] = {"id": "r", "object": "chat.completion.chunk", "created": 0}
    out["model"] = "m"
    out["choices"] = [choice]
    if text is None:
        if ids is not None:
            out["prompt_token_ids"] = ids
    elif ids is not None:
        choice["token_ids"] = ids
    return out


def vllm_stream(reply: str, *, params: bool = True, ids: bool = True) -> bytes:
    """A whole stream as vLLM sends it: one event per character-token, params on the last."""
    events = [chunk(None, [1, 2, 3] if ids else None)]
    for i, ch in enumerate(reply):
        last = i == len(reply) - 1
        events.append(chunk(ch, [ord(ch)] if ids else None, "stop" if last else None))
    if params:
        events[-1]["kv_transfer_params"] = D_PARAMS
    return b"".join(sse.event(e) for e in events) + sse.DONE_EVENT


# -- EventSplitter -----------------------------------------------------------------------------


def split_all(pieces: list[bytes]) -> list[bytes]:
    splitter = sse.EventSplitter()
    out = [data for piece in pieces for data in splitter.feed(piece)]
    return out + splitter.close()


def test_events_are_the_same_however_the_bytes_are_cut() -> None:
    raw = vllm_stream("héllo ✓ 🙂")  # multi-byte characters get cut mid-character too
    whole = split_all([raw])
    assert len(whole) == 1 + len("héllo ✓ 🙂") + 1 and whole[-1] == b"[DONE]"
    assert split_all([raw[i : i + 1] for i in range(len(raw))]) == whole
    for size in (2, 3, 7, 64):
        assert split_all([raw[i : i + size] for i in range(0, len(raw), size)]) == whole
    assert split_all([e + b"\n\n" for e in raw.split(b"\n\n")[:-1]]) == whole  # a read each
    decoded = [sse.decode(d) for d in whole]
    assert decoded[-1] is sse.DONE
    assert "".join(c["choices"][0]["delta"]["content"] for c in decoded[:-1]) == "héllo ✓ 🙂"


def test_crlf_lines_multi_line_data_comments_and_blank_lines() -> None:
    raw = b': keep-alive\r\n\r\ndata: {"a":\r\ndata:  1}\r\n\r\n\r\n\r\nevent: x\ndata: [DONE]\n\n'
    expected = [b'{"a":\n1}', b"[DONE]"]
    assert split_all([raw]) == expected
    assert split_all([raw[i : i + 1] for i in range(len(raw))]) == expected
    assert sse.decode(expected[0]) == {"a": 1}


def test_a_stream_ending_without_a_blank_line_still_ends_its_event() -> None:
    assert split_all([b"data: {}\n\ndata: [DO", b"NE]"]) == [b"{}", b"[DONE]"]
    assert split_all([b"data: 1\n"]) == [b"1"]
    assert split_all([b""]) == []


def test_a_long_event_in_many_reads_is_joined_once() -> None:
    big = sse.event({"prompt_token_ids": list(range(40_000))})
    pieces = [big[i : i + 1000] for i in range(0, len(big), 1000)]
    splitter = sse.EventSplitter()
    assert all(splitter.feed(p) == [] for p in pieces[:-1])
    assert splitter.feed(pieces[-1]) == [big[6:-2]]


# -- StreamRelay ---------------------------------------------------------------------------------


class ScriptedStream:
    """An engine stream that delivers the given pieces, one read each, to the callbacks it is
    diverted to (an Exception piece ends it with that failure, an Event is waited for)."""

    status = 200

    def __init__(self, pieces: list[Any]) -> None:
        self.pieces = pieces
        self.task: asyncio.Task[None] | None = None
        self.reading = asyncio.Event()
        self.reading.set()
        self.pauses = 0

    def divert(self, on_data: Any, on_end: Any) -> None:
        self.task = asyncio.get_running_loop().create_task(self._deliver(on_data, on_end))

    async def _deliver(self, on_data: Any, on_end: Any) -> None:
        for piece in self.pieces:
            await asyncio.sleep(0)  # each piece is a read of its own
            await self.reading.wait()
            if isinstance(piece, BaseException):
                on_end(piece)
                return
            if isinstance(piece, asyncio.Event):
                await piece.wait()
                continue
            on_data(piece)
        on_end(None)

    def pause_reading(self) -> None:
        self.pauses += 1
        self.reading.clear()

    def resume_reading(self) -> None:
        self.reading.set()


async def relay(
    pieces: list[Any],
    keep_ids: bool = False,
    on_client: Any = None,
    stream: Any = None,
    on_request: Any = None,
    make: Any = None,
) -> tuple[bytes | UpstreamError, DecodeResult | None]:
    """Run a StreamRelay (or what `make()` returns) in a real aiohttp server; (what the client
    got, the result). `on_request` sees the server's request before the relay runs."""
    results: list[DecodeResult] = []
    stream = cast(EngineStream, stream or ScriptedStream(pieces))

    async def handler(request: web.Request) -> web.StreamResponse:
        if on_request is not None:
            on_request(request)
        try:
            made = make() if make is not None else StreamRelay(keep_ids, lambda: None)
            result = await made.run(request, stream, 2.0)
        except UpstreamError as exc:
            return web.Response(status=502, text=f"{exc.kind}: {exc}")
        results.append(result)
        assert result.response is not None
        return result.response

    app = web.Application()
    app.router.add_get("/", handler)
    async with TestClient(TestServer(app)) as client:
        resp = await client.get("/")
        if resp.status == 502:
            kind, message = (await resp.text()).split(": ", 1)
            return UpstreamError(kind, message), None  # type: ignore[arg-type]
        if on_client is not None:
            await on_client(resp)
        return await resp.read(), results[0]


def client_events(raw: bytes) -> list[Any]:
    data = split_all([raw])
    assert data[-1] == b"[DONE]"
    return [orjson.loads(d) for d in data[:-1]]


async def test_ids_and_params_are_collected_and_never_reach_the_client() -> None:
    raw = vllm_stream("héllo 🙂")
    got, result = await relay([raw[i : i + 5] for i in range(0, len(raw), 5)])
    assert isinstance(got, bytes) and result is not None
    assert result.prompt_ids == [1, 2, 3]
    assert result.output_ids == [ord(c) for c in "héllo 🙂"]
    assert result.params == D_PARAMS and result.finished
    assert result.reply == {"role": "assistant", "content": "héllo 🙂", "tool_calls": None}
    assert b"token_ids" not in got and b"kv_transfer_params" not in got
    events = client_events(got)
    assert "".join(e["choices"][0]["delta"]["content"] for e in events) == "héllo 🙂"
    assert events[-1]["choices"][0]["finish_reason"] == "stop"


async def test_a_client_that_asked_for_ids_gets_d_s_own_bytes() -> None:
    raw = vllm_stream("abc", params=False)
    got, result = await relay([raw], keep_ids=True)
    assert got == raw  # nothing to strip: passed through byte for byte
    raw = vllm_stream("abc")
    got, result = await relay([raw], keep_ids=True)
    assert isinstance(got, bytes) and result is not None and result.params == D_PARAMS
    events = client_events(got)
    assert [e["choices"][0].get("token_ids") for e in events[1:]] == [[97], [98], [99]]
    assert events[0]["prompt_token_ids"] == [1, 2, 3]
    assert b"kv_transfer_params" not in got


async def test_chunks_without_ids_and_a_params_only_final_chunk() -> None:
    body = vllm_stream("xy", params=False, ids=False)
    final = sse.event({"id": "r", "choices": [], "kv_transfer_params": D_PARAMS})
    got, result = await relay([body[: -len(sse.DONE_EVENT)], final, sse.DONE_EVENT])
    assert isinstance(got, bytes) and result is not None
    assert result.params == D_PARAMS and result.output_ids == [] and result.prompt_ids is None
    assert got == body  # nothing to strip, and the params-only chunk is not for the client
    usage = sse.event({"id": "r", "choices": [], "usage": {"total_tokens": 3}})
    got, _ = await relay([body[: -len(sse.DONE_EVENT)], usage, sse.DONE_EVENT])
    assert got == body[: -len(sse.DONE_EVENT)] + usage + sse.DONE_EVENT


async def test_a_multi_line_event_is_written_as_one_line() -> None:
    event = b'data: {"id": "r",\ndata: "choices": [{"index": 0, "delta": {"content": "a"}}]}\n\n'
    got, result = await relay([event, sse.DONE_EVENT], keep_ids=True)
    assert isinstance(got, bytes) and result is not None
    one_line = sse.event({"id": "r", "choices": [{"index": 0, "delta": {"content": "a"}}]})
    assert got == one_line + sse.DONE_EVENT
    lone_cr = b'data: {"id": "r",\r"choices": [{"index": 0, "delta": {"content": "a"}}]}\n\n'
    got, _ = await relay([lone_cr, sse.DONE_EVENT], keep_ids=True)  # a CR ends an SSE line
    assert got == one_line + sse.DONE_EVENT
    assert result.reply is not None and result.reply["content"] == "a"


def after_first_token(raw: bytes) -> int:
    """Where the first generated token's event ends (the role's event comes before it)."""
    return raw.index(b"\n\n", raw.index(b"\n\n") + 2) + 2


async def test_each_read_is_written_before_the_next_arrives() -> None:
    raw = vllm_stream("ab")
    cut = after_first_token(raw)  # the role's event and the first token's
    more = asyncio.Event()

    async def client_reads_first(resp: Any) -> None:
        first = await asyncio.wait_for(resp.content.readuntil(b"\n\n"), 2.0)
        assert orjson.loads(first[6:])["choices"][0]["delta"]["role"] == "assistant"
        more.set()

    _, result = await relay([raw[:cut], more, raw[cut:]], on_client=client_reads_first)
    assert result is not None and result.output_ids == [97, 98]


async def test_events_after_done_are_ignored_and_a_missing_done_is_added() -> None:
    raw = vllm_stream("a")
    got, result = await relay([raw + b"data: not json\n\n"])
    assert isinstance(got, bytes) and got.endswith(sse.DONE_EVENT) and b"not json" not in got
    got, result = await relay([raw[: -len(sse.DONE_EVENT)]])
    assert isinstance(got, bytes) and got.endswith(sse.DONE_EVENT)
    assert result is not None and result.params == D_PARAMS


@pytest.mark.parametrize(
    ("pieces", "kind"),
    [
        ([], "protocol"),
        ([b": only a comment\n\n"], "protocol"),
        ([b"data: {not json\n\n"], "protocol"),
        ([UpstreamError("timeout", "past the limit")], "timeout"),
    ],
)
async def test_failures_before_the_first_event_are_upstream_errors(
    pieces: list[Any], kind: str
) -> None:
    got, result = await relay(pieces)
    assert isinstance(got, UpstreamError) and got.kind == kind and result is None


async def test_a_failure_mid_stream_ends_it_with_an_error_event() -> None:
    raw = vllm_stream("abc")
    cut = after_first_token(raw)
    for failure in (b"data: {broken\n\n", UpstreamError("protocol", "connection lost")):
        got, result = await relay([raw[:cut], failure])
        assert isinstance(got, bytes) and result is not None and not result.finished
        events = [orjson.loads(d) for d in split_all([got])]
        assert events[0]["choices"][0]["delta"]["role"] == "assistant"
        assert events[-1]["error"]["code"] == 502


async def test_d_is_not_read_while_the_client_is_behind_and_the_client_gets_every_byte() -> None:
    big = "x" * 65536
    events = [chunk(None, [1])] + [chunk(big, [i]) for i in range(256)]  # 16 MiB
    raw = b"".join(sse.event(e) for e in events) + sse.DONE_EVENT
    stream = ScriptedStream([sse.event(e) for e in events] + [sse.DONE_EVENT])

    async def client_waits_for_the_pause(resp: Any) -> None:
        for _ in range(500):  # past the socket buffers, the relay pauses D
            if stream.pauses:
                return
            await asyncio.sleep(0.01)

    got, result = await relay(
        [], keep_ids=True, on_client=client_waits_for_the_pause, stream=stream
    )
    assert stream.pauses > 0
    assert got == raw and result is not None and result.output_ids == list(range(256))


async def test_d_is_read_again_when_its_stream_ends_while_the_client_is_behind() -> None:
    events = [chunk(None, [1]), chunk("a", [2]), chunk("x" * (8 << 20), [3])]  # past the buffers
    stream = ScriptedStream([sse.event(e) for e in events])  # no [DONE]: the body just ends

    async def client_reads_late(resp: Any) -> None:
        await asyncio.sleep(0.2)

    got, result = await relay([], keep_ids=True, on_client=client_reads_late, stream=stream)
    assert isinstance(got, bytes) and got.endswith(sse.DONE_EVENT) and result is not None
    assert stream.pauses > 0 and stream.reading.is_set()  # the connection can be reused


async def test_the_handler_task_does_not_wake_per_read(monkeypatch: pytest.MonkeyPatch) -> None:
    raw = vllm_stream("abcdefghijklmnop")
    reads = [event + b"\n\n" for event in raw.split(b"\n\n")[:-1]]  # one event per read
    waits = 0
    wait = StreamRelay._wait

    async def counted(self: StreamRelay) -> None:
        nonlocal waits
        waits += 1
        await wait(self)

    monkeypatch.setattr(StreamRelay, "_wait", counted)
    got, result = await relay(reads)
    assert isinstance(got, bytes) and result is not None and len(result.output_ids) == 16
    assert len(reads) == 18 and waits <= 3  # the first event, then the end: not one per read


async def test_the_headers_leave_with_the_first_event() -> None:
    """One write for the headers and D's first events up to its first token (a send and a
    segment fewer per streamed turn), then one per read of D's stream."""
    raw = vllm_stream("ab")
    cut = after_first_token(raw)
    writes: list[bytes] = []

    def spy_on_writes(request: web.Request) -> None:
        transport = cast(Any, request.transport)
        write, writelines = transport.write, transport.writelines
        transport.write = lambda data: (writes.append(bytes(data)), write(data))[1]
        transport.writelines = lambda parts: (writes.append(b"".join(parts)), writelines(parts))

    got, _ = await relay([raw[:cut], raw[cut:]], on_request=spy_on_writes)
    assert isinstance(got, bytes) and client_events(got)[0]["choices"][0]["delta"]["role"]
    head, first = writes[0].split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 200") and b"text/event-stream" in head
    assert b'"role":"assistant"' in first and len(writes) == 2


def error_chunk(code: int = 500) -> bytes:
    """vLLM's in-band error, as its stream reports an exception under a 200."""
    error = {"message": "KV load failed", "type": "InternalServerError", "code": code}
    return sse.event({"error": error})


@pytest.mark.parametrize(
    ("pieces", "kind"),
    [
        ([sse.event(chunk(None, [1])), error_chunk(), sse.DONE_EVENT], "status"),
        ([error_chunk(), sse.DONE_EVENT], "status"),
        ([sse.event(chunk(None, [1])), error_chunk(400), sse.DONE_EVENT], "client"),
        ([sse.event(chunk(None, [1])), sse.event(chunk("", None, "error"))], "status"),
        ([sse.event(chunk(None, [1])), sse.event(chunk("", [], "stop")), sse.DONE_EVENT],
         "protocol"),
        ([sse.event(chunk(None, [1])), sse.DONE_EVENT], "protocol"),
        ([sse.event(chunk(None, [1]))], "protocol"),
    ],
)  # fmt: skip
async def test_an_error_or_an_end_before_the_first_token_never_reaches_the_client(
    pieces: list[Any], kind: str
) -> None:
    """vLLM reports a failure in-band under its 200 (an error event, a finish reason `error`):
    before D generated a token that is an UpstreamError the flow retries elsewhere, and the
    client has no byte of it, never an empty 200. So is a stream that ends, or finishes
    with no token, before its first token."""
    got, result = await relay(pieces)
    assert isinstance(got, UpstreamError) and got.kind == kind and result is None


async def test_an_answer_whose_only_token_ended_it_is_a_whole_answer() -> None:
    """The model may end its answer at once (its end-of-sequence token, no text): D generated
    a token and finished, so it is served as it is, not retried."""
    eos = chunk("", [2], "stop")
    got, result = await relay([sse.event(chunk(None, [1])), sse.event(eos), sse.DONE_EVENT])
    assert isinstance(got, bytes) and result is not None and result.finished
    assert result.finish_reason == "stop" and result.output_ids == [2]
    assert client_events(got)[-1]["choices"][0]["finish_reason"] == "stop"


async def test_an_in_band_error_after_the_first_token_ends_the_stream_not_finished() -> None:
    raw = vllm_stream("abc")
    got, result = await relay([raw[: after_first_token(raw)], error_chunk(), sse.DONE_EVENT])
    assert isinstance(got, bytes) and result is not None and not result.finished
    assert client_events(got)[-1]["error"]["code"] == 500


async def test_a_reasoning_only_or_id_less_answer_is_a_whole_answer() -> None:
    """Reasoning text is generated output; and without token ids in D's chunks (one engine
    alone gets a plain request) a finish other than `error` means a token was generated."""
    thinking = chunk("", None)
    thinking["choices"][0]["delta"] = {"reasoning_content": "hmm"}
    pieces = [sse.event(chunk(None, None)), sse.event(thinking), sse.DONE_EVENT]
    got, result = await relay(pieces)
    assert isinstance(got, bytes) and result is not None
    pieces = [sse.event(chunk(None, None)), sse.event(chunk("", None, "length")), sse.DONE_EVENT]
    got, result = await relay(pieces)
    assert isinstance(got, bytes) and result is not None and result.finished
