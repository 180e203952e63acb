"""What P will still hold when a queued turn's prefill starts (`forgetting.py`): table tests
of the LRU estimate, and the router's use of it with the KV index's snapshot."""

from __future__ import annotations

import pytest

from boomerang.router.engines.endpoints import Endpoint, Prefilling
from boomerang.router.learning.forgetting import kept_tokens


@pytest.mark.parametrize(
    ("cached", "ahead", "capacity", "block", "kept"),
    [
        (4096, 0, 200, 128, 4096),  # nothing queued: the snapshot stands
        (4096, 10_000, None, 128, 4096),  # P's KV size unknown: the snapshot stands
        (4096, 10_000, 200, None, 4096),  # block size unknown: the snapshot stands
        (4096, 10_000, 1000, 128, 4096),  # the queue fits in the rest of P's KV
        (4096, 128 * 170, 200, 128, 128 * 30),  # 170 of 200 blocks go to the queue: tail lost
        (4096, 128 * 200, 200, 128, 0),  # the queue alone fills P's KV: all gone
        (4096, 10**7, 200, 128, 0),
        (4100, 0, 200, 128, 4100),  # unchanged when nothing is queued
        (0, 5000, 200, 128, 0),
        (4096, 1, 32, 128, 128 * 31),  # one token queued takes a whole block
    ],
)
def test_kept_tokens(cached: int, ahead: float, capacity: int | None, block: int | None, kept: int):
    assert kept_tokens(cached, ahead, capacity, block) == kept


def test_more_queued_never_keeps_more() -> None:
    kept = [kept_tokens(8192, a, 100, 128) for a in range(0, 20_000, 500)]
    assert kept == sorted(kept, reverse=True)
    assert kept[0] == 8192 and kept[-1] == 0


def test_a_continued_turns_prefill_counts_on_its_decoder_until_its_first_token() -> None:
    """D's queue of its own prefills (`Endpoint.prefilling`, what the plan's continue limit
    adds the turn's suffix to): counted from the call to the first token, once."""
    ep = Endpoint("http://d0", "decode")
    with Prefilling(ep, 300) as own:
        assert ep.prefilling == 300
        own.done()
        own.done()
        assert ep.prefilling == 0
    assert ep.prefilling == 0
    with pytest.raises(RuntimeError), Prefilling(ep, 50):
        assert ep.prefilling == 50
        raise RuntimeError("D failed before its first token")
    assert ep.prefilling == 0
