"""The prompt tokens a turn did not compute, in each API's own usage fields (pure).

Why it exists: agents show and bill cached tokens, and through P/D the answer a client gets is
D's, whose own count says nothing of the client's prompt: D received the whole prompt's KV from
P. What this turn did not compute is what the engine that computed the prompt says it took from
elsewhere, by its own count for the request (vLLM's `num_cached_tokens`: its prefix-cache hit
plus what its KV connector loaded):
- P/D (pull or recompute): P's count, from P's answer to the prefill request: the history pulled
  from D plus what P's prefix cache held.
- Continue, or one engine alone: that engine's own count in its own answer (D's prefix cache
  serves the history on a continue).
Never the router's estimate: a number the engines did not give is not invented.

Where the engines put it: chat and completions in `usage.prompt_tokens_details.cached_tokens`
(vLLM with `--enable-prompt-tokens-details`, which the operator and the local runtime render;
vLLM leaves the details out when nothing was cached, so their absence in a usage is 0); the
Responses API in `usage.input_tokens_details.cached_tokens` (always); Messages nowhere in vLLM:
Boomerang's engine plugin fills Anthropic's `usage.cache_read_input_tokens` from the chat
request it converts to (absent: unknown, and left out).

What the client gets: the same fields, set to that count. For Messages, Anthropic's accounting:
`cache_read_input_tokens` is that count, `cache_creation_input_tokens` the prompt tokens this
turn left retained on D for the next one beyond those (D's `remote_num_tokens`, within the
prompt), and `input_tokens` the rest, so that the three add up to the prompt as Anthropic's do.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Final, Literal

Cached = int | Literal["own", "unknown"]
"""What the client's usage reports as not computed: a count (P's, on the P/D path), `own` (the
answering engine computed the prompt: its own usage stands, and for Messages only what it left
retained is added) or `unknown` (the engine that
computed the prompt did not say: the usage is left as the engine wrote it)."""


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


_CACHED_FIELD: Final = {
    "chat": "prompt_tokens_details",
    "completion": "prompt_tokens_details",
    "responses": "input_tokens_details",
    "messages": "cache_read_input_tokens",
}
"""Where each API's usage states the prompt tokens not computed (a count, or details holding
`cached_tokens`)."""


def engine_cached(kind: str, usage: Any) -> int | None:
    """What an engine's usage object says it did not compute (None: it does not say)."""
    if not isinstance(usage, dict) or (name := _CACHED_FIELD.get(kind)) is None:
        return None
    value = usage.get(name)
    if kind == "messages":
        return _int(value)
    if isinstance(value, dict):
        return _int(value.get("cached_tokens"))
    if kind in ("chat", "completion"):  # vLLM leaves the details out when nothing was cached
        return 0 if _int(usage.get("prompt_tokens")) is not None else None
    return None


def pull_failed(p_cached: int | None, pulled: int, slack: int) -> bool:
    """Whether P's own count says its pull of D's blocks failed: it reports fewer prompt
    tokens not computed than it was sent to pull, by more than `slack` (a block: P may compute
    a handle's last, partial block itself). vLLM counts a request's cached tokens again when a
    failed load sends it back to be scheduled (`kv_load_failure_policy: recompute`), so its
    count is then what its own prefix cache held, not what the handle offered. Unknown (None):
    not failed, as far as anyone can tell."""
    return p_cached is not None and p_cached + slack < pulled


def says_cached(kind: str, payload: Any) -> bool:
    """Whether an engine's answer states its cached prompt tokens explicitly: once an engine
    has, a later answer without the field means 0 (vLLM leaves a zero out), not "unknown"."""
    usage = payload.get("usage") if isinstance(payload, dict) else None
    return isinstance(usage, dict) and _CACHED_FIELD.get(kind, "") in usage


def answer_cached(kind: str, payload: Any) -> int | None:
    """`engine_cached` of a complete answer (P's JSON to the prefill request)."""
    return engine_cached(kind, payload.get("usage")) if isinstance(payload, dict) else None


def _usages(obj: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The usage objects of an answer, a chunk or a named event: top level (JSON answers, chat
    chunks, `message_delta`), in `response` (Responses' final events) or in `message`
    (`message_start`)."""
    if isinstance(obj.get("usage"), dict):
        yield obj["usage"]
    for key in ("response", "message"):
        inner = obj.get(key)
        if isinstance(inner, dict) and isinstance(inner.get("usage"), dict):
            yield inner["usage"]


def retained_prompt(params: dict[str, Any] | None, prompt: int) -> int:
    """Prompt tokens D keeps for the next turn (its params' `remote_num_tokens`, within the
    prompt); 0 when it keeps none."""
    if not params or not params.get("do_remote_decode"):
        return 0
    n = _int(params.get("remote_num_tokens"))
    return min(n, prompt) if n else 0


def rewrite(kind: str, obj: Any, cached: Cached, params: dict[str, Any] | None) -> bool:
    """Set the turn's cached tokens (`Cached`) in every usage object of `obj` (in place);
    whether anything changed. `params`: D's, for what Messages reports as created."""
    if not isinstance(obj, dict) or cached == "unknown":
        return False
    if cached == "own" and kind != "messages":
        return False  # the engine's usage already says it, in the API's fields
    changed = False
    for usage in _usages(obj):
        count = engine_cached(kind, usage) if cached == "own" else cached
        if count is not None:
            changed |= _set(kind, usage, count, params)
    return changed


def _set(kind: str, usage: dict[str, Any], cached: int, params: dict[str, Any] | None) -> bool:
    if kind in ("chat", "completion"):
        prompt = _int(usage.get("prompt_tokens")) or 0
        details = usage.get("prompt_tokens_details")
        usage["prompt_tokens_details"] = {
            **(details if isinstance(details, dict) else {}),
            "cached_tokens": min(cached, prompt),
        }
        return True
    if kind == "responses":
        prompt = _int(usage.get("input_tokens")) or 0
        details = usage.get("input_tokens_details")
        usage["input_tokens_details"] = {
            **(details if isinstance(details, dict) else {}),
            "cached_tokens": min(cached, prompt),
        }
        return True
    if kind == "messages":
        # Anthropic's accounting (which vLLM's Messages usage follows): input_tokens leaves out
        # what was read from a cache or written to one, so the prompt is the three together.
        parts = ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")
        prompt = sum(_int(usage.get(part)) or 0 for part in parts)
        read = min(cached, prompt)
        created = max(0, retained_prompt(params, prompt) - read)
        usage["cache_read_input_tokens"] = read
        usage["cache_creation_input_tokens"] = created
        usage["input_tokens"] = prompt - read - created
        return True
    return False
