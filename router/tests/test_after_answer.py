"""What a turn does after its answer survives a client that leaves at `[DONE]`.

The router runs with handler cancellation (a client that leaves stops the engine calls), and
many streaming clients close the connection as soon as they read `[DONE]`, while the handler
still files D's new handle (a Redis round trip) and hands the old one over for release. Found
by the agent benchmark on the real CPU engines: every streamed continue's old handle stayed
pinned on D for its whole TTL, because the release was cancelled with the handler. Here the
store answers slowly (as Redis over a network does) and the client hangs up at `[DONE]`.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from router_testing import chat, stream
from test_paths import SLOW_P, _equals, router_of, until

from boomerang.router.app import ROUTER
from boomerang.router.conversation import Handle
from boomerang.router.store import ConversationStore
from boomerang.router.turn.settle import settle

ADAPTIVE = {"tuning": {"mode": "adaptive", "itl_budget_s": 0.05}}  # see test_paths.ADAPTIVE


class SlowStore:
    """The router's store with a round trip before every put and restore."""

    def __init__(self, inner: ConversationStore, delay_s: float) -> None:
        self.inner, self.delay_s = inner, delay_s
        self.puts = 0

    async def put(self, key: bytes, handle: Handle) -> Handle | None:
        await asyncio.sleep(self.delay_s)
        self.puts += 1
        return await self.inner.put(key, handle)

    async def restore(self, key: bytes, handle: Handle, now: float) -> None:
        await asyncio.sleep(self.delay_s)
        await self.inner.restore(key, handle, now)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


async def hang_up_at_done(w: Any, body: dict[str, Any]) -> list[dict[str, Any]]:
    """POST a streamed request on a raw connection and close it the moment `[DONE]` is in."""
    server = w.client.server
    reader, writer = await asyncio.open_connection(server.host, server.port)
    payload = json.dumps({**body, "stream": True}).encode()
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: router\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(payload), payload)
    )
    seen = b""
    while b"data: [DONE]" not in seen:
        chunk = await reader.read(65536)
        assert chunk, f"the stream ended before [DONE]: {seen[-300:]!r}"
        seen += chunk
    writer.close()
    events = []
    for line in seen.split(b"\n"):
        if line.startswith(b"data: {"):
            events.append(json.loads(line[len(b"data: ") :]))
    return events


def _slow_store(w: Any, delay_s: float = 0.2) -> SlowStore:
    router = w.client.server.app[ROUTER]
    router.store = slow = SlowStore(router.store, delay_s)
    return slow


def _text(events: list[dict[str, Any]]) -> str:
    return "".join(c["choices"][0]["delta"].get("content", "") for c in events if c["choices"])


async def test_a_handle_is_filed_although_the_client_left_at_done(world: Any) -> None:
    w = await world(
        prefill_spec={"version": "0.33.0"}, decode_spec={"stream_params": True, "version": "0.33.0"}
    )
    store = _slow_store(w)
    messages = [{"role": "user", "content": "hello there"}]
    events = await hang_up_at_done(w, chat(messages, conversation_id="c"))
    await until(lambda: _counted(w))
    assert store.puts == 1  # the put ran to its end, not cancelled half-way
    messages += [{"role": "assistant", "content": _text(events)}, {"role": "user", "content": "go"}]
    await stream(w, chat(messages, conversation_id="c"))
    assert await w.reuse("hit") == 1  # the next turn found it


async def test_a_continued_turn_supersedes_its_old_handle_although_the_client_left(
    world: Any,
) -> None:
    w = await world(
        prefill_spec={"version": "0.33.0"},
        decode_spec={"stream_params": True, "version": "0.33.0"},
        **ADAPTIVE,
    )
    _, retention = router_of(w, SLOW_P)
    _slow_store(w)
    messages = [{"role": "user", "content": "hello there"}]
    for n in (1, 2):
        events = await hang_up_at_done(w, chat(messages, conversation_id="s"))
        await until(lambda n=n: _counted(w, n))
        messages += [
            {"role": "assistant", "content": _text(events)},
            {"role": "user", "content": "go"},
        ]
    await until(lambda: _equals(w, "continue", 1))
    first, second = retention.filed_handles()
    assert retention.released() == [(first, "superseded")]
    assert second.num_tokens > first.num_tokens


async def _counted(w: Any, handles: int = 1) -> bool:
    return await w.metric("boomerang_router_handles_stored_total") >= handles


async def test_settle_finishes_the_work_and_absorbs_the_callers_cancellation() -> None:
    done: list[str] = []

    async def work() -> str:
        await asyncio.sleep(0.05)
        done.append("work")
        return "filed"

    async def handler() -> str:
        result = await settle(work())
        done.append("handler")
        return result

    task = asyncio.ensure_future(handler())
    await asyncio.sleep(0.01)
    task.cancel()  # the client left while the handle was being filed
    assert await task == "filed"
    assert done == ["work", "handler"]


async def test_settle_raises_when_the_work_itself_is_cancelled() -> None:
    async def work() -> None:
        raise asyncio.CancelledError

    try:
        await settle(work())
    except asyncio.CancelledError:
        return
    raise AssertionError("a cancelled work must not look done")
