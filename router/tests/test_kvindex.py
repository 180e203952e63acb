"""The KV index (`kvindex.py`) against a dict of sets, under every sequence of stores and
evictions hypothesis finds; its size per block; and vLLM's block hashes (`blockhash.py`)."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from boomerang.router.engines import blockhash
from boomerang.router.engines.kvindex import MAX_ENGINES, BlockIndex, Engines

ops = st.lists(
    st.tuples(
        st.sampled_from(["add", "remove", "drop"]),
        st.integers(0, 40),  # few hashes: many collisions in a small table
        st.integers(0, 3),
    ),
    max_size=300,
)


@settings(max_examples=300, deadline=None)
@given(ops)
def test_the_index_answers_as_a_dict_of_sets(seq) -> None:
    index, model = BlockIndex(), {}
    for op, h, bit in seq:
        h *= 1024  # same home slot for many hashes: long probe runs, shifted deletions
        if op == "add":
            index.add(h, bit)
            model.setdefault(h, set()).add(bit)
        elif op == "remove":
            index.remove(h, bit)
            model.get(h, set()).discard(bit)
        else:
            index.drop_engine(bit)
            for held in model.values():
                held.discard(bit)
        model = {k: v for k, v in model.items() if v}
        assert len(index) == len(model)
    for h in range(0, 41 * 1024, 1024):
        assert index.holders(h) == sum(1 << b for b in model.get(h, ()))


def test_prefixes_count_the_leading_blocks_each_engine_holds() -> None:
    index = BlockIndex()
    for h in (1, 2, 3):
        index.add(h, 0)  # engine 0: the first three blocks
    index.add(1, 1)  # engine 1: the first only
    index.add(2, 2)  # engine 2: not the first: nothing usable
    assert index.prefixes([1, 2, 3, 4], [0, 1, 2, 3]) == {0: 3, 1: 1, 2: 0, 3: 0}
    assert index.prefixes([1, 2], [0]) == {0: 2}


def test_a_million_blocks_fit_in_32_mb() -> None:
    index = BlockIndex()
    rng = random.Random(7)
    for _ in range(1_000_000):
        index.add(rng.getrandbits(64), rng.randrange(8))
    assert len(index) >= 999_000
    assert index.nbytes <= 32 * 2**20  # 32 bytes a block at worst, well under 64 MB


def test_engines_get_bits_up_to_64_and_reuse_released_ones() -> None:
    engines = Engines()
    bits = [engines.bit(f"http://e{i}") for i in range(MAX_ENGINES)]
    assert sorted(bits) == list(range(MAX_ENGINES)) and engines.bit("http://one-more") is None
    assert engines.release("http://e5") == 5 and engines.bit("http://new") == 5


def test_block_hashes_are_vllms() -> None:
    """Hashes vLLM 0.32's CPU engine published for ids 100..355 at block size 128 (its KV
    events, default sha256 and seed)."""
    ids = list(range(100, 400))
    assert blockhash.prompt_hashes(ids, 128) == [3581396769925457741, 15085932068797016924]
    assert blockhash.verify_stored([3581396769925457741], ids[:128], 128)
    assert not blockhash.verify_stored([3581396769925457741], ids[1:129], 128)
    assert blockhash.prompt_hashes(ids, 128, seed="other") != blockhash.prompt_hashes(ids, 128)
