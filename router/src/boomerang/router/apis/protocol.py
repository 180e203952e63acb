"""vLLM's P/D request flow as pure transforms of JSON bodies (no I/O here).

Turn 1: P gets the client's body with `stream: false`, `max_tokens: 1` and a request to keep
its blocks for a remote decode; D gets the client's body plus P's returned params, pulls P's
blocks and generates. With bidirectional transfer D answers with its own params: its blocks hold
prompt + output minus the last sampled token (`remote_num_tokens`), pinned for the decoder TTL.
Turn N: P gets D's retained params (`do_remote_decode: true`) instead of the empty request and
pulls the history back from D, then the flow continues as on turn 1.

The router adds `return_token_ids` upstream (vLLM >= 0.10 answers with `prompt_token_ids` and
per-choice `token_ids`) because verification needs D's exact tokens, and strips those fields
from client responses unless the client asked for them. `kv_transfer_params` never reaches a
client.
"""

from __future__ import annotations

from typing import Any

from boomerang.router.apis.validation import INTERNAL_FIELDS, ClientRequest

FRESH_PREFILL_PARAMS: dict[str, Any] = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}
"""What P gets on a turn without a handle: compute, then hold the blocks for D."""

_PREFILL_DROPS = ("max_completion_tokens", "min_tokens", "stream_options")


def prefill_body(
    body: dict[str, Any],
    handle_params: dict[str, Any] | None,
    *,
    limit: str,
    drops: tuple[str, ...] = (),
) -> dict[str, Any]:
    """P's body in every API: the client's request less `drops`, one token (the API's `limit`
    field), not streamed, with D's retained params when a verified handle exists, else a fresh
    hold of P's blocks for D."""
    out = {k: v for k, v in body.items() if k not in drops}
    out["stream"] = False
    out[limit] = 1
    if handle_params is None:
        out["kv_transfer_params"] = dict(FRESH_PREFILL_PARAMS)
    else:
        out["kv_transfer_params"] = {
            **handle_params,
            "do_remote_decode": True,
            "do_remote_prefill": False,
        }
    return out


def decode_body(
    body: dict[str, Any], prefill_params: dict[str, Any] | None, *, stream: bool
) -> dict[str, Any]:
    """D's body in every API: the client's request plus P's params (or the continue intent)."""
    out = dict(body)
    out["stream"] = stream
    if prefill_params is not None:
        out["kv_transfer_params"] = prefill_params
    return out


def prefill_request(body: dict[str, Any], handle_params: dict[str, Any] | None) -> dict[str, Any]:
    """P's chat or completion body; token ids on with a handle, so P's prompt can be checked."""
    out = prefill_body(body, handle_params, limit="max_tokens", drops=_PREFILL_DROPS)
    if handle_params is not None:
        out["return_token_ids"] = True
    return out


def decode_request(
    body: dict[str, Any], prefill_params: dict[str, Any] | None, *, stream: bool
) -> dict[str, Any]:
    """D's body: the client's request plus P's params; token ids on so D's prefix can be hashed."""
    out = decode_body(body, prefill_params, stream=stream)
    if not stream:
        out.pop("stream_options", None)
    out["return_token_ids"] = True
    return out


CONTINUE_PARAMS: dict[str, Any] = {"do_remote_prefill": False, "do_remote_decode": False}
"""Empty KV-transfer intent: a D given this serves the request itself, from its own cache."""


def continue_request(body: dict[str, Any], *, stream: bool) -> dict[str, Any]:
    """The body for the decoder that holds the history (the continue path): the client's
    request with empty KV-transfer intent. D serves the history from its own prefix cache,
    computes the rest and, with bidirectional transfer, keeps its blocks and answers with a
    fresh handle, as after a P/D turn (checked on vLLM CPU 0.32)."""
    return decode_request(body, dict(CONTINUE_PARAMS), stream=stream)


def plain_request(body: dict[str, Any]) -> dict[str, Any]:
    """The body for one engine serving the whole turn (the other role has none): the client's
    request as a single vLLM engine takes it; without kv_transfer_params it retains nothing.
    Token ids on, as for D, so its stream can be carried over if it dies (`migration.py`)."""
    out = {k: v for k, v in body.items() if k not in INTERNAL_FIELDS}
    out["return_token_ids"] = True
    return out


def tokenize_request(req: ClientRequest) -> dict[str, Any] | None:
    """The `/tokenize` body that renders the prompt exactly as the completion endpoint will.

    vLLM's chat endpoint passes `documents`, `reasoning_effort` and `enable_thinking` to the
    chat template as extra kwargs; `/tokenize` accepts only `chat_template_kwargs`, so they are
    merged there the same way. Returns None when the prompt is already token ids or is a batch.
    """
    b = req.body
    if req.kind == "completion":
        prompt = b.get("prompt")
        if not isinstance(prompt, str):
            return None
        out: dict[str, Any] = {"prompt": prompt}
        if "add_special_tokens" in b:
            out["add_special_tokens"] = b["add_special_tokens"]
    else:
        out = {"messages": b["messages"]}
        for key in (
            "add_generation_prompt",
            "continue_final_message",
            "add_special_tokens",
            "chat_template",
            "tools",
            "mm_processor_kwargs",
            "media_io_kwargs",
        ):
            if b.get(key) is not None:
                out[key] = b[key]
        out["chat_template_kwargs"] = _template_kwargs(b)
    if b.get("model") is not None:
        out["model"] = b["model"]
    return out


def _template_kwargs(b: dict[str, Any]) -> dict[str, Any]:
    """Mirror of vLLM's chat rendering: the request's extras override the user's kwargs
    unless they are unset (None or "auto")."""
    user = b.get("chat_template_kwargs")
    extra: dict[str, Any] = {
        "add_generation_prompt": b.get("add_generation_prompt", True),
        "continue_final_message": b.get("continue_final_message", False),
        "documents": b.get("documents"),
        "reasoning_effort": b.get("reasoning_effort"),
    }
    user_kwargs = user if isinstance(user, dict) else {}
    if b.get("reasoning_effort") is not None and "enable_thinking" not in user_kwargs:
        extra["enable_thinking"] = b["reasoning_effort"] != "none"
    return user_kwargs | {k: v for k, v in extra.items() if v not in (None, "auto")}


def known_prompt_ids(req: ClientRequest) -> list[int] | None:
    """A completion prompt given as token ids needs no tokenizer."""
    prompt = req.body.get("prompt")
    if req.kind != "completion" or not isinstance(prompt, list) or not prompt:
        return None
    if all(isinstance(t, int) for t in prompt):
        return [int(t) for t in prompt]
    return None


def client_payload(payload: dict[str, Any], *, keep_token_ids: bool) -> dict[str, Any]:
    """A response body or stream chunk as the client may see it (mutates and returns it)."""
    strip_for_client(payload, keep_token_ids=keep_token_ids)
    return payload


_ADDED_IDS = ("token_ids", "prompt_token_ids")


def strip_for_client(payload: dict[str, Any], *, keep_token_ids: bool) -> bool:
    """Remove what the client may not see (see `client_payload`); whether anything was there,
    so that a stream chunk without any can be passed on as the engine's bytes."""
    found = False
    for key in INTERNAL_FIELDS:
        if key in payload:
            del payload[key]
            found = True
    if keep_token_ids:
        return found
    if "prompt_token_ids" in payload:
        del payload["prompt_token_ids"]
        found = True
    for choice in payload.get("choices") or ():
        if isinstance(choice, dict):
            for key in _ADDED_IDS:
                if key in choice:
                    del choice[key]
                    found = True
    return found


def prompt_ids_of(payload: dict[str, Any]) -> list[int] | None:
    """The prompt ids in a response or first chunk (top level for chat, per choice otherwise)."""
    ids = payload.get("prompt_token_ids")
    if ids is None:
        choices = payload.get("choices") or []
        if choices and isinstance(choices[0], dict):
            ids = choices[0].get("prompt_token_ids")
    return ids if _is_ids(ids) else None


def output_ids_of(payload: dict[str, Any]) -> list[int] | None:
    """The first choice's generated ids in a response, or this chunk's delta ids."""
    choices = payload.get("choices") or []
    if not choices or not isinstance(choices[0], dict):
        return None
    ids = choices[0].get("token_ids")
    return ids if _is_ids(ids) else None


def _is_ids(value: Any) -> bool:
    """A cheap shape check; every element is checked when the ids are hashed (`token_hash`
    raises on anything that is not a uint32), which is where it matters."""
    return isinstance(value, list) and (not value or isinstance(value[-1], int))


def kv_params_of(payload: dict[str, Any]) -> dict[str, Any] | None:
    """The engine's kv_transfer_params in a response or chunk, if it is a usable mapping."""
    params = payload.get("kv_transfer_params")
    return params if isinstance(params, dict) and params else None


def retained_by_decoder(params: dict[str, Any] | None) -> bool:
    """Whether D's params describe blocks it keeps for the next turn."""
    return bool(
        params
        and params.get("do_remote_decode")
        and params.get("remote_block_ids")
        and isinstance(params.get("remote_num_tokens"), int)
        and params["remote_num_tokens"] > 0
    )
