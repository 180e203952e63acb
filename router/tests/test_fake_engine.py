"""The fake engines themselves: the tokenizer, the fabric's single-use blocks and checked reads,
the block size they report, JSON edge cases."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from fake_tokenizer import BOS, END, ROLE_IDS, encode, render_chat
from router_testing import EngineSpec, Fabric, FakeEngine, Held

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


def _held_by_d(fabric: Fabric, tokens: list[int]) -> list[int]:
    """D holds `tokens` in 4-token blocks numbered 10, 11, ...; returns their ids."""
    ids = list(range(10, 10 + -(-len(tokens) // 4)))
    fabric.held[("d", "r")] = Held(tokens, float("inf"), ids, 4)
    return ids


HELD_BY_D = list(range(100, 118))  # 4 whole blocks and 2 tokens


@pytest.mark.parametrize(
    ("blocks", "num_tokens", "prompt", "violation"),
    [
        (slice(0, 2), 8, [*HELD_BY_D[:9], 0, 0], None),  # a correctly narrowed handle
        (slice(0, 5), 18, [*HELD_BY_D, 1], None),  # the whole handle, a strict extension
        (slice(2, 4), 8, [*HELD_BY_D[:9], 0, 0], "not one of|another token prefix"),
        (slice(0, 1), 8, [*HELD_BY_D[:9], 0, 0], "past the 1 blocks"),
        (slice(0, 3), 12, [*HELD_BY_D[:9], 0, 0, 0, 0], "another token prefix"),
        (slice(0, 2), 8, HELD_BY_D[:8], "whole prompt"),
        (slice(0, 5), 20, [*HELD_BY_D, 1, 2, 3], "20 tokens of blocks holding 18"),
    ],
)
def test_the_fabric_checks_every_token_a_read_takes(
    blocks: slice, num_tokens: int, prompt: list[int], violation: str | None
) -> None:
    fabric = Fabric()
    ids = _held_by_d(fabric, HELD_BY_D)
    moved = fabric.read("d", "r", prompt, "prefill", ids[blocks], num_tokens)
    if violation is None:
        assert moved and fabric.violations == []
        assert fabric.pulls == [("prefill", min(num_tokens, len(prompt)))]
    else:
        assert not moved and len(fabric.violations) == 1
        assert re.search(violation, fabric.violations[0]), fabric.violations


async def test_the_fake_decoder_reports_its_block_size() -> None:
    from boomerang.router.engines.health import block_size_from_metrics

    spec = EngineSpec(role="decode", engine_id="d", fabric=Fabric(), block_size=128)
    async with TestClient(TestServer(FakeEngine(spec).app())) as client:
        assert block_size_from_metrics(await (await client.get("/metrics")).read()) == 128
        spec.block_size_metric = False
        assert block_size_from_metrics(await (await client.get("/metrics")).read()) == 0
