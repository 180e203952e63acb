"""How long a client asks its prompt's cache to be kept: Anthropic's and OpenAI's hints (pure).

Why it exists: agents say how long their prefix is worth keeping, and in adaptive mode that
becomes the retention of the lease D's blocks are held under for the conversation (`leases.py`),
in place of the learned gap. The hint is a priority, never a pin: it is capped by the
operator's `tuning.retention_max_client_s` (default: the decoder TTL), the handle TTL still
bounds every lease, and a lease with a hint yields to D's memory budget like any other.

- Messages: `cache_control: {"type": "ephemeral", "ttl": "5m" | "1h"}` on `system` blocks,
  `tools` and message content blocks (tool results' inner blocks too); without `ttl`,
  Anthropic's default of 5 minutes. The longest in the request counts (Anthropic orders longer
  TTLs first: it is the one that covers the prefix).
- Chat and Responses: `prompt_cache_retention`, `"in-memory"` (OpenAI's docs: typically kept 5
  to 10 minutes, at most an hour; read as 10 minutes; the SDKs also spell it `"in_memory"`) or
  `"24h"`.
- Anthropic's `ttl` takes only `"5m"` and `"1h"`: any other value gets the 400 Anthropic's own
  API gives, naming the field. OpenAI's field also takes any duration in the same notation
  (`"90s"`, `"30m"`, `"2h"`), read as what it says and capped like the others: a client asking
  for too much gets less, never an error. Only a hint of the wrong shape (not a string, not a
  duration, a `cache_control` that is not an object of type `ephemeral`) is refused with the
  API's own 400 naming the field.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Final

from boomerang.router.errors import bad_request

ANTHROPIC_TTL_S: Final = {"5m": 300.0, "1h": 3600.0}
"""The only `cache_control.ttl` values Anthropic's API takes."""
ANTHROPIC_DEFAULT_S: Final = ANTHROPIC_TTL_S["5m"]
"""Anthropic's `cache_control` without `ttl`: five minutes."""
OPENAI_RETENTION_S: Final = {"in-memory": 600.0, "in_memory": 600.0, "24h": 86_400.0}
_DURATION: Final = re.compile(r"^([1-9][0-9]{0,6})([smh])$")
_UNIT_S: Final = {"s": 1.0, "m": 60.0, "h": 3600.0}


@dataclass(frozen=True, slots=True)
class Retention:
    """A client's retention hint, as asked and as applied."""

    asked_s: float
    applied_s: float

    @property
    def capped(self) -> bool:
        return self.applied_s < self.asked_s


def duration_s(value: Any, where: str) -> float:
    """Seconds of a duration string (`"5m"`, `"1h"`, `"90s"`); a 400 naming `where` else."""
    match = _DURATION.match(value) if isinstance(value, str) else None
    if match is None:
        raise bad_request(
            f'`{where}` must be a duration such as "5m" or "1h", got {value!r}', where
        )
    return int(match.group(1)) * _UNIT_S[match.group(2)]


def openai_hint(data: dict[str, Any]) -> float | None:
    """`prompt_cache_retention` in seconds (None: absent)."""
    value = data.get("prompt_cache_retention")
    if value is None:
        return None
    if isinstance(value, str) and value in OPENAI_RETENTION_S:
        return OPENAI_RETENTION_S[value]
    return duration_s(value, "prompt_cache_retention")


def _marked(data: dict[str, Any]) -> Iterator[tuple[str, Any]]:
    """(where, cache_control) of every object of a Messages request that may carry one."""
    system = data.get("system")
    if isinstance(system, list):
        yield from _blocks(system, "system")
    tools = data.get("tools")
    if isinstance(tools, list):
        yield from _blocks(tools, "tools")
    for i, msg in enumerate(data.get("messages") or ()):
        content = msg.get("content") if isinstance(msg, dict) else None
        if isinstance(content, list):
            yield from _blocks(content, f"messages[{i}].content")


def _blocks(blocks: list[Any], where: str) -> Iterator[tuple[str, Any]]:
    for j, block in enumerate(blocks):
        if not isinstance(block, dict):
            continue
        if "cache_control" in block and block["cache_control"] is not None:
            yield f"{where}[{j}].cache_control", block["cache_control"]
        inner = block.get("content")
        if isinstance(inner, list):  # a tool result's own blocks
            yield from _blocks(inner, f"{where}[{j}].content")


def messages_hint(data: dict[str, Any]) -> float | None:
    """The longest `cache_control` TTL of a Messages request in seconds (None: none marked)."""
    longest: float | None = None
    for where, mark in _marked(data):
        if not isinstance(mark, dict) or mark.get("type") != "ephemeral":
            raise bad_request(
                f'`{where}` must be an object of type "ephemeral" (with an optional `ttl`)',
                where,
            )
        ttl = mark.get("ttl")
        if ttl is not None and ttl not in ANTHROPIC_TTL_S:
            raise bad_request(f'`{where}.ttl` must be "5m" or "1h", got {ttl!r}', f"{where}.ttl")
        seconds = ANTHROPIC_DEFAULT_S if ttl is None else ANTHROPIC_TTL_S[ttl]
        longest = seconds if longest is None else max(longest, seconds)
    return longest


def asked_s(kind: str, data: dict[str, Any]) -> float | None:
    """The retention a request asks for, in seconds, by its API's own field (None: no hint)."""
    if kind == "messages":
        return messages_hint(data)
    if kind in ("chat", "responses"):
        return openai_hint(data)
    return None


def cap(asked: float | None, max_client_s: float | None, decoder_ttl_s: float) -> Retention | None:
    """The hint as the lease may take it: at most `max_client_s` (None: the decoder TTL)."""
    if asked is None:
        return None
    return Retention(asked, min(asked, ceiling_s(max_client_s, decoder_ttl_s)))


def ceiling_s(max_client_s: float | None, decoder_ttl_s: float) -> float:
    """The longest retention a client may ask for (a hint, or a renewal): the operator's
    `tuning.retention_max_client_s`, else the decoder TTL."""
    return decoder_ttl_s if max_client_s is None else max_client_s
