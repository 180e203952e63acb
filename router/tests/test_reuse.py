"""The reuse decision (hit, partial, rejected), the per-block hashes behind it, and the block
size the router learns from an engine's metrics: pure, table-tested."""

from __future__ import annotations

import json
import zlib
from typing import Any

import pytest

from boomerang.router import conversation as conv
from boomerang.router import params_codec
from boomerang.router.engines.health import block_size_from_metrics
from boomerang.router.turn.reuse import decide, narrowed

B = 4
HELD = list(range(100, 120))
"""D holds 20 tokens: 5 whole blocks of 4."""
BLOCKS = [50, 51, 52, 53, 54]


def params(groups: Any = None, n: int = len(HELD)) -> dict[str, Any]:
    return {
        "do_remote_decode": True,
        "remote_block_ids": [BLOCKS] if groups is None else groups,
        "remote_engine_id": "d0",
        "remote_request_id": "r1",
        "remote_num_tokens": n,
    }


def handle(block_size: int = B, p: dict[str, Any] | None = None) -> conv.Handle:
    h = conv.build_handle(p or params(), HELD, "http://d", 0.0, block_size)
    assert h is not None
    return h


def diverge_at(i: int, length: int = 30) -> list[int]:
    """D's ids up to position i, then other ids, `length` in all."""
    return HELD[:i] + [7] * (length - i)


# (name, prompt, threshold, outcome, reused blocks)
CASES = [
    ("full hit", [*HELD, 1, 2], 64, "hit", None),
    ("divergence inside block 2 reuses 2 blocks", diverge_at(9), 8, "partial", 2),
    ("divergence at a block boundary", diverge_at(12), 8, "partial", 3),
    ("divergence inside the first block", diverge_at(2), 0, "rejected", 0),
    ("divergence at the very first token", diverge_at(0), 0, "rejected", 0),
    ("common prefix below the threshold", diverge_at(9), 9, "rejected", 0),
    ("threshold 0 still needs a whole block", diverge_at(3), 0, "rejected", 0),
    ("regenerated turn: a prefix of D's ids", HELD[:14], 4, "partial", 3),
    ("prompt equal to D's ids: P computes the last block", list(HELD), 4, "partial", 4),
    ("prompt inside the first block", HELD[:3], 0, "rejected", 0),
    ("one whole block, nothing after it", HELD[:4], 0, "rejected", 0),
    ("one whole block, one token after it", HELD[:5], 0, "partial", 1),
    ("a longer prompt that diverges late", [*HELD[:19], 0, 1], 4, "partial", 4),
    ("empty prompt", [], 0, "rejected", 0),
]


@pytest.mark.parametrize(
    ("prompt", "threshold", "outcome", "k"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_decide(prompt: list[int], threshold: int, outcome: str, k: int | None) -> None:
    reuse = decide(handle(), prompt, threshold)
    assert reuse.outcome == outcome
    if outcome == "hit":
        assert reuse.params == params() and reuse.tokens == len(HELD)
    elif outcome == "partial":
        assert k is not None
        assert reuse.tokens == k * B
        cut = {"remote_block_ids": [BLOCKS[:k]], "remote_num_tokens": k * B}
        assert reuse.params == {**params(), **cut}
        assert reuse.tokens < len(prompt)  # P computes at least one token
        assert prompt[: reuse.tokens] == HELD[: reuse.tokens]  # the exact prefix, nothing more
    else:
        assert reuse.params is None and reuse.tokens == 0


def test_partial_reuse_can_be_turned_off() -> None:
    assert decide(handle(), diverge_at(13), 0, partial=False).outcome == "rejected"
    assert decide(handle(), [*HELD, 1], 0, partial=False).outcome == "hit"


def test_unknown_block_size_allows_full_hits_only() -> None:
    h = handle(block_size=0)
    assert h.block_hashes == b""
    assert decide(h, [*HELD, 1], 0).outcome == "hit"
    assert decide(h, diverge_at(13), 0).outcome == "rejected"


def test_several_kv_cache_groups_allow_full_hits_only() -> None:
    two = params([BLOCKS, [60, 61, 62, 63, 64]])
    assert conv.usable_block_size(two, B) == (0, "groups")
    h = handle(block_size=0, p=two)
    assert decide(h, [*HELD, 1], 0).outcome == "hit"
    assert decide(h, diverge_at(13), 0).outcome == "rejected"
    # Even with hashes (a handle made some other way), several groups are never narrowed.
    forced = handle(p=two)
    assert decide(forced, diverge_at(13), 0).outcome == "rejected"
    assert narrowed(two, 2, B) is None


def test_usable_block_size_checks_the_block_count_against_the_tokens() -> None:
    assert conv.usable_block_size(params(), B) == (B, None)
    assert conv.usable_block_size(params(), None) == (0, "unknown_block_size")
    assert conv.usable_block_size(params(), 0) == (0, "unknown_block_size")
    assert conv.usable_block_size(params(), 16) == (0, "block_count")  # a stale size
    assert conv.usable_block_size(params([BLOCKS[:4]], n=12), B) == (0, "block_count")  # extra
    assert conv.usable_block_size(params([BLOCKS], n=17), B) == (B, None)  # last block partial
    assert conv.usable_block_size(params([1, 2, 3]), B) == (0, "groups")


def test_non_token_ids_are_rejected() -> None:
    assert decide(handle(), ["a", "b", "c", "d", "e"], 0).outcome == "rejected"  # type: ignore[list-item]
    assert decide(handle(), [-1] * 30, 0).outcome == "rejected"
    assert decide(handle(), [2**40] * 30, 0).outcome == "rejected"


def test_block_hashes_are_chained_and_cover_whole_blocks_only() -> None:
    hashes = conv.block_hashes(HELD[:18], B)
    assert len(hashes) == 4 * conv.BLOCK_DIGEST_BYTES  # the 2 trailing ids are not hashed
    changed = conv.block_hashes([0, *HELD[1:18]], B)
    d = conv.BLOCK_DIGEST_BYTES
    # A different first block changes every later digest: each commits to its whole prefix.
    assert all(hashes[i : i + d] != changed[i : i + d] for i in range(0, len(hashes), d))
    # The same block after a different prefix has a different digest.
    assert conv.block_hashes(HELD[4:8], B) != hashes[d : 2 * d]
    assert conv.block_hashes(HELD, 0) == b""


def test_handles_round_trip_and_old_five_field_handles_still_decode() -> None:
    h = handle()
    assert len(h.block_hashes) == 5 * conv.BLOCK_DIGEST_BYTES
    assert conv.Handle.decode(h.encode()) == h
    old = json.dumps(json.loads(h.encode())[:5]).encode()  # what earlier versions wrote
    legacy = conv.Handle.decode(old)
    assert legacy.block_size == 0 and legacy.block_hashes == b""
    assert decide(legacy, [*HELD, 1], 0).outcome == "hit"
    assert decide(legacy, diverge_at(13), 0).outcome == "rejected"


@pytest.mark.parametrize(
    "raw",
    [
        b"[]",
        b'["", "00", 1, "u", 1.0, 4]',  # six fields
        b'["", "00", 20, "u", 1.0, 4, "0011"]',  # hashes that do not fit 5 blocks
        b'["", "00", 20, "u", 1.0, -4, ""]',
        b'["", "00", 20, "u", 1.0, 0, "00112233445566778899"]',
        b"not json",
    ],
)
def test_malformed_handles_fail_cleanly(raw: bytes) -> None:
    with pytest.raises(ValueError, match="malformed handle"):
        conv.Handle.decode(raw)


METRICS = b"""# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="128",cache_dtype="auto",enable_prefix_caching="True"} 1.0
vllm:num_requests_running{engine="0",model_name="m"} 0.0
"""


@pytest.mark.parametrize(
    ("text", "size"),
    [
        (METRICS, 128),
        (b'vllm:cache_config_info{cache_dtype="auto",block_size="16",engine="0"} 1.0\n', 16),
        (
            b'vllm:cache_config_info{block_size="16",engine="0"} 1.0\n'
            b'vllm:cache_config_info{block_size="16",engine="1"} 1.0\n',
            16,
        ),
        (
            b'vllm:cache_config_info{block_size="16",engine="0"} 1.0\n'
            b'vllm:cache_config_info{block_size="32",engine="1"} 1.0\n',
            0,
        ),  # ambiguous
        (b'vllm:cache_config_info{kv_block_size="16"} 1.0\n', 0),
        (b'vllm:cache_config_info{block_size="None"} 1.0\n', 0),
        (b"vllm:num_requests_running 0.0\n", 0),
        (b"", 0),
    ],
)
def test_block_size_comes_from_the_cache_config_gauge(text: bytes, size: int) -> None:
    assert block_size_from_metrics(text) == size


@pytest.mark.parametrize(
    "block_ids",
    [
        [list(range(1000, 1064))],
        [[9, 3, 200_000, 0, 7]],
        [[1, 2, 3], [10, 11], []],
        [],
        None,
        [["a", "b"]],
        [[True, False]],
        [[2**63 - 1, 0]],
        [[-5, 3]],
        [7, 8],
    ],
)
def test_params_come_back_exactly_as_d_sent_them(block_ids: Any) -> None:
    sent = {**params(), "remote_block_ids": block_ids, "remote_blocks_expiry_time": 1.5}
    assert params_codec.unpack(params_codec.pack(sent)) == sent
    without = {k: v for k, v in sent.items() if k != "remote_block_ids"}
    assert params_codec.unpack(params_codec.pack(without)) == without


def test_params_of_handles_stored_by_earlier_versions_still_read() -> None:
    earlier = zlib.compress(json.dumps(params()).encode())  # plain zlib of the JSON object
    assert params_codec.unpack(earlier) == params()


@pytest.mark.parametrize(
    "blob",
    [
        b"garbage",
        zlib.compress(b"[1, 2, 3]"),
        zlib.compress(b'[{"a": 1}, [["x"]]]'),
        zlib.compress(b'[{"a": 1}, 5]'),
        zlib.compress(b"not json"),
    ],
)
def test_unreadable_params_are_a_value_error_and_a_rejected_turn(blob: bytes) -> None:
    with pytest.raises(ValueError):
        params_codec.unpack(blob)
    h = handle()
    broken = conv.Handle(blob, h.prefix_hash, h.num_tokens, "http://d", 0.0, B, h.block_hashes)
    assert decide(broken, [*HELD, 1], 0).outcome == "rejected"
    assert decide(broken, diverge_at(13), 0).outcome == "rejected"
