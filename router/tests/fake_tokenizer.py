"""The fake engines' tokenizer and chat template: exact, cheap, and easy to reason about.

One id per character (code points, lone surrogates included), special ids above the Unicode
range for the chat template's markers; generated replies are deterministic words that depend on
the whole prompt. Replies can include reasoning, which the chat template drops from history (as
real reasoning models' templates do), so a conversation with reasoning never extends D's exact
tokens: the case the router's verification must catch.
"""

from __future__ import annotations

import hashlib
import sys
from array import array
from typing import Any

import orjson

BOS, END, THINK, END_THINK = 0x110000, 0x110001, 0x110002, 0x110003
ROLE_IDS = {"system": 0x110010, "user": 0x110011, "assistant": 0x110012, "tool": 0x110013}
WORDS = ("alpha", "bravo", "charlie", "delta", "echo", "fox", "golf", "hotel")
_UTF32 = "utf-32-le" if sys.byteorder == "little" else "utf-32-be"  # array("I")'s layout
_BYTES = {t: array("I", [t]).tobytes() for t in (BOS, END, *ROLE_IDS.values())}


def _utf32(text: str) -> bytes:
    return text.encode(_UTF32, "surrogatepass")


def encode(text: str) -> list[int]:
    """One id per character (code points, lone surrogates included)."""
    return array("I", _utf32(text)).tolist()


def decode_ids(ids: list[int]) -> str:
    """Text of ordinary ids (specials dropped)."""
    return "".join(chr(i) for i in ids if i < 0x110000)


def _text(content: Any) -> str:
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content or ""


def render_chat(messages: list[dict[str, Any]], add_generation_prompt: bool = True) -> list[int]:
    """The fake chat template: role marker, content, END; reasoning is dropped from history."""
    parts = [_BYTES[BOS]]  # 4 bytes per id, made a list once: half the cost of one per message
    for m in messages:
        parts.append(_BYTES[ROLE_IDS.get(m.get("role", "user"), ROLE_IDS["user"])])
        parts.append(_utf32(_text(m.get("content"))))
        for call in m.get("tool_calls") or ():
            fn = call.get("function") or {}
            parts.append(_utf32(f"<call {fn.get('name')} {fn.get('arguments')}>"))
        parts.append(_BYTES[END])
    if add_generation_prompt:
        parts.append(_BYTES[ROLE_IDS["assistant"]])
    return array("I", b"".join(parts)).tolist()


def reply_for(prompt_ids: list[int], n_words: int) -> str:
    """A deterministic reply that depends on the whole prompt."""
    digest = hashlib.sha256(orjson.dumps(prompt_ids)).digest()
    return " ".join(WORDS[b % len(WORDS)] for b in digest[:n_words])
