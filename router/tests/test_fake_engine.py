"""The fake engines themselves: the tokenizer, the fabric's single-use blocks, JSON edge cases."""

from __future__ import annotations

import json
from typing import Any

from aiohttp.test_utils import TestClient, TestServer

from boomerang.router.fake_tokenizer import BOS, END, ROLE_IDS, encode, render_chat
from boomerang.router.testing import EngineSpec, Fabric, FakeEngine

MESSAGES: list[dict[str, Any]] = [
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": [{"type": "text", "text": "héllo 🎉"}, {"type": "image"}]},
    {"role": "assistant", "content": None, "tool_calls": [{"function": {"name": "f"}}, {}]},
    {"role": "tool", "content": "lone \ud800 surrogate"},
    {"content": "no role"},
]


def _reference(messages: list[dict[str, Any]], add_generation_prompt: bool) -> list[int]:
    """The template spelled out: one id per code point, role marker, content, END."""
    ids = [BOS]
    for m in messages:
        content = m.get("content")
        if isinstance(content, list):
            content = "".join(p.get("text", "") for p in content)
        text = (content or "") + "".join(
            f"<call {(c.get('function') or {}).get('name')} "
            f"{(c.get('function') or {}).get('arguments')}>"
            for c in m.get("tool_calls") or ()
        )
        ids += [ROLE_IDS[m.get("role", "user")], *map(ord, text), END]
    return ids + [ROLE_IDS["assistant"]] * add_generation_prompt


def test_render_chat_is_one_id_per_code_point() -> None:
    assert encode("a\U0010ffff\ud800") == [ord("a"), 0x10FFFF, 0xD800]
    for gen in (True, False):
        assert render_chat(MESSAGES, gen) == _reference(MESSAGES, gen)


def test_blocks_are_single_use() -> None:
    fabric = Fabric()
    spec = EngineSpec(role="prefill", engine_id="p", fabric=fabric)
    FakeEngine(spec)._prefill({"max_tokens": 1}, [1, 2, 3], None, "r1")
    assert fabric.read("p", "r1", [1, 2, 3, 4], "decode")
    assert not fabric.held  # a read frees the blocks
    assert not fabric.read("p", "r1", [1, 2, 3, 4], "decode")
    assert fabric.violations == ["decode read freed blocks p/r1"]


async def test_json_that_orjson_refuses_is_still_served() -> None:
    spec = EngineSpec(role="prefill", engine_id="p", fabric=Fabric())
    async with TestClient(TestServer(FakeEngine(spec).app())) as client:
        body = json.dumps({"prompt": "x\ud800", "add_special_tokens": False})
        resp = await client.post("/tokenize", data=body)
        assert resp.status == 200
        assert resp.headers["Content-Type"] == "application/json"
        assert (await resp.json())["tokens"] == [ord("x"), 0xD800]
