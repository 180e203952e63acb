"""What the router's KV index costs: bytes a block, and the time of an event and of a lookup.

    make bench-kvindex                 # a million blocks over 16 engines

Fills `kvindex.BlockIndex` with a million random 64-bit block hashes spread over 16 engines
(as `kvevents.Index` does from `BlockStored` events), then times: applying a stored event
(128 blocks), a removal, naming a prompt's blocks as vLLM does (the router hashes an
8k-token prompt's 64 blocks), and the lookup a turn makes (the longest prefix on every
engine). It prints the table; the times are CPU time on this machine, the bytes exact.
"""

from __future__ import annotations

import argparse
import random
import time

from boomerang.router.engines import blockhash
from boomerang.router.engines.kvindex import BlockIndex

ENGINES = 16


def _per_op(run, n: int) -> float:
    start = time.process_time()
    run()
    return (time.process_time() - start) / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", type=int, default=1_000_000)
    args = ap.parse_args()
    rng = random.Random(1)
    index = BlockIndex()
    hashes = [rng.getrandbits(64) for _ in range(args.blocks)]
    fill = _per_op(lambda: [index.add(h, i % ENGINES) for i, h in enumerate(hashes)], len(hashes))
    prompt = hashes[:64]
    lookups = 2000
    lookup = _per_op(
        lambda: [index.prefixes(prompt, range(ENGINES)) for _ in range(lookups)], lookups
    )
    ids = [rng.randrange(16, 150_000) for _ in range(64 * 128)]
    hashing = _per_op(lambda: [blockhash.prompt_hashes(ids, 128) for _ in range(20)], 20)
    event = [rng.getrandbits(64) for _ in range(128)]
    store = _per_op(lambda: [index.add(h, 3) for h in event], 1)
    remove = _per_op(lambda: [index.remove(h, 3) for h in event], 1)
    print(
        f"blocks {len(index):,} over {ENGINES} engines; tables {index.nbytes / 2**20:.1f} MiB "
        f"({index.nbytes / len(index):.1f} bytes a block)\n"
    )
    print("| operation | CPU time |\n|---|---|")
    print(f"| insert one block (while filling) | {fill * 1e6:.2f} us |")
    print(f"| a BlockStored event of 128 blocks | {store * 1e3:.2f} ms |")
    print(f"| a BlockRemoved event of 128 blocks | {remove * 1e3:.2f} ms |")
    print(f"| naming an 8k-token prompt's 64 blocks (vLLM's hashes) | {hashing * 1e6:.0f} us |")
    print(f"| a turn's lookup: 64-block prompt, {ENGINES} engines | {lookup * 1e6:.0f} us |")


if __name__ == "__main__":
    main()
