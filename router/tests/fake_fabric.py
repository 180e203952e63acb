"""The fake NIXL world of the fake engines: blocks that remember their tokens, checked reads.

Why it exists: a real engine trusts whatever block ids and token count a handle names, and
reading the wrong blocks is silent (wrong KV, plausible text). Here every block an engine holds
for a remote reader remembers the exact token ids whose KV it holds, and every read is checked
against the reader's prompt, position by position, through the block ids it was given: a read
of freed blocks, of blocks it was not given, past the blocks it was given, of more tokens than
they hold, or of blocks holding other tokens than the reader's prompt, is recorded in
`violations`. So is a prefill that would pull its whole prompt (P must compute at least one
token). Tests assert the list stays empty.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass
class Held:
    """Blocks an engine holds for a remote reader (until it reads them or they expire)."""

    tokens: list[int]
    expires_at: float
    block_ids: list[int] = field(default_factory=list)
    """The blocks, in order; block i holds tokens[i * block_size : (i + 1) * block_size]."""
    block_size: int = 16

    def __post_init__(self) -> None:
        if not self.block_ids:
            self.block_ids = list(range(-(-len(self.tokens) // self.block_size)))

    def block_tokens(self, block_id: int) -> list[int] | None:
        """The token ids whose KV this block holds (None: not one of these blocks)."""
        try:
            i = self.block_ids.index(block_id)
        except ValueError:
            return None
        b = self.block_size
        return self.tokens[i * b : (i + 1) * b]


@dataclass
class Fabric:
    """The fake NIXL world shared by the fake engines of one test."""

    held: dict[tuple[str, str], Held] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)
    pulls: list[tuple[str, int]] = field(default_factory=list)
    """(reader role, tokens it pulled) per read that moved KV."""
    declined: int = 0

    def read(
        self,
        engine_id: str,
        request_id: str,
        want: list[int],
        who: str,
        block_ids: Sequence[int] | None = None,
        num_tokens: int | None = None,
    ) -> bool:
        """A remote read of the first min(num_tokens, len(want)) tokens of `want` through
        `block_ids` (default: all the held blocks and tokens); True when KV really moved."""
        # A read (or a decision not to read) frees the blocks: a second read finds nothing.
        blocks = self.held.pop((engine_id, request_id), None)
        if blocks is None:
            self.violations.append(f"{who} read freed blocks {engine_id}/{request_id}")
            return False
        if time.perf_counter() > blocks.expires_at - 5.0:
            self.declined += 1
            return False
        ids = blocks.block_ids if block_ids is None else list(block_ids)
        limit = len(blocks.tokens) if num_tokens is None else num_tokens
        n = min(limit, len(want))
        problem = self._check(blocks, ids, limit, want[:n], who == "prefill" and n >= len(want))
        if problem is not None:
            self.violations.append(f"{who} {problem}")
            return False
        self.pulls.append((who, n))
        return True

    @staticmethod
    def _check(
        blocks: Held, ids: list[int], limit: int, wanted: list[int], whole_prompt: bool
    ) -> str | None:
        """What is wrong with reading `wanted` through `ids` (None: nothing)."""
        if whole_prompt:
            return "read its whole prompt: nothing left to compute"
        if limit > len(blocks.tokens):
            return f"read {limit} tokens of blocks holding {len(blocks.tokens)}"
        b = blocks.block_size
        for i in range(0, len(wanted), b):
            if i // b >= len(ids):
                return f"read past the {len(ids)} blocks it was given"
            held = blocks.block_tokens(ids[i // b])
            if held is None:
                return f"read block {ids[i // b]}, which is not one of the handle's blocks"
            piece = wanted[i : i + b]
            if held[: len(piece)] != piece:
                return "read blocks holding another token prefix"
        return None
