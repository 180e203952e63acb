"""A stream carried over when its decoder dies: what may be carried, and how (pure).

Why it exists: a decoder that dies after the client's first byte used to end the client's
stream with an error event, and an agent's loop breaks on one lost turn. The router holds all
it needs to go on elsewhere: the prompt's token ids and every token the decoder streamed (the
router asks for both, `protocol.decode_request`). So it sends another engine (a decoder, or P
when no other decoder is up) the prompt plus the tokens already streamed, as token ids, for
the rest of the answer, and relays that engine's tokens in the client's own framing, as one
stream with one usage that adds up (`decode.StreamRelay`). vLLM's incremental detokenizer
starts from the prompt's ids, so the text of the carried-over tokens is what the first
engine would have written. At temperature 0 the answer is the same token for token, since
the tokens so far are now prompt the engine attends to exactly as it did.

What is not carried over, where the continuation would not be the same answer:
- the Responses and Messages streams (their events describe output items, not text deltas);
- answers with several choices;
- a chat request with tools (the chat endpoint's tool-call parser would not see the part
  already streamed), with log probabilities (the text endpoint writes them in another shape),
  or with a response format or grammar (its state would restart);
- penalties on what was generated (presence, frequency, repetition): the generated tokens
  become prompt, which those penalties do not count alike;
- an answer already at its token limit.
Those end with the in-band error, as before. `migrate_streams: false` turns it off.
"""

from __future__ import annotations

from typing import Any, Final

from boomerang.router.apis.validation import ClientRequest

MAX_MIGRATIONS: Final = 2
"""Carry-overs per answer: a second engine may die too, a third is a pattern, not bad luck."""

CARRIED_FIELDS: Final = (
    "model",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "stop",
    "stop_token_ids",
    "include_stop_str_in_output",
    "ignore_eos",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "logit_bias",
    "allowed_token_ids",
    "bad_words",
    "cache_salt",
    "priority",
)
"""The request's fields that shape the rest of the answer alike on the text endpoint."""

_PENALTIES: Final = ("presence_penalty", "frequency_penalty", "repetition_penalty")
_STRUCTURED: Final = (
    "response_format",
    "structured_outputs",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
)


def refusal(req: ClientRequest) -> str | None:
    """Why this request's stream cannot be carried over (None: it can)."""
    body = req.body
    if req.kind not in ("chat", "completion"):
        return "its API's events are not text deltas"
    if not req.stream:
        return "not streamed"
    if not req.single_choice:
        return "several choices"
    if req.kind == "completion" and body.get("echo"):
        return "echo"
    if req.kind == "chat" and body.get("tools") and body.get("tool_choice") != "none":
        return "tools"
    if req.kind == "chat" and (body.get("logprobs") or body.get("top_logprobs")):
        return "log probabilities"
    if any(body.get(k) for k in _STRUCTURED):
        return "a response format"
    if any(body.get(k) not in (None, 0, 0.0, 1, 1.0) for k in _PENALTIES):
        return "penalties"
    return None


def _limit(body: dict[str, Any]) -> int | None:
    for key in ("max_completion_tokens", "max_tokens"):
        value = body.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def continuation(
    req: ClientRequest, prompt_ids: list[int], output_ids: list[int]
) -> dict[str, Any] | None:
    """The text-endpoint request for the rest of the answer: the prompt and the tokens
    already streamed, as ids, with the request's sampling; None when nothing is left to
    generate (the limit is reached)."""
    body: dict[str, Any] = {k: req.body[k] for k in CARRIED_FIELDS if k in req.body}
    limit = _limit(req.body)
    if limit is not None:
        if limit - len(output_ids) <= 0:
            return None
        body["max_tokens"] = limit - len(output_ids)
    min_tokens = req.body.get("min_tokens")
    if isinstance(min_tokens, int) and min_tokens > len(output_ids):
        body["min_tokens"] = min_tokens - len(output_ids)
    if req.kind == "completion" and isinstance(req.body.get("logprobs"), int):
        body["logprobs"] = req.body["logprobs"]
    body.update(
        prompt=[*prompt_ids, *output_ids],
        stream=True,
        stream_options={"include_usage": True},
        return_token_ids=True,
    )
    return body


class Translator:
    """The continuation's text-completion chunks as the client's API writes them: the first
    engine's id, model and creation time; for chat, each text as a content delta; the usage
    as the whole answer's (the original prompt, every generated token)."""

    def __init__(
        self, kind: str, base: dict[str, Any], prompt: int, streamed: int, include_usage: bool
    ) -> None:
        self.kind = kind
        self.base = base
        """`id`, `object`, `created`, `model` of the first engine's chunks."""
        self.prompt = prompt
        self.streamed = streamed
        """Tokens the client got before the carry-over."""
        self.include_usage = include_usage

    def __call__(self, chunk: dict[str, Any]) -> dict[str, Any] | None:
        """The client's chunk for one of the continuation's (None: nothing for the client)."""
        choices = [c for c in chunk.get("choices") or () if isinstance(c, dict)]
        has_usage = isinstance(chunk.get("usage"), dict)
        if has_usage and not choices and not self.include_usage:
            return None
        out = {k: v for k, v in chunk.items() if k != "prompt_token_ids"}
        out.update(self.base)
        if has_usage:
            out["usage"] = self._usage(chunk["usage"])
        if self.kind == "chat":
            out["choices"] = [_chat_choice(c) for c in choices]
        else:
            out["choices"] = [
                {k: v for k, v in c.items() if k != "prompt_token_ids"} for c in choices
            ]
        return out

    def _usage(self, usage: dict[str, Any]) -> dict[str, Any]:
        generated = usage.get("completion_tokens")
        completion = self.streamed + (generated if isinstance(generated, int) else 0)
        return {
            **usage,
            "prompt_tokens": self.prompt,
            "completion_tokens": completion,
            "total_tokens": self.prompt + completion,
        }


def _chat_choice(choice: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "index": choice.get("index", 0),
        "delta": {"content": choice.get("text") or ""},
        "logprobs": None,
        "finish_reason": choice.get("finish_reason"),
    }
    if "token_ids" in choice:
        out["token_ids"] = choice["token_ids"]
    if "stop_reason" in choice:
        out["stop_reason"] = choice["stop_reason"]
    return out


def chunk_base(chunk: Any) -> dict[str, Any]:
    """What the client's chunks keep of the first engine's: id, object, created, model."""
    if not isinstance(chunk, dict):
        return {}
    return {k: chunk[k] for k in ("id", "object", "created", "model") if k in chunk}
